package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
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
		ListenTLS:    ":" + strconv.Itoa(ingressrouter.TLSListenPort),
		IngressClass: ingressrouter.DefaultIngressClass,
		DrainDelay:   ingressrouter.DefaultDrainDelay,
	}
	var status string
	cmd := &cobra.Command{
		Use:    "ingress-router --kubeconfig FILE|in-cluster",
		Short:  "Route HTTP to Services by the cluster's Ingresses (the ingress controller's DaemonSet runs it)",
		Hidden: true,
		Long: `Runs until SIGTERM. Watches networking.k8s.io/v1 Ingresses of --ingress-class (and of every
IngressClass whose controller is ` + ingressrouter.ControllerName + `; Ingresses without a class when
such a class is the default), their Services and EndpointSlices, and proxies HTTP on --listen to the
ready endpoints, round robin; HTTPS on --listen-tls, terminated with the certificate of the
Ingresses' spec.tls for the client's server name (SNI; none: the handshake fails). Unknown host or
path: 404; a Service without a ready endpoint: 503.
--health-listen serves ` + ingressrouter.HealthPath + `: 200 once synced with the API server, else 503;
after SIGTERM it answers 503 for --drain-delay while requests are still proxied, then the router stops.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if o.Kubeconfig == "" {
				errs = append(errs, fmt.Errorf("--%s: required (a kubeconfig file, or %q)", ingressrouter.FlagKubeconfig, ingressrouter.InCluster))
			}
			listens := []struct{ flag, addr string }{{ingressrouter.FlagListen, o.Listen}, {ingressrouter.FlagHealthListen, o.HealthListen}}
			if o.ListenTLS != "" {
				listens = append(listens, struct{ flag, addr string }{ingressrouter.FlagListenTLS, o.ListenTLS})
			}
			for i, l := range listens {
				if _, _, err := net.SplitHostPort(l.addr); err != nil {
					errs = append(errs, fmt.Errorf("--%s: %q is not [HOST]:PORT", l.flag, l.addr))
				}
				for _, m := range listens[:i] {
					if _, port, _ := net.SplitHostPort(l.addr); l.addr == m.addr && port != "0" {
						errs = append(errs, fmt.Errorf("--%s and --%s: both %q; give different ports", m.flag, l.flag, l.addr))
					}
				}
			}
			if o.IngressClass == "" {
				errs = append(errs, fmt.Errorf("--%s: empty; give the IngressClass name (default %q)", ingressrouter.FlagIngressClass, ingressrouter.DefaultIngressClass))
			}
			if o.DrainDelay < 0 {
				errs = append(errs, fmt.Errorf("--%s: %s is negative; give 0 to stop at once", ingressrouter.FlagDrainDelay, o.DrainDelay))
			}
			if status != "" {
				a, err := netip.ParseAddr(status)
				if err != nil {
					errs = append(errs, fmt.Errorf("--%s: %q is not an IP address (give the ingress VIP)", ingressrouter.FlagStatusAddress, status))
				}
				o.StatusAddress = a
			}
			if err := errors.Join(errs...); err != nil {
				return err
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
	f.StringVar(&o.ListenTLS, ingressrouter.FlagListenTLS, o.ListenTLS, "address:port to serve HTTPS on, with the certificates of the Ingresses' spec.tls (by SNI); empty: no HTTPS")
	f.StringVar(&o.HealthListen, ingressrouter.FlagHealthListen, o.HealthListen, "address:port of the health endpoint "+ingressrouter.HealthPath)
	f.StringVar(&o.IngressClass, ingressrouter.FlagIngressClass, o.IngressClass, "name of the IngressClass to serve")
	f.DurationVar(&o.DrainDelay, ingressrouter.FlagDrainDelay, o.DrainDelay, "after SIGTERM, keep proxying this long while "+ingressrouter.HealthPath+" answers 503, so the balancer in front stops first")
	f.StringVar(&status, ingressrouter.FlagStatusAddress, "", "IP written into served Ingresses' status.loadBalancer.ingress (the ingress VIP); empty: status untouched")
	return cmd
}
