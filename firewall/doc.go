// Package firewall opens exactly the ports a host of the appliance's cluster needs, and nothing else.
//
// The port table (Ports) is data, by role — bootstrap (the appliance host), control-plane, etcd, worker —
// taken from the kubeadm "Ports and Protocols" page and RFC 5798 (VRRP). docs/reference/ports.md shows the
// same data (MarkdownTable, written there by cmd/docgen; cmd/porttable prints it).
//
// The nftables backend (NFTables, the only importer of github.com/google/nftables in the module) follows the
// Talos `nftables_chain.go` model: it owns one table, `inet appliance`, holding
//
//   - sets node_networks_v4/v6 (interval) and vrrp_peers_v4/v6,
//   - sets conns_PORT_v4/v6 (dynamic, size 65535): per-source connection counts of each capped port,
//   - chain input: hook input, priority filter, policy drop; accepts established/related, loopback,
//     ICMP and ICMPv6 (neighbour discovery, RFC 4861), then each port of the host's roles from its sources,
//     and VRRP (IP protocol 112) only from the VRRP peers,
//
// and rebuilds it in a single atomic netlink batch when, and only when, the live table differs (the counting
// sets' elements are the kernel's and never compared). Other tables are never flushed or read for decisions.
// Render prints the equivalent `nft -f` script.
//
// # Connection caps
//
// The ports the appliance serves behind pkg/connlimit (appliance-https, boot-http, cluster-mirror: the port
// table's ConnsPerSource column) are capped per source address in the kernel too, just before the port's
// accept rule, per family:
//
//	ip saddr @node_networks_v4 tcp dport 8443 ct state new add @conns_appliance_https_v4 { ip saddr ct count over 80 } reject with tcp reset
//
// so a client's connection past ConnsPerSource (connlimit's 64 + 16) is reset at its SYN, before any TLS
// handshake. connlimit stays behind it as the second line, and with its lower cap still answers a client just
// over 64 with a 429 that names the cap. The count is conntrack's (nf_conncount): a connection counts from its
// SYN until it is closed (TIME_WAIT or CLOSE), so a closed connection frees its slot.
//
// # firewalld
//
// On a host where firewalld runs, our own table cannot help: firewalld owns nftables there, and a packet its
// table rejects is gone whatever another table accepts. The firewalld backend (Firewalld, the only importer of
// github.com/godbus/dbus/v5 for firewalld) speaks firewalld's D-Bus API — never firewall-cmd — and owns two
// firewalld objects, in the permanent configuration (so `firewall-cmd --reload` and restarts keep them) and in
// the runtime one, each marked by its description ("Managed by the airgap appliance ..."):
//
//   - zone `appliance`: sources = the node networks, target default, ports = the SourceNodeNetworks entries.
//     firewalld classifies a packet into the zone of its source before the zone of its interface, so traffic
//     from the node networks meets this zone only: from there exactly the table's ports are open, everything
//     else is rejected, as with the nftables backend's drop policy.
//   - policy `appliance-host`: ingress ANY, egress HOST (traffic to the host itself), priority -100 (before
//     every zone), target CONTINUE, ports = the SourceAnywhere entries, plus one rich rule per VRRP peer,
//     `rule family="ipv4" source address="PEER" protocol value="112" accept`. Packets from outside the node
//     networks are classified into the interface's or the default zone, which is not ours; the policy opens
//     the anywhere ports (and VRRP from the peers) whatever zone that is, without touching it.
//
// So the open set from the node networks, and the ports open from anywhere, equal the nftables backend's (the
// lab test test/lab/firewalld_test.go checks both backends against the same expectation, with real packets).
// One difference is by design: from outside the node networks, what the administrator's own zone opens (e.g.
// Debian's default zone public: ssh, dhcpv6-client) stays open, where the nftables backend's drop policy would
// close it too; the appliance never edits zones it does not own. Loopback, ICMP and established traffic are
// accepted by firewalld itself.
//
// firewalld cannot count a source's open connections (no `ct count`; a rich rule's limit is a rate), so the
// firewalld backend also owns one nftables table beside firewalld's, `inet appliance-conncap` (in
// Firewalld.NetNSPath), holding the same cap rules as above in an input chain of priority filter (before
// firewalld's, at filter + 10) and policy accept, and nothing else: a reject is final in any table, and
// firewalld rebuilds only its own tables, which kube-proxy's table and Redirect's `inet appliance-apilb`
// rely on too. The caps thus hold with both backends.
//
// Apply reads both configurations, writes only what differs — the permanent objects as one whole settings dict
// each (config.addZone2/update2, config.addPolicy/update), the runtime ones with setZoneSettings2 /
// setPolicySettings (firewalld checks a whole dict before applying it) — and undoes earlier writes when a
// later one fails. A zone or policy new to the runtime can only be made live by a reload in firewalld 1.3, so
// the first Apply on a host (and Remove) reloads firewalld: runtime-only changes other tools made are lost
// then, as with any `firewall-cmd --reload`. A second Apply makes no write (Calls and Writes count them).
//
// Choose picks the backend: Firewalld when org.fedoraproject.FirewallD1 has an owner on the system bus and
// runs in the target network namespace, else NFTables. Describe and BackendOfDetail put the backend into the
// hostagent's and the bootstrap phase's report details, where `appliance status` finds it.
package firewall
