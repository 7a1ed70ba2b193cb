package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
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
}

// newStatusCommand is `appliance status --config FILE`: every configured node's state from
// STATE/nodes (pkg/nodestate), read from disk, so it works whether or not the server runs. Nodes
// without a record are pending.
func newStatusCommand(g *globalFlags) *cobra.Command {
	var configPath, stateDir string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every node's state: NODE ROLES STATE FIREWALL UPDATED REASON (JSON array with --output json)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			var rows []statusRow
			for _, n := range cfg.Nodes {
				roles := make([]string, 0, len(n.Roles))
				for _, r := range n.Roles {
					roles = append(roles, string(r))
				}
				st, err := store.Get(n.Name)
				if err != nil && !errors.Is(err, nodestate.ErrNotFound) {
					return err
				}
				if errors.Is(err, nodestate.ErrNotFound) {
					st = agentapi.NodeStatus{State: agentapi.StatePending}
				}
				rows = append(rows, statusRow{Node: n.Name, Roles: roles, State: st.State, Updated: st.Updated,
					Reason: st.Reason, BootID: st.BootID, Steps: st.Steps,
					Firewall: firewall.BackendOfDetail(st.Steps[agentapi.StepFirewall].Detail)})
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
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, strings.Join(r.Roles, ","), r.State, fw, updated, oneLine(reason))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&configPath, "config", "c", "bootstrap.yaml", "BootstrapConfiguration file (for the node list and stateDir)")
	cmd.Flags().StringVarP(&stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	return cmd
}

// oneLine keeps a table row on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
