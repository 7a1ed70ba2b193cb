package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// statusRow is one node in `appliance status` (the JSON array elements with --output json).
type statusRow struct {
	Node    string    `json:"node"`
	Roles   []string  `json:"roles"`
	State   string    `json:"state"`
	Updated time.Time `json:"updated,omitzero"`
	Reason  string    `json:"reason,omitempty"`
	BootID  string    `json:"bootID,omitempty"`
	// Steps is the last report per hostagent step.
	Steps map[string]agentapi.Report `json:"steps,omitempty"`
	// Firewall is the node's firewall backend ("nftables", "firewalld") from its firewall step's report.
	Firewall string `json:"firewall,omitempty"`
	// AgentVersion and AgentSHA256 are the hostagent build the node last reported.
	AgentVersion string `json:"agentVersion,omitempty"`
	AgentSHA256  string `json:"agentSHA256,omitempty"`
	// History is the node's day-2 history, oldest first (pkg/nodestate: added, ready, rebooted,
	// upgraded, removed, token-rotated, token-revoked, enrol-conflict, enrol-approved), with
	// --history or when nodes are named; never null then.
	History []nodestate.LifecycleEntry `json:"history,omitempty"`
	// Alarm is the node's enrolment alarm (a second machine claimed it in one power-on:
	// nodestate.ActiveEnrolConflict) until the operator settles it; its Detail says what to do.
	Alarm *nodestate.LifecycleEntry `json:"alarm,omitempty"`
	// PendingEnrolment is the node's enrolment that waits for the operator's approval
	// (boot.enrolment.approval: operator) while its enrolment window is open.
	PendingEnrolment *pendingEnrolment `json:"pendingEnrolment,omitempty"`
}

// pendingEnrolment is what the operator compares with the machine's console before `appliance node
// approve`.
type pendingEnrolment struct {
	KeyFingerprint string    `json:"keyFingerprint"`
	Source         string    `json:"source"`
	Since          time.Time `json:"since"`
	WindowCloses   time.Time `json:"windowCloses"`
}

// newStatusCommand is `appliance status --config FILE [--history] [NODE...]`: every configured node's
// state from STATE/nodes (pkg/nodestate), read from disk, so it works whether or not the server
// runs. Nodes without a record are pending. After the table, an ALARM line per node whose enrolment
// was claimed by a second machine (until the operator settles it) and a PENDING line per enrolment
// that waits for the operator's approval, each saying what to run. With --history, or for the nodes
// named (which may include nodes removed from the configuration that still have a record), each
// node's day-2 history follows, one line an entry: "2026-11-24 22:41:07  added (bootstrap run with …)".
func newStatusCommand(g *globalFlags) *cobra.Command {
	var configPath, stateDir string
	var withHistory bool
	cmd := &cobra.Command{
		Use:   "status [NODE...]",
		Short: "Show every node's state: NODE ROLES STATE FIREWALL UPDATED REASON (JSON array with --output json), then enrolment alarms and enrolments waiting for approval; --history or NODE adds each node's day-2 history",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, _, err := config.Load(configPath, config.ValidateOptions{})
			if err != nil {
				return fmt.Errorf("%s is not valid:\n%w", configPath, err)
			}
			dir := cfg.StateDir
			if stateDir != "" {
				dir = stateDir
			}
			if st, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("state directory %s does not exist: run `appliance bootstrap` first, or name the right one (stateDir, --state-dir)", dir)
			} else if err != nil {
				return fmt.Errorf("state directory: %w", err)
			} else if !st.IsDir() {
				return fmt.Errorf("state directory %s is not a directory: name the right one (stateDir, --state-dir)", dir)
			}
			store := nodestate.Open(statedir.Nodes(dir))
			type entry struct {
				name  string
				roles []string
			}
			var nodes []entry
			for _, n := range cfg.Nodes {
				roles := make([]string, 0, len(n.Roles))
				for _, r := range n.Roles {
					roles = append(roles, string(r))
				}
				nodes = append(nodes, entry{n.Name, roles})
			}
			if len(args) > 0 {
				withHistory = true
				var named []entry
				for _, a := range args {
					i := slices.IndexFunc(nodes, func(e entry) bool { return e.name == a })
					switch {
					case i >= 0:
						named = append(named, nodes[i])
					case recorded(store, a):
						named = append(named, entry{a, []string{}}) // removed from the configuration
					default:
						var names []string
						for _, e := range nodes {
							names = append(names, e.name)
						}
						return fmt.Errorf("node %q is not in the configuration (nodes[].name) and has no record in %s: name one of %s",
							a, store.Dir(), strings.Join(names, ", "))
					}
				}
				nodes = named
			}
			var rows []statusRow
			for _, n := range nodes {
				st, err := store.Get(n.name)
				if err != nil && !errors.Is(err, nodestate.ErrNotFound) {
					return err
				}
				if errors.Is(err, nodestate.ErrNotFound) {
					st = agentapi.NodeStatus{State: agentapi.StatePending}
				}
				row := statusRow{Node: n.name, Roles: n.roles, State: st.State, Updated: st.Updated,
					Reason: st.Reason, BootID: st.BootID, Steps: st.Steps,
					Firewall:     firewall.BackendOfDetail(st.Steps[agentapi.StepFirewall].Detail),
					AgentVersion: st.AgentVersion, AgentSHA256: st.AgentSHA256}
				hist, err := store.History(n.name)
				if err != nil {
					return err
				}
				if a, ok := nodestate.ActiveEnrolConflict(hist); ok {
					row.Alarm = &a
				}
				if row.PendingEnrolment, err = enrolmentPending(statedir.Enrolment(dir), n.name, time.Now()); err != nil {
					return err
				}
				if withHistory {
					row.History = hist
					if row.History == nil {
						row.History = []nodestate.LifecycleEntry{}
					}
				}
				rows = append(rows, row)
			}
			out := cmd.OutOrStdout()
			if g.output == "json" {
				if rows == nil {
					rows = []statusRow{}
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tROLES\tSTATE\tFIREWALL\tUPDATED\tREASON")
			for _, r := range rows {
				updated := "-"
				if !r.Updated.IsZero() {
					updated = r.Updated.Local().Format(time.DateTime)
				}
				reason := r.Reason
				if reason == "" {
					reason = "-"
				}
				fw := r.Firewall
				if fw == "" {
					fw = "-"
				}
				roles := strings.Join(r.Roles, ",")
				if roles == "" {
					roles = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, roles, r.State, fw, updated, oneLine(reason))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, r := range rows {
				if r.Alarm != nil {
					fmt.Fprintf(out, "\nALARM %s (%s): %s\n", r.Node, r.Alarm.Time.Local().Format(time.DateTime), oneLine(r.Alarm.Detail))
				}
				if p := r.PendingEnrolment; p != nil {
					fmt.Fprintf(out, "\nPENDING %s: enrolment with key %s from %s since %s waits for approval until %s: compare the key and address with %s's console, then run `appliance node approve %s --config %s --fingerprint %s`\n",
						r.Node, p.KeyFingerprint, p.Source, p.Since.Local().Format(time.DateTime), p.WindowCloses.Local().Format(time.DateTime), r.Node, r.Node, configPath, p.KeyFingerprint)
				}
			}
			if cfg.Boot.Enabled() && len(args) == 0 {
				// On stderr, for people: stdout stays the table.
				fmt.Fprintf(cmd.ErrOrStderr(), "network boot (served by appliance serve): %s\n", cfg.BootSummary())
			}
			if !withHistory {
				return nil
			}
			for _, r := range rows {
				fmt.Fprintf(out, "\n%s history:\n", r.Node)
				if len(r.History) == 0 {
					fmt.Fprintln(out, "  (none recorded yet)")
				}
				for _, e := range r.History {
					fmt.Fprintln(out, "  "+e.Line(time.Local))
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&withHistory, "history", false, "after the table, print each node's day-2 history (added, ready, rebooted, upgraded, removed, token-rotated, token-revoked, enrol-conflict, enrol-approved) and include it in JSON")
	cmd.Flags().StringVarP(&configPath, "config", "c", "bootstrap.yaml", "BootstrapConfiguration file (for the node list and stateDir)")
	cmd.Flags().StringVarP(&stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	return cmd
}

// enrolmentPending returns node's enrolment binding in recordDir (STATE/enrolment) when it waits for
// the operator's approval within its window at now; nil otherwise.
func enrolmentPending(recordDir, node string, now time.Time) (*pendingEnrolment, error) {
	rec, found, err := server.ReadEnrollRecord(recordDir, node)
	if err != nil || !found || !rec.Pending {
		return nil, err
	}
	ap, approved, err := server.ReadEnrollApproval(recordDir, node)
	if err != nil {
		return nil, err
	}
	closes := rec.PoweredOn.Add(agentapi.EnrollWindow)
	if approved && ap.KeyFingerprint == rec.KeyFingerprint && ap.PoweredOn.Equal(rec.PoweredOn) || now.After(closes) {
		return nil, nil
	}
	return &pendingEnrolment{KeyFingerprint: rec.KeyFingerprint, Source: rec.Source, Since: rec.Enrolled, WindowCloses: closes}, nil
}

// recorded reports whether the store holds a status or a history for node (a node removed from the
// configuration keeps both).
func recorded(store *nodestate.Store, node string) bool {
	if _, err := store.Get(node); err == nil {
		return true
	}
	h, err := store.History(node)
	return err == nil && len(h) > 0
}

// oneLine keeps a table row on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
