package firewall

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/google/nftables"
)

// DefaultConnCapTable is the inet table the firewalld backend owns beside firewalld's own: the per-source
// connection caps (Port.ConnsPerSource) alone, which firewalld cannot express (it has no `ct count`; its
// rich rules' limit is a rate, not a count of open connections).
const DefaultConnCapTable = "appliance-conncap"

// connCapTable installs the per-source connection caps of a Spec as a table of their own, for hosts where
// another firewall (firewalld) owns the filtering — as kube-proxy keeps its nftables table beside
// firewalld's, and Redirect its table inet appliance-apilb:
//
//	table inet appliance-conncap {
//		set node_networks_v4 { ... }  set conns_appliance_https_v4 { type ipv4_addr; size 65535; flags dynamic; } ...
//		chain input {
//			type filter hook input priority filter; policy accept;
//			ip saddr @node_networks_v4 tcp dport 8443 ct state new add @conns_appliance_https_v4 { ip saddr ct count over 80 } reject with tcp reset
//			...
//		}
//	}
//
// The chain's policy is accept, so it decides nothing but the caps: a reject in any base chain is final,
// whatever another table accepts, and firewalld's chains (priority filter + 10) see what this one lets
// through. firewalld deletes and rebuilds only its own tables (`inet firewalld`, at `firewall-cmd --reload`
// and restart), so this one stays. Rebuilt like the firewall's own table: diff first, then one atomic batch.
type connCapTable struct {
	// NetNSPath is the network namespace to act in; "" means the current one.
	NetNSPath string
	// Table is the inet table to own; "" means DefaultConnCapTable.
	Table string
	Log   *slog.Logger
}

func (t *connCapTable) table() string {
	if t.Table == "" {
		return DefaultConnCapTable
	}
	return t.Table
}

// Objects returns "table inet NAME".
func (t *connCapTable) Objects() string { return "table inet " + t.table() }

// apply makes the table hold exactly the caps of s, or removes it when none of s's ports is capped (a host
// whose roles serve nothing behind pkg/connlimit). changed is false when nothing was sent.
func (t *connCapTable) apply(ctx context.Context, s Spec) (changed bool, reason string, err error) {
	rs := connCapRuleset(t.table(), s)
	n := &NFTables{NetNSPath: t.NetNSPath}
	c, done, err := n.conn()
	if err != nil {
		return false, "", err
	}
	defer done()
	if len(rs.rules) == 0 {
		present, err := tablePresent(c, rs.table)
		if err != nil || !present {
			return false, "", err
		}
		if err := ctx.Err(); err != nil {
			return false, "", err
		}
		if err := deleteTable(c, rs.table); err != nil {
			return false, "", err
		}
		return true, "no capped port: table removed", nil
	}
	diff, err := rs.diff(c)
	if err != nil || diff == "" {
		return false, "", err
	}
	if err := ctx.Err(); err != nil {
		return false, "", err
	}
	if err := rs.install(c); err != nil {
		return false, "", fmt.Errorf("replace nftables table inet %s: %w", rs.table, err)
	}
	return true, diff, nil
}

// inPlace reports whether the table is what apply would leave: the caps of s, or no table when s has none.
func (t *connCapTable) inPlace(s Spec) (bool, error) {
	rs := connCapRuleset(t.table(), s)
	n := &NFTables{NetNSPath: t.NetNSPath}
	c, done, err := n.conn()
	if err != nil {
		return false, err
	}
	defer done()
	if len(rs.rules) == 0 {
		present, err := tablePresent(c, rs.table)
		return err == nil && !present, err
	}
	diff, err := rs.diff(c)
	return err == nil && diff == "", err
}

// remove deletes the table when present; removing nothing sends nothing.
func (t *connCapTable) remove(ctx context.Context) (bool, error) {
	n := &NFTables{NetNSPath: t.NetNSPath}
	c, done, err := n.conn()
	if err != nil {
		return false, err
	}
	defer done()
	present, err := tablePresent(c, t.table())
	if err != nil || !present {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return true, deleteTable(c, t.table())
}

func tablePresent(c *nftables.Conn, name string) (bool, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == name }), nil
}

func deleteTable(c *nftables.Conn, name string) error {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(t) // makes the delete succeed when the table went away meanwhile, in the same transaction
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete nftables table inet %s: %w", name, err)
	}
	return nil
}

// connCapRuleset is the table the firewalld backend owns beside firewalld's (firewalld has no `ct count`):
// the per-source connection caps of s alone, in an input chain whose policy is accept, so it refuses only
// connections past a cap and leaves every other decision to firewalld. A reject in any table is final,
// whatever another table accepts. Its sets are the node networks (the caps count only what the firewall
// admits) and the counting sets; with no capped port among s's roles it has no rule (the table is then
// removed).
func connCapRuleset(table string, s Spec) ruleset {
	full := buildRuleset(table, s)
	rs := ruleset{table: table, roles: s.Roles, accept: true}
	for _, st := range full.sets {
		if st.dynamic || st.name == setNodeNetworks4 || st.name == setNodeNetworks6 {
			rs.sets = append(rs.sets, st)
		}
	}
	for _, r := range full.rules {
		if r.connCap {
			rs.rules = append(rs.rules, r)
		}
	}
	return rs
}
