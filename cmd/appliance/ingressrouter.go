package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/ingressrouter"
)

// newIngressRouterCommand is `appliance ingress-router`: the cluster's ingress controller, run by
// the DaemonSet ingressrouter.Manifest renders (the appliance image, host network).
func newIngressRouterCommand(g *globalFlags) *cobra.Command {
	o := ingressrouter.Options{
		Listen:       ":" + strconv.Itoa(ingressrouter.ListenPort),
		HealthListen: ":" + strconv.Itoa(ingressrouter.HealthPort),
		IngressClass: ingressrouter.DefaultIngressClass,
	}
	var status string
	cmd := &cobra.Command{
		Use:    "ingress-router --kubeconfig FILE|in-cluster",
		Short:  "Route HTTP to Services by the cluster's Ingresses (the ingress controller's DaemonSet runs it)",
		Hidden: true,
		Long: `Runs until SIGTERM. Watches networking.k8s.io/v1 Ingresses of --ingress-class (and of every
IngressClass whose controller is ` + ingressrouter.ControllerName + `; Ingresses without a class when
such a class is the default), their Services and EndpointSlices, and proxies HTTP on --listen to the
ready endpoints, round robin. Unknown host or path: 404; a Service without a ready endpoint: 503.
--health-listen serves ` + ingressrouter.HealthPath + `: 200 once synced with the API server, else 503.
TLS (443) is not terminated.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" {
				a, err := netip.ParseAddr(status)
				if err != nil {
					return fmt.Errorf("--%s %q: give an IP address (the ingress VIP): %w", ingressrouter.FlagStatusAddress, status, err)
				}
				o.StatusAddress = a
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
			return ingressrouter.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, ingressrouter.FlagKubeconfig, "", `kubeconfig file, or "`+ingressrouter.InCluster+`" for the pod's service account (required)`)
	f.StringVar(&o.Listen, ingressrouter.FlagListen, o.Listen, "address:port to serve HTTP on")
	f.StringVar(&o.HealthListen, ingressrouter.FlagHealthListen, o.HealthListen, "address:port of the health endpoint "+ingressrouter.HealthPath)
	f.StringVar(&o.IngressClass, ingressrouter.FlagIngressClass, o.IngressClass, "name of the IngressClass to serve")
	f.StringVar(&status, ingressrouter.FlagStatusAddress, "", "IP written into served Ingresses' status.loadBalancer.ingress (the ingress VIP); empty: status untouched")
	_ = cmd.MarkFlagRequired(ingressrouter.FlagKubeconfig)
	return cmd
}
