# Login banner: the appliance's state (the same text as the console's /etc/issue).
[ -r /run/issue.d/50-appliance.issue ] && cat /run/issue.d/50-appliance.issue
