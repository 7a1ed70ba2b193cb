package main

import (
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/applianced"
)

func newServeCommand(g *globalFlags) *cobra.Command {
	var o applianced.ServeOptions
	cmd := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Run the HTTPS front (registry, repo, Ignition) from the state `bootstrap` prepared",
		Long: `Runs until SIGTERM. On a systemd host this is the appliance service; elsewhere the bootstrap
serve phase starts it detached. It loads the serving certificate, node tokens, registry storage and
rendered Ignition configs the bootstrap phases left in the state directory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.Logger = g.logger(cmd.ErrOrStderr())
			if _, set := os.LookupEnv("GOGC"); !set {
				debug.SetGCPercent(serveGCPercent)
			}
			o.HostagentBinary = defaultHostagent(o.HostagentBinary)
			return applianced.Serve(ctx, o)
		},
	}
	cmd.Flags().StringVarP(&o.ConfigPath, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&o.StateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().StringVar(&o.HostagentBinary, "hostagent-binary", "", "hostagent executable served under /artifacts/hostagent")
	cmd.Flags().StringVar(&o.Generation, "generation", "", "generation reported by /healthz (set by appliance bootstrap)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// serveGCPercent is serve's garbage-collector target (GOGC) unless the environment sets GOGC: the heap
// may grow 50 % over live data between collections instead of Go's 100 %. Measured with
// test/bench/fleet.sh at N = 500 nodes: VmHWM 161 MiB with 100, 131 MiB with 50, for more
// collections (see the fleet row of docs/measurements.md). Most of the live heap is per connection (HTTP/2 framer
// buffers, TLS state), so the headroom, not the data, is what a fleet of nodes multiplies.
const serveGCPercent = 50
