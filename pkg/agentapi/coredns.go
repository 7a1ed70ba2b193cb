package agentapi

// The control planes' CoreDNS static pod (issue 13): where its files live on the node and the port it
// answers on. pkg/dnsrecords renders the Corefile that names them (appliance side) and pkg/hostagent
// writes them (node side); both take them from here, the contract, so the node side never imports the
// appliance's configuration.
const (
	// CoreDNSConfigDir is the directory on a control plane that holds the Corefile and the zone file,
	// mounted read-only into the CoreDNS static pod.
	CoreDNSConfigDir = "/etc/appliance-dns"
	// CoreDNSCorefile and CoreDNSZoneFile are the files in CoreDNSConfigDir.
	CoreDNSCorefile = CoreDNSConfigDir + "/Corefile"
	CoreDNSZoneFile = CoreDNSConfigDir + "/zone.db"
	// DNSPort is the port DNS is answered on (RFC 1035 §4.2).
	DNSPort = 53
)
