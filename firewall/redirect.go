package firewall

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// APILoadBalancerPort is the port each control plane's API load balancer (HAProxy, pkg/haproxy) listens
// on, 9445/tcp as OpenShift's on-prem haproxy static pod uses; the API VIP's port is redirected to it
// (Redirect).
const APILoadBalancerPort uint16 = 9445

// DefaultRedirectTable is the inet table Redirect owns: the API VIP's redirect only, apart from the
// firewall's own table so that the firewalld backend (which owns the filter rules where it runs) and
// the nftables backend share it.
const DefaultRedirectTable = "appliance-apilb"

// Redirect sends TCP traffic for VIP:Port to the local port ToPort of the host that receives it: in
// prerouting (traffic that arrives for the VIP while this host holds it: destination becomes the
// primary address of the incoming interface) and in output (this host's own traffic for the VIP,
// wherever the VIP is: destination becomes the loopback address). This is OpenShift's on-prem API
// load balancing: the VIP's port goes to the local HAProxy, which balances it across every
// kube-apiserver that answers /readyz; kube-apiserver keeps its port on the node addresses, which the
// health checks and the backends use, so they are never redirected.
//
// The rules, in table inet DefaultRedirectTable (`nft list table inet appliance-apilb`):
//
//	chain prerouting { type nat hook prerouting priority dstnat; ip daddr VIP tcp dport Port redirect to :ToPort }
//	chain output     { type nat hook output priority -100; ip daddr VIP tcp dport Port redirect to :ToPort }
//
// (ip6 daddr for an IPv6 VIP). The kernel's redirect needs nf_nat (as kube-proxy's nftables mode).
type Redirect struct {
	VIP    netip.Addr
	Port   uint16
	ToPort uint16
}

// RedirectTable installs Redirects in one network namespace.
type RedirectTable struct {
	// NetNSPath is the network namespace to act in, e.g. "/run/netns/node1"; "" means the current one.
	NetNSPath string
	// Table is the inet table to own; "" means DefaultRedirectTable.
	Table string
}

func (t *RedirectTable) table() *nftables.Table {
	name := t.Table
	if name == "" {
		name = DefaultRedirectTable
	}
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
}

// Objects returns "table inet NAME", for reports.
func (t *RedirectTable) Objects() string { return "table inet " + t.table().Name }

func (r Redirect) validate() error {
	if !r.VIP.IsValid() || r.VIP.IsUnspecified() {
		return fmt.Errorf("%w: redirect: no VIP", ErrInvalidSpec)
	}
	if r.Port == 0 || r.ToPort == 0 {
		return fmt.Errorf("%w: redirect: port %d to port %d: ports must be 1-65535", ErrInvalidSpec, r.Port, r.ToPort)
	}
	return nil
}

// exprs is `ip daddr VIP tcp dport Port redirect to :ToPort` as netlink expressions.
func (r Redirect) exprs() []expr.Any {
	vip := r.VIP.Unmap()
	proto, off, addr := byte(unix.NFPROTO_IPV4), uint32(16), vip.AsSlice() // IPv4 header: daddr at 16 (RFC 791)
	if vip.Is6() {
		proto, off = unix.NFPROTO_IPV6, 24 // IPv6 header: destination address at 24 (RFC 8200)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Port)},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.ToPort)},
		// As the kernel reports it back: min = max = the port register, NF_NAT_RANGE_PROTO_SPECIFIED (2).
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: 2},
	}
}

// redirectChains are the table's two chains: prerouting at dstnat (-100) and output at -100 (the
// priority `nft` gives "dstnat" in the output hook).
func redirectChains(t *nftables.Table) []*nftables.Chain {
	return []*nftables.Chain{
		{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
		{Name: "output", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest},
	}
}

// Apply makes the table hold exactly r's two rules. It compares the live table first and sends nothing
// when it matches (changed=false); otherwise it replaces the table in one netlink batch, which the
// kernel commits atomically. Errors: r invalid (wraps ErrInvalidSpec); ctx done; namespace or netlink
// failures (EPERM wraps os.ErrPermission: run as root / with CAP_NET_ADMIN).
func (t *RedirectTable) Apply(ctx context.Context, r Redirect) (changed bool, err error) {
	if err := r.validate(); err != nil {
		return false, err
	}
	n := &NFTables{NetNSPath: t.NetNSPath}
	c, done, err := n.conn()
	if err != nil {
		return false, err
	}
	defer done()
	tbl := t.table()
	same, err := redirectInPlace(c, tbl, r)
	if err != nil || same {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	libMu.Lock()
	defer libMu.Unlock()
	c.AddTable(tbl) // makes the delete succeed when the table is absent, in the same transaction
	c.DelTable(tbl)
	c.AddTable(tbl)
	for _, ch := range redirectChains(tbl) {
		c.AddChain(ch)
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: r.exprs()})
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("replace nftables table inet %s: %w", tbl.Name, err)
	}
	return true, nil
}

// redirectInPlace reports whether tbl holds exactly the two chains and rules of r.
func redirectInPlace(c *nftables.Conn, tbl *nftables.Table, r Redirect) (bool, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	found := false
	for _, x := range tables {
		found = found || x.Name == tbl.Name
	}
	if !found {
		return false, nil
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("list nftables chains: %w", err)
	}
	want := redirectChains(tbl)
	var live []*nftables.Chain
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == tbl.Name {
			live = append(live, ch)
		}
	}
	if len(live) != len(want) {
		return false, nil
	}
	for _, w := range want {
		var ch *nftables.Chain
		for _, l := range live {
			if l.Name == w.Name {
				ch = l
			}
		}
		if ch == nil || ch.Type != w.Type || !eqPtr(ch.Hooknum, w.Hooknum) || !eqPtr(ch.Priority, w.Priority) {
			return false, nil
		}
		rules, err := c.GetRules(tbl, ch)
		if err != nil {
			return false, fmt.Errorf("list rules of chain %s: %w", ch.Name, err)
		}
		if len(rules) != 1 || !sameExprs(rules[0].Exprs, r.exprs()) {
			return false, nil
		}
	}
	return true, nil
}

// Remove deletes the table; a missing table is not an error. Other tables are untouched.
func (t *RedirectTable) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n := &NFTables{NetNSPath: t.NetNSPath}
	c, done, err := n.conn()
	if err != nil {
		return err
	}
	defer done()
	tbl := t.table()
	c.AddTable(tbl)
	c.DelTable(tbl)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete nftables table inet %s: %w", tbl.Name, err)
	}
	return nil
}
