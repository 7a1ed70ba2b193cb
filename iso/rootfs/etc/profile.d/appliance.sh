# Login banner: the appliance's state (the same text as the console's /etc/issue).
[ -r /etc/issue.d/50-appliance.issue ] && cat /etc/issue.d/50-appliance.issue
