package firewall

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
)

// Backend installs a Spec on a host: NFTables (a table of our own) or Firewalld (a zone and policy of our own in
// firewalld, for hosts where firewalld runs and owns nftables). Choose picks one for a host.
type Backend interface {
	// Name is "nftables" or "firewalld", for reports.
	Name() string
	// Objects names what the backend owns on the host, for reports, e.g. "table inet appliance".
	Objects() string
	// Apply makes the host's firewall match s; changed is false when it already did (then nothing was written).
	Apply(ctx context.Context, s Spec) (changed bool, err error)
	// InPlace reports whether exactly the rule set of s is live, without changing anything.
	InPlace(s Spec) (bool, error)
	// Remove deletes what Apply installed; removing nothing is not an error.
	Remove(ctx context.Context) error
}

var _ Backend = (*NFTables)(nil)

// NFTables owns one nftables table of family inet and rebuilds it atomically (Talos `nftables_chain.go`
// model): other tables — kube-proxy's, a CNI's, the distribution's — are never read for decisions nor
// touched. All netlink traffic goes through a socket bound to the target namespace; the calling thread's
// namespace is never switched. It needs CAP_NET_ADMIN in that namespace; without it errors wrap
// os.ErrPermission (netlink EPERM).
type NFTables struct {
	// NetNSPath is the network namespace to act in, e.g. "/run/netns/node1"; "" means the current one.
	NetNSPath string
	// Table is the inet table to own; "" means DefaultTable ("appliance").
	Table string
	// Log receives one record per change; nil discards.
	Log *slog.Logger
}

// libMu serialises batch building: google/nftables v0.3.0 allocates set IDs from an unguarded
// package-level counter, which races when two Conns add sets concurrently.
var libMu sync.Mutex

// Name returns "nftables".
func (n *NFTables) Name() string { return "nftables" }

// Objects returns "table inet NAME".
func (n *NFTables) Objects() string { return "table inet " + n.table() }

func (n *NFTables) table() string {
	if n.Table == "" {
		return DefaultTable
	}
	return n.Table
}

func (n *NFTables) log() *slog.Logger {
	if n.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return n.Log
}

// conn opens one lasting netlink socket in the target namespace.
func (n *NFTables) conn() (*nftables.Conn, func(), error) {
	if n.NetNSPath == "" {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return nil, nil, fmt.Errorf("open nftables netlink socket (needs CAP_NET_ADMIN): %w", err)
		}
		return c, func() { _ = c.CloseLasting() }, nil
	}
	h, err := netns.GetFromPath(n.NetNSPath)
	if err != nil {
		return nil, nil, fmt.Errorf("open network namespace %s (does it exist?): %w", n.NetNSPath, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(h)), nftables.AsLasting())
	if err != nil {
		_ = h.Close()
		return nil, nil, fmt.Errorf("open nftables netlink socket in %s (needs CAP_NET_ADMIN): %w", n.NetNSPath, err)
	}
	return c, func() { _ = c.CloseLasting(); _ = h.Close() }, nil
}

// Apply makes the table match s. It first compares the live table with the desired one (tables, sets and
// their elements, the chain, every rule's expressions and comment); when they match it returns
// changed=false and sends nothing. Otherwise it replaces the table in ONE netlink batch — add table (so the
// delete cannot fail), delete table, add table, sets with elements, the input chain and its rules — which
// the kernel commits atomically: no moment without a firewall, no half-built one on error.
//
// Errors: s invalid (wraps ErrInvalidSpec); ctx done before the batch was sent; namespace or netlink
// failures (EPERM wraps os.ErrPermission: run as root / with CAP_NET_ADMIN).
func (n *NFTables) Apply(ctx context.Context, s Spec) (bool, error) {
	if err := s.Validate(); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	rs := buildRuleset(n.table(), s)
	c, done, err := n.conn()
	if err != nil {
		return false, err
	}
	defer done()
	diff, err := rs.diff(c)
	if err != nil {
		return false, err
	}
	if diff == "" {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := rs.install(c); err != nil {
		return false, fmt.Errorf("replace nftables table inet %s: %w", rs.table, err)
	}
	n.log().Info("firewall table replaced", "table", rs.table, "netns", n.NetNSPath,
		"reason", diff, "rules", len(rs.rules))
	return true, nil
}

// InPlace reports whether the live table is exactly the one Apply would install for s: same sets and
// elements, one input chain with the same hook, priority and policy, the same rules in the same order, and
// nothing else in the table. It changes nothing. Errors: s invalid (wraps ErrInvalidSpec), netlink failures.
func (n *NFTables) InPlace(s Spec) (bool, error) {
	if err := s.Validate(); err != nil {
		return false, err
	}
	rs := buildRuleset(n.table(), s)
	c, done, err := n.conn()
	if err != nil {
		return false, err
	}
	defer done()
	diff, err := rs.diff(c)
	return err == nil && diff == "", err
}

// Remove deletes the table (and with it its chain, rules and sets) in one batch; a missing table is not an
// error. Other tables are untouched.
func (n *NFTables) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, done, err := n.conn()
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: n.table()}
	c.AddTable(t) // makes the delete succeed when the table is absent, in the same transaction
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete nftables table inet %s: %w", t.Name, err)
	}
	n.log().Info("firewall table removed", "table", t.Name, "netns", n.NetNSPath)
	return nil
}

func (rs ruleset) objects() (*nftables.Table, *nftables.Chain) {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: rs.table}
	policy := nftables.ChainPolicyDrop
	if rs.accept {
		policy = nftables.ChainPolicyAccept
	}
	ch := &nftables.Chain{
		Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policy,
	}
	return t, ch
}

// install queues the whole table and sends it as one batch.
func (rs ruleset) install(c *nftables.Conn) error {
	libMu.Lock()
	defer libMu.Unlock()
	t, ch := rs.objects()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	ids := map[string]uint32{}
	for _, s := range rs.sets {
		set := s.nftablesSet(t)
		if err := c.AddSet(set, s.elems); err != nil { // a dynamic set has none: the rules fill it
			return fmt.Errorf("set %s: %w", s.name, err)
		}
		ids[s.name] = set.ID
	}
	c.AddChain(ch)
	for _, r := range rs.rules {
		exprs := make([]expr.Any, len(r.exprs))
		for i, e := range r.exprs {
			switch x := e.(type) {
			case *expr.Lookup:
				l2 := *x
				l2.SetID = ids[x.SetName]
				e = &l2
			case *expr.Dynset:
				d2 := *x
				d2.SetID = ids[x.SetName]
				e = &d2
			}
			exprs[i] = e
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs, UserData: r.userData()})
	}
	return c.Flush()
}

// diff returns "" when the live table equals rs, else a short reason for logs ("table absent",
// "rule 7 differs", ...).
func (rs ruleset) diff(c *nftables.Conn) (string, error) {
	t, want := rs.objects()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == t.Name }) {
		return "table absent", nil
	}

	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", fmt.Errorf("list nftables chains: %w", err)
	}
	var found *nftables.Chain
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != t.Name {
			continue
		}
		if ch.Name != want.Name || found != nil {
			return fmt.Sprintf("unexpected chain %q", ch.Name), nil
		}
		found = ch
	}
	switch {
	case found == nil:
		return "chain input absent", nil
	case found.Type != want.Type || !eqPtr(found.Hooknum, want.Hooknum) ||
		!eqPtr(found.Priority, want.Priority) || !eqPtr(found.Policy, want.Policy):
		return "chain input has another type, hook, priority or policy", nil
	}

	sets, err := c.GetSets(t)
	if err != nil {
		return "", fmt.Errorf("list nftables sets of table %s: %w", t.Name, err)
	}
	if len(sets) != len(rs.sets) {
		return fmt.Sprintf("table has %d sets, want %d", len(sets), len(rs.sets)), nil
	}
	for _, ws := range rs.sets {
		i := slices.IndexFunc(sets, func(x *nftables.Set) bool { return x.Name == ws.name })
		if i < 0 {
			return fmt.Sprintf("set %s absent", ws.name), nil
		}
		live, wantSet := sets[i], ws.nftablesSet(t)
		if live.KeyType.GetNFTMagic() != wantSet.KeyType.GetNFTMagic() || live.Interval != wantSet.Interval ||
			live.Dynamic != wantSet.Dynamic || live.Size != wantSet.Size ||
			live.IsMap || live.Anonymous || live.Constant || live.HasTimeout || live.Concatenation {
			return fmt.Sprintf("set %s has another type, size or flags", ws.name), nil
		}
		if ws.dynamic {
			continue // its elements are the kernel's live counts
		}
		elems, err := c.GetSetElements(live)
		if err != nil {
			return "", fmt.Errorf("list elements of set %s: %w", ws.name, err)
		}
		if !sameElements(elems, ws.elems) {
			return fmt.Sprintf("set %s elements differ", ws.name), nil
		}
	}

	rules, err := c.GetRules(t, found)
	if err != nil {
		return "", fmt.Errorf("list rules of chain %s: %w", found.Name, err)
	}
	if len(rules) != len(rs.rules) {
		return fmt.Sprintf("chain input has %d rules, want %d", len(rules), len(rs.rules)), nil
	}
	for i, r := range rs.rules {
		if !bytes.Equal(rules[i].UserData, r.userData()) || !sameExprs(rules[i].Exprs, r.exprs) {
			return fmt.Sprintf("rule %d (%s) differs", i+1, r.text), nil
		}
	}
	return "", nil
}

func eqPtr[T comparable](a, b *T) bool { return a != nil && b != nil && *a == *b }

func sameElements(live, want []nftables.SetElement) bool {
	type el struct {
		key string
		end bool
	}
	norm := func(es []nftables.SetElement) []el {
		out := make([]el, len(es))
		for i, e := range es {
			out[i] = el{string(e.Key), e.IntervalEnd}
		}
		slices.SortFunc(out, func(a, b el) int {
			if c := bytes.Compare([]byte(a.key), []byte(b.key)); c != 0 {
				return c
			}
			if a.end == b.end {
				return 0
			} else if a.end {
				return -1
			}
			return 1
		})
		return out
	}
	return slices.Equal(norm(live), norm(want))
}

// sameExprs compares expressions as the kernel reports them. Set IDs only exist inside a batch (the kernel
// reports lookups and dynsets by name), so they are ignored.
func sameExprs(live, want []expr.Any) bool {
	if len(live) != len(want) {
		return false
	}
	for i := range live {
		a, b := live[i], want[i]
		if la, ok := a.(*expr.Lookup); ok {
			if lb, ok := b.(*expr.Lookup); ok {
				x, y := *la, *lb
				x.SetID, y.SetID = 0, 0
				a, b = &x, &y
			}
		}
		if da, ok := a.(*expr.Dynset); ok {
			if db, ok := b.(*expr.Dynset); ok {
				x, y := *da, *db
				x.SetID, y.SetID = 0, 0
				a, b = &x, &y
			}
		}
		if !reflect.DeepEqual(a, b) {
			return false
		}
	}
	return true
}
