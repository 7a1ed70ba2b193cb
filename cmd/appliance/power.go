package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/power"
)

// powerRow is one node's line in `appliance power` output (JSON field names are stable).
type powerRow struct {
	Node       string `json:"node"`
	Kind       string `json:"kind"`
	Address    string `json:"address"`
	Action     string `json:"action"`
	State      string `json:"state,omitempty"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Attempts   int    `json:"attempts"`
	DurationMS int64  `json:"durationMs"`
}

func newPowerCommand(g *globalFlags) *cobra.Command {
	var (
		cfgPath     string
		concurrency int
		attempts    int
		timeout     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "power",
		Short: "Switch nodes on or off through their BMC (IPMI, Redfish) or SSH, or show their power state",
		Long: "power drives the nodes of a BootstrapConfiguration: on, off, cycle or status, for the named nodes or all of them.\n" +
			"Nodes are handled concurrently with retries; one unreachable node never holds up the others.\n" +
			"The exit status is non-zero if any node failed.",
	}
	add := func(action, short string) {
		cmd.AddCommand(&cobra.Command{
			Use:   action + " [NODE...]",
			Short: short,
			RunE: func(cmd *cobra.Command, args []string) error {
				if cfgPath == "" {
					return fmt.Errorf("--config is required: the bootstrap.yaml naming the nodes")
				}
				ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
				defer stop()
				return runPower(ctx, cmd, g, cfgPath, action, args, concurrency, power.RetryPolicy{MaxAttempts: attempts, NodeTimeout: timeout})
			},
		})
	}
	add("on", "Power nodes on (BMC: chassis on; SSH: wait until sshd answers)")
	add("off", "Power nodes off (BMC: hard off; SSH: systemctl poweroff)")
	add("cycle", "Restart nodes (BMC: power cycle, or on if off; SSH: systemctl reboot)")
	add("status", "Show each node's power state (SSH: on if sshd answers)")
	cmd.PersistentFlags().StringVarP(&cfgPath, "config", "c", "", "BootstrapConfiguration file (bootstrap.yaml)")
	cmd.PersistentFlags().IntVar(&concurrency, "concurrency", 16, "nodes handled at once")
	cmd.PersistentFlags().IntVar(&attempts, "attempts", 3, "attempts per node before giving up")
	cmd.PersistentFlags().DurationVar(&timeout, "node-timeout", 2*time.Minute, "time limit per node, all attempts included")
	return cmd
}

func runPower(ctx context.Context, cmd *cobra.Command, g *globalFlags, cfgPath, action string, names []string, concurrency int, retry power.RetryPolicy) error {
	log := g.logger(cmd.ErrOrStderr())
	cfg, warnings, err := config.Load(cfgPath, config.ValidateOptions{CheckFiles: true})
	for _, w := range warnings {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
	}
	if err != nil {
		return fmt.Errorf("%s is not valid:\n%w", cfgPath, err)
	}
	nodes, err := selectNodes(cfg.Nodes, names)
	if err != nil {
		return err
	}
	rows := map[string]*powerRow{}
	ctrls := map[string]power.Controller{}
	for _, n := range nodes {
		rows[n.Name] = &powerRow{Node: n.Name, Kind: string(n.Power.Kind), Address: n.Power.Address, Action: action}
		t, err := bootstrap.PowerTarget(n)
		if err != nil {
			rows[n.Name].Error = err.Error()
			continue
		}
		c, err := power.New(ctx, t, log)
		if err != nil {
			rows[n.Name].Error = err.Error()
			continue
		}
		defer c.Close()
		ctrls[n.Name] = c
	}
	var results []power.Result
	var mu sync.Mutex
	switch action {
	case "on":
		results = power.PowerOnAll(ctx, ctrls, concurrency, retry)
	case "off":
		results = power.RunAll(ctx, ctrls, concurrency, retry, func(ctx context.Context, c power.Controller) error { return c.PowerOff(ctx) })
	case "cycle":
		results = power.RunAll(ctx, ctrls, concurrency, retry, func(ctx context.Context, c power.Controller) error { return c.PowerCycle(ctx) })
	case "status":
		states := map[power.Controller]power.State{}
		results = power.RunAll(ctx, ctrls, concurrency, retry, func(ctx context.Context, c power.Controller) error {
			st, err := c.PowerState(ctx)
			mu.Lock()
			states[c] = st
			mu.Unlock()
			return err
		})
		for _, r := range results {
			rows[r.Node].State = string(states[ctrls[r.Node]])
		}
	}
	for _, r := range results {
		row := rows[r.Node]
		row.Attempts, row.DurationMS, row.OK = r.Attempts, r.Duration.Milliseconds(), r.Err == nil
		if r.Err != nil {
			row.Error = strings.ReplaceAll(r.Err.Error(), "\n", " ")
		}
	}
	out := make([]powerRow, 0, len(rows))
	failed := 0
	for _, n := range nodes {
		out = append(out, *rows[n.Name])
		if !rows[n.Name].OK {
			failed++
		}
	}
	if g.output == "json" {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		// RESULT last and on one line: a BMC's multi-line error must not break the columns.
		fmt.Fprintln(tw, "NODE\tKIND\tADDRESS\tACTION\tSTATE\tATTEMPTS\tTIME\tRESULT")
		for _, r := range out {
			res := "ok"
			if !r.OK {
				res = "FAILED: " + strings.Join(strings.Fields(r.Error), " ")
			}
			st := r.State
			if st == "" {
				st = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Node, r.Kind, r.Address, r.Action, st, r.Attempts,
				(time.Duration(r.DurationMS) * time.Millisecond).String(), res)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("power %s failed for %d of %d nodes", action, failed, len(out))
	}
	return nil
}

// selectNodes returns the named nodes in config order, or all nodes when none are named.
func selectNodes(all []config.Node, names []string) ([]config.Node, error) {
	if len(names) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []config.Node
	for _, n := range all {
		if want[n.Name] {
			out = append(out, n)
			delete(want, n.Name)
		}
	}
	if len(want) > 0 {
		var missing, known []string
		for n := range want {
			missing = append(missing, n)
		}
		for _, n := range all {
			known = append(known, n.Name)
		}
		sort.Strings(missing)
		return nil, errors.New("no such node: " + strings.Join(missing, ", ") + " (nodes: " + strings.Join(known, ", ") + ")")
	}
	return out, nil
}
