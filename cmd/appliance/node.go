package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/noderemove"
)

func newNodeCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Day-2 node operations: remove, reinstall, revoke, approve",
	}
	cmd.AddCommand(newNodeRemoveCommand(g), newNodeReinstallCommand(), newNodeRevokeCommand(), newNodeApproveCommand())
	return cmd
}

type nodeRemoveFlags struct {
	config, stateDir string
	yes, dryRun      bool
	force            bool
	drainTimeout     time.Duration
}

func newNodeRemoveCommand(g *globalFlags) *cobra.Command {
	f := &nodeRemoveFlags{}
	cmd := &cobra.Command{
		Use:   "remove NODE --config FILE --yes",
		Short: "Take a node out of the cluster: drain, kubeadm reset (removes its etcd member), delete the Node, power it off through its BMC",
		Long: `remove takes NODE out of the Kubernetes cluster, in steps that each check first, so a removal
that was killed finishes when run again:

  check   NODE is in nodes[] (or known to the state directory); a control plane is refused when it
          is the last one, when etcd would lose quorum without it (counted from the etcd static
          pods' readiness), or when the appliance cannot reach it over SSH
  drain   cordon, then evict its pods (DaemonSet and static pods stay), bounded by --drain-timeout;
          pods no controller owns refuse the removal unless --force (as kubectl drain)
  reset   over SSH: stop hostagent, kubeadm reset -f (on a control plane it removes the etcd
          member), disable kubelet; a worker that does not answer is skipped
  delete  delete the Node object
  record  "removed" in the node's day-2 history (appliance status NODE)
  power   ipmi/redfish nodes: power off through the BMC

Then delete NODE from nodes[] (wherever it stands in the list) and run appliance bootstrap: the
other nodes' VRRP peers, firewalls and pod routes are re-rendered from nodes[] and their hostagents
apply them at their next resync. Pod ranges belong to node names (STATE/kubernetes/pod-ranges.json):
the other nodes keep theirs, NODE's is freed. When NODE is the control plane that ran kubeadm init,
the first remaining control plane of nodes[] that joined takes over renewing the join secrets
(bootstrap token, uploaded certificates) for nodes added later; it is never told to init again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runNodeRemove(ctx, cmd, g, f, args[0])
		},
	}
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&f.stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().BoolVar(&f.yes, "yes", false, "do it: the removal drains the node and wipes its Kubernetes state")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "run the checks and print what the removal would do; change nothing")
	cmd.Flags().BoolVar(&f.force, "force", false, "also evict pods no controller owns (they are deleted for good); without it such pods refuse the removal")
	cmd.Flags().DurationVar(&f.drainTimeout, "drain-timeout", noderemove.DefaultDrainTimeout, "how long the drain waits for evicted pods to leave")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func runNodeRemove(ctx context.Context, cmd *cobra.Command, g *globalFlags, f *nodeRemoveFlags, name string) error {
	if !f.yes && !f.dryRun {
		return fmt.Errorf("removing %s drains it, runs kubeadm reset on it and deletes it from the cluster: pass --yes to do it, or --dry-run to see what it would do", name)
	}
	if f.drainTimeout <= 0 {
		return fmt.Errorf("--drain-timeout %s: give a positive duration such as 2m", f.drainTimeout)
	}
	cfg, err := loadNodeConfig(cmd.ErrOrStderr(), f.config)
	if err != nil {
		return err
	}
	dir, err := existingStateDir(cfg, f.stateDir)
	if err != nil {
		return err
	}
	if !f.dryRun {
		unlock, err := bootstrap.LockStateDir(dir)
		if err != nil {
			return err
		}
		defer unlock()
	}
	cfgPath := f.config
	if abs, err := filepath.Abs(cfgPath); err == nil {
		cfgPath = abs
	}
	o := nodeRemoveOptions(cfg, cfgPath, dir, name, g, cmd, f.dryRun, f.drainTimeout)
	o.Force = f.force
	res, err := noderemove.Remove(ctx, o)
	if g.output == outputJSON && res != nil {
		if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(res); jerr != nil && err == nil {
			err = jerr
		}
	}
	if err != nil {
		if errors.Is(err, noderemove.ErrRefused) {
			return fmt.Errorf("%w (nothing was changed)", err)
		}
		return fmt.Errorf("%w (run the same command again to finish the removal)", err)
	}
	if g.output != outputJSON {
		if f.dryRun {
			fmt.Fprintln(cmd.ErrOrStderr(), "dry run: nothing was changed")
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s removed from the cluster; now delete it from nodes[] in %s and run appliance bootstrap, which updates the other nodes' VRRP peers, firewalls and pod routes\n", name, cfgPath)
		}
	}
	return nil
}

// nodeRemoveOptions builds the removal's options; `appliance bootstrap --prune` uses them too.
func nodeRemoveOptions(cfg *config.BootstrapConfiguration, cfgPath, stateDir, name string, g *globalFlags, cmd *cobra.Command, dryRun bool, drain time.Duration) noderemove.Options {
	return noderemove.Options{
		Config: cfg, ConfigPath: cfgPath, StateDir: stateDir, Node: name, DryRun: dryRun, DrainTimeout: drain,
		Reason: "appliance node remove with " + cfgPath, PowerTarget: bootstrap.PowerTarget,
		Log: g.logger(cmd.ErrOrStderr()),
		Progress: func(step, detail string) {
			if g.output != outputJSON {
				fmt.Fprintf(cmd.ErrOrStderr(), "[%s] %s: %s\n", name, step, detail)
			}
		},
	}
}

// loadNodeConfig loads the `node` commands' configuration (config.Load, validated), writing its
// warnings to out. The error names the file and lists every invalid field with its path.
func loadNodeConfig(out io.Writer, path string) (*config.BootstrapConfiguration, error) {
	cfg, warnings, err := config.Load(path, config.ValidateOptions{})
	for _, w := range warnings {
		fmt.Fprintf(out, "warning: %s\n", w)
	}
	if err != nil {
		return nil, fmt.Errorf("%s is not valid:\n%w", path, err)
	}
	return cfg, nil
}

// existingStateDir is the state directory a `node` command works in: flag (--state-dir) when set,
// else the configuration's stateDir. It must exist: the error says to run bootstrap first or name
// the right one.
func existingStateDir(cfg *config.BootstrapConfiguration, flag string) (string, error) {
	dir := cfg.StateDir
	if flag != "" {
		dir = flag
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("state directory %s is not there: run appliance bootstrap first, or name the right one (stateDir, --state-dir)", dir)
	}
	return dir, nil
}
