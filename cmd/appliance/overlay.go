package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/overlay"
)

// newOverlayCommand is `appliance overlay`: the pod network of networks.cni flannel on one node,
// run by the DaemonSet overlay.Manifest renders (the appliance image, host network, NET_ADMIN).
func newOverlayCommand(g *globalFlags) *cobra.Command {
	o := overlay.Options{VNI: config.VXLANVNI, Port: config.VXLANPort, StateDir: overlay.StateDir}
	var network string
	var cidrs []string
	cmd := &cobra.Command{
		Use:   "overlay",
		Short: "Run the cluster's VXLAN pod network on this node (flannel's VXLAN backend; the appliance-overlay DaemonSet runs it)",
		Long: `Run flannel's VXLAN backend with flannel's Kubernetes subnet manager on this node until SIGTERM:
the node's VXLAN endpoint is its first IPv4 address inside --public-cidrs (tried in order), its pod
range is its spec.podCIDR, and every other node's pod range is routed over flannel.<vni> to that
node's endpoint (UDP --port). Only the net-conf.json flannel reads is written, in --state-dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if o.NodeName == "" {
				// NODE_NAME is read here, not as the flag's default, so that the help (and the
				// reference pages generated from it) does not depend on the environment.
				o.NodeName = os.Getenv("NODE_NAME")
			}
			if o.NodeName == "" {
				errs = append(errs, fmt.Errorf("--%s: required (or NODE_NAME): this node's Kubernetes name", overlay.FlagNodeName))
			}
			p, err := netip.ParsePrefix(network)
			if err != nil || p != p.Masked() || !p.Addr().Is4() {
				errs = append(errs, fmt.Errorf("--%s: %q is not an IPv4 network CIDR: give networks.pods, e.g. 10.244.0.0/16", overlay.FlagNetwork, network))
			}
			o.Network = p
			o.PublicCIDRs = nil
			for _, c := range cidrs {
				p, err := netip.ParsePrefix(c)
				if err != nil || p != p.Masked() {
					errs = append(errs, fmt.Errorf("--%s: %q is not a network CIDR: give networks.workloadPlane.cidrs, e.g. 10.200.0.0/24", overlay.FlagPublicCIDRs, c))
					continue
				}
				o.PublicCIDRs = append(o.PublicCIDRs, p)
			}
			if len(errs) > 0 {
				return errors.Join(errs...)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			level := slog.LevelInfo // a pod's log
			if g.verbose {
				level = slog.LevelDebug
			}
			hopts := &slog.HandlerOptions{Level: level}
			if g.output == outputJSON {
				o.Log = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopts))
			} else {
				o.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopts))
			}
			return overlay.Run(ctx, o)
		},
	}
	cmd.AddCommand(newOverlayReadyCommand())
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, overlay.FlagKubeconfig, "", "kubeconfig file; empty: the pod's service account")
	f.StringVar(&o.NodeName, overlay.FlagNodeName, o.NodeName, "this node's Kubernetes name (default $NODE_NAME)")
	f.StringVar(&network, overlay.FlagNetwork, "", "the cluster's IPv4 pod network (networks.pods); every node's spec.podCIDR lies inside it (required)")
	f.StringSliceVar(&cidrs, overlay.FlagPublicCIDRs, nil, "the workload-plane CIDRs in order (networks.workloadPlane.cidrs): the VXLAN endpoint is the first local IPv4 address inside them (required)")
	f.IntVar(&o.VNI, overlay.FlagVNI, o.VNI, "VXLAN network identifier (device flannel.<vni>)")
	f.IntVar(&o.Port, overlay.FlagPort, o.Port, "VXLAN UDP port (4789: IANA's, RFC 7348 §5)")
	f.IntVar(&o.MTU, overlay.FlagMTU, 0, "the workload-plane link MTU; flannel.<vni> gets 50 bytes less (0: the interface's MTU)")
	f.StringVarP(&o.StateDir, overlay.FlagStateDir, "s", o.StateDir, "directory of flannel's net-conf.json")
	f.StringVar(&o.PublicAddressesFile, overlay.FlagPublicAddrs, "", "JSON file of node name → workload-plane address (the appliance's): this node's VXLAN endpoint when listed; else the first local address inside --public-cidrs")
	f.StringVar(&o.PodRangesFile, overlay.FlagPodRanges, "", "JSON file of node name → pod range (the appliance's assignment): this node's spec.podCIDR is set from it when empty; empty: spec.podCIDR as found")
	return cmd
}

// newOverlayReadyCommand is `appliance overlay ready`: the overlay DaemonSet's readiness probe.
func newOverlayReadyCommand() *cobra.Command {
	dir := overlay.StateDir
	cmd := &cobra.Command{
		Use:   "ready",
		Short: "Exit 0 once the overlay running with --state-dir has registered this node (the DaemonSet's readiness probe)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return overlay.Ready(dir)
		},
	}
	cmd.Flags().StringVarP(&dir, overlay.FlagStateDir, "s", dir, "the overlay's state directory")
	return cmd
}
