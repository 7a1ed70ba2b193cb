package firewall

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// DefaultTable is the name of the inet table the firewall owns.
const DefaultTable = "appliance"

// Names of the objects inside the table.
const (
	chainInput       = "input"
	setNodeNetworks4 = "node_networks_v4"
	setNodeNetworks6 = "node_networks_v6"
	setVRRPPeers4    = "vrrp_peers_v4"
	setVRRPPeers6    = "vrrp_peers_v6"
)

// connSetSize bounds each per-source counting set: the source addresses one capped port counts at once,
// per family. A source past it is not counted (the kernel's dynset add fails and the cap rule does not
// match), so the cap fails open for it and connlimit alone caps it; the kernel drops an address from the
// set once its count is back at zero.
const connSetSize = 65535

// ruleset is the desired content of the table, held twice in step: as nft text (Render) and as netlink
// objects (Apply, InPlace). Both are built here, from the same loop, so they cannot drift; a test applies
// each and compares `nft list table` of the two.
type ruleset struct {
	table string
	roles []Role
	sets  []nftSet
	rules []nftRule
	// accept makes the input chain's policy accept (the connection-cap table beside firewalld's, which
	// only refuses); the firewall's own table drops.
	accept bool
}

type nftSet struct {
	name     string
	v6       bool
	interval bool
	// dynamic is a set the rules fill (`flags dynamic`, bounded by size): the per-source connection
	// counts. Its elements are the kernel's, never compared or installed.
	dynamic bool
	size    uint32
	text    []string // elements as nft prints them
	elems   []nftables.SetElement
}

type nftRule struct {
	text    string // without the comment
	comment string
	exprs   []expr.Any // Lookup and Dynset expressions carry SetName only; SetID is filled in at Apply
	connCap bool       // a per-source connection cap (Port.ConnsPerSource)
}

func buildRuleset(table string, s Spec) ruleset {
	rs := ruleset{table: table, roles: s.Roles}
	nn4, nn6 := mergePrefixes(s.NodeNetworks)
	vp4, vp6 := splitPeers(s.VRRPPeers)
	rs.sets = []nftSet{
		intervalSet(setNodeNetworks4, false, nn4),
		intervalSet(setNodeNetworks6, true, nn6),
		addrSet(setVRRPPeers4, false, vp4),
		addrSet(setVRRPPeers6, true, vp6),
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	ctState := func(bits uint32) []expr.Any {
		return []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		}
	}
	l4 := func(proto byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		}
	}
	rs.rules = []nftRule{
		{text: "ct state established,related accept", exprs: append(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)},
		{text: "ct state invalid drop", exprs: append(ctState(expr.CtStateBitINVALID), &expr.Verdict{Kind: expr.VerdictDrop})},
		// Loopback is ifindex 1 in every namespace (LOOPBACK_IFINDEX in the kernel); nft resolves "lo" the same way.
		{text: `iif "lo" accept`, exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(1)},
			accept,
		}},
		// ICMPv6 carries neighbour discovery (RFC 4861): without it IPv6 stops working; ICMP carries PMTU.
		{text: "meta l4proto icmp accept", exprs: append(l4(unix.IPPROTO_ICMP), accept)},
		{text: "meta l4proto ipv6-icmp accept", exprs: append(l4(unix.IPPROTO_ICMPV6), accept)},
	}
	for _, p := range s.ports() {
		var match string
		var m []expr.Any
		switch p.Protocol {
		case ProtoVRRP:
			// Numeric: nft resolves names through /etc/protocols, which minimal systems may lack.
			match = fmt.Sprintf("meta l4proto %d", IPProtoVRRP)
			m = l4(IPProtoVRRP)
		default:
			proto := byte(unix.IPPROTO_TCP)
			if p.Protocol == ProtoUDP {
				proto = unix.IPPROTO_UDP
			}
			m = append(l4(proto), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			if p.From == p.To {
				match = fmt.Sprintf("%s dport %d", p.Protocol, p.From)
				m = append(m, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p.From)})
			} else {
				match = fmt.Sprintf("%s dport %d-%d", p.Protocol, p.From, p.To)
				m = append(m,
					&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: binaryutil.BigEndian.PutUint16(p.From)},
					&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: binaryutil.BigEndian.PutUint16(p.To)})
			}
		}
		var from []srcMatch
		switch p.Source {
		case SourceAnywhere:
			from = append(from, srcMatch{})
		case SourceNodeNetworks:
			from = append(from, saddr(false, setNodeNetworks4), saddr(true, setNodeNetworks6))
		case SourceVRRPPeers:
			from = append(from, saddr(false, setVRRPPeers4), saddr(true, setVRRPPeers6))
		}
		capped := p.ConnsPerSource > 0 && p.Protocol == ProtoTCP
		if capped {
			rs.sets = append(rs.sets, connSet(p, false), connSet(p, true))
		}
		for _, f := range from {
			if capped {
				// Before the port's accept: a new connection past the cap is reset, the others go on to it.
				// Established packets never get here (the first rule accepted them).
				for _, v6 := range []bool{false, true} {
					if f.text != "" && f.v6 != v6 {
						continue // the source set already chose the family
					}
					exprs := append(append(append([]expr.Any{}, f.exprs...), m...), ctState(expr.CtStateBitNEW)...)
					rs.rules = append(rs.rules, connCapRule(f, v6, match, exprs, p))
				}
			}
			exprs := append(append(append([]expr.Any{}, f.exprs...), m...), accept)
			rs.rules = append(rs.rules, nftRule{text: f.text + match + " accept", comment: p.Name, exprs: exprs})
		}
	}
	return rs
}

// connSet is the dynamic set counting p's connections by source address of one family.
func connSet(p Port, v6 bool) nftSet {
	fam := "v4"
	if v6 {
		fam = "v6"
	}
	return nftSet{name: "conns_" + strings.ReplaceAll(p.Name, "-", "_") + "_" + fam, v6: v6, dynamic: true, size: connSetSize}
}

// connCapRule is `[SRC] MATCH ct state new add @conns_NAME_vN { ip saddr ct count over N } reject with tcp
// reset`: exprs holds the source, port and ct state expressions, match the port's text. The dynset adds the
// connection to its
// source's count (conntrack's, nf_conncount: a connection counts until it is closed) and the connlimit
// expression matches when the count is over the cap; the reject answers the SYN with a reset. Without a
// source set (SourceAnywhere) the family is checked first, as nft does for `ip saddr`.
func connCapRule(f srcMatch, v6 bool, match string, exprs []expr.Any, p Port) nftRule {
	set := connSet(p, v6)
	fam, off, n, kw := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4), "ip"
	if v6 {
		fam, off, n, kw = unix.NFPROTO_IPV6, 8, 16, "ip6"
	}
	if f.text == "" {
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{fam}})
	}
	exprs = append(exprs,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Dynset{SrcRegKey: 1, SetName: set.name, Operation: unix.NFT_DYNSET_OP_ADD,
			Exprs: []expr.Any{&expr.Connlimit{Count: uint32(p.ConnsPerSource), Flags: expr.NFT_CONNLIMIT_F_INV}}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	return nftRule{
		text: fmt.Sprintf("%s%s ct state new add @%s { %s saddr ct count over %d } reject with tcp reset",
			f.text, match, set.name, kw, p.ConnsPerSource),
		comment: p.Name,
		exprs:   exprs,
		connCap: true,
	}
}

// srcMatch is the source-address part of a rule: empty for SourceAnywhere.
type srcMatch struct {
	text  string
	exprs []expr.Any
	v6    bool
}

// saddr matches the source address against a named set of one family (inet tables see both families, so
// the family is checked first, as nft does for `ip saddr`).
func saddr(v6 bool, set string) srcMatch {
	fam, off, n, kw := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4), "ip"
	if v6 {
		fam, off, n, kw = unix.NFPROTO_IPV6, 8, 16, "ip6"
	}
	return srcMatch{
		v6:   v6,
		text: kw + " saddr @" + set + " ",
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{fam}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Lookup{SourceRegister: 1, SetName: set},
		},
	}
}

// intervalSet holds ranges the way nft encodes them: a start element per range, an IntervalEnd element at
// the address after its end (none when the range reaches the top of the address space), and a leading
// IntervalEnd at address zero unless the first range starts there.
func intervalSet(name string, v6 bool, rs []addrRange) nftSet {
	s := nftSet{name: name, v6: v6, interval: true}
	for i, r := range rs {
		if i == 0 && !r.first.IsUnspecified() {
			s.elems = append(s.elems, nftables.SetElement{Key: zeroAddr(v6).AsSlice(), IntervalEnd: true})
		}
		s.elems = append(s.elems, nftables.SetElement{Key: r.first.AsSlice()})
		if next := r.last.Next(); next.IsValid() {
			s.elems = append(s.elems, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
		s.text = append(s.text, r.String())
	}
	return s
}

func addrSet(name string, v6 bool, as []netip.Addr) nftSet {
	s := nftSet{name: name, v6: v6}
	for _, a := range as {
		s.elems = append(s.elems, nftables.SetElement{Key: a.AsSlice()})
		s.text = append(s.text, a.String())
	}
	return s
}

func zeroAddr(v6 bool) netip.Addr {
	if v6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// nftablesSet returns the library object for s in table t.
func (s nftSet) nftablesSet(t *nftables.Table) *nftables.Set {
	kt := nftables.TypeIPAddr
	if s.v6 {
		kt = nftables.TypeIP6Addr
	}
	return &nftables.Set{Table: t, Name: s.name, KeyType: kt, Interval: s.interval, Dynamic: s.dynamic, Size: s.size,
		KeyByteOrder: binaryutil.BigEndian}
}

// userData encodes a rule comment as nft does (libnftnl TLV NFTNL_UDATA_RULE_COMMENT, NUL-terminated).
func (r nftRule) userData() []byte {
	if r.comment == "" {
		return nil
	}
	return userdata.AppendString(nil, userdata.TypeComment, r.comment)
}

// Render returns the `nft -f` script equivalent to what NFTables.Apply installs for s in the default table
// "appliance". The script replaces the table atomically (add, delete, define: one nft transaction) and
// touches nothing else, so `nft -c -f` dry-runs it and `nft -f` applies it. Output is deterministic.
// An invalid Spec renders only its valid parts, preceded by one "# invalid:" comment line per problem;
// call Spec.Validate first.
func Render(s Spec) string { return buildRuleset(DefaultTable, s).render(s.Validate()) }

func (rs ruleset) render(invalid error) string {
	var b strings.Builder
	b.WriteString("#!/usr/sbin/nft -f\n")
	roles := make([]string, len(rs.roles))
	for i, r := range rs.roles {
		roles[i] = string(r)
	}
	if rs.accept {
		fmt.Fprintf(&b, "# Per-source connection caps of an appliance host with roles: %s, beside firewalld's filtering.\n", strings.Join(roles, ", "))
	} else {
		fmt.Fprintf(&b, "# Firewall of an appliance host with roles: %s.\n", strings.Join(roles, ", "))
	}
	b.WriteString("# Generated by github.com/airgap-appliance/appliance/firewall; the appliance rebuilds this table\n")
	b.WriteString("# atomically, so manual changes inside it are lost. Other tables are never touched.\n")
	if invalid != nil {
		for _, line := range strings.Split(invalid.Error(), "\n") {
			fmt.Fprintf(&b, "# invalid: %s\n", line)
		}
	}
	fmt.Fprintf(&b, "add table inet %s\ndelete table inet %s\n\n", rs.table, rs.table)
	fmt.Fprintf(&b, "table inet %s {\n", rs.table)
	for _, s := range rs.sets {
		typ := "ipv4_addr"
		if s.v6 {
			typ = "ipv6_addr"
		}
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.name, typ)
		if s.size > 0 {
			fmt.Fprintf(&b, "\t\tsize %d\n", s.size)
		}
		switch {
		case s.interval:
			b.WriteString("\t\tflags interval\n")
		case s.dynamic:
			b.WriteString("\t\tflags dynamic\n")
		}
		if len(s.text) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(s.text, ", "))
		}
		b.WriteString("\t}\n\n")
	}
	policy := "drop"
	if rs.accept {
		policy = "accept"
	}
	fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook input priority filter; policy %s;\n", chainInput, policy)
	for _, r := range rs.rules {
		b.WriteString("\t\t" + r.text)
		if r.comment != "" {
			fmt.Fprintf(&b, " comment %q", r.comment)
		}
		b.WriteString("\n")
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}
