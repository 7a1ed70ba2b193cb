// Package firewall opens exactly the ports a host of the appliance's cluster needs, and nothing else.
//
// The port table (Ports) is data, by role — bootstrap (the appliance host), control-plane, etcd, worker —
// taken from the kubeadm "Ports and Protocols" page and RFC 5798 (VRRP). The README shows the same data
// (MarkdownTable, printed by cmd/porttable).
//
// The nftables backend (NFTables, the only importer of github.com/google/nftables in the module) follows the
// Talos `nftables_chain.go` model: it owns one table, `inet appliance`, holding
//
//   - sets node_networks_v4/v6 (interval) and vrrp_peers_v4/v6,
//   - chain input: hook input, priority filter, policy drop; accepts established/related, loopback,
//     ICMP and ICMPv6 (neighbour discovery, RFC 4861), then each port of the host's roles from its sources,
//     and VRRP (IP protocol 112) only from the VRRP peers,
//
// and rebuilds it in a single atomic netlink batch when, and only when, the live table differs. Other
// tables are never flushed or read for decisions. Render prints the equivalent `nft -f` script.
//
// A firewalld backend would implement Backend (see there) for hosts where firewalld runs; none is needed yet.
package firewall
