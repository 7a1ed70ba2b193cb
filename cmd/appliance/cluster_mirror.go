package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/clustermirror"
)

// Defaults of `appliance cluster-mirror`.
const (
	defaultClusterMirrorDir    = "/var/lib/appliance-mirror"
	defaultClusterMirrorListen = ":5443"
)

// newClusterMirrorCommand is `appliance cluster-mirror`: the in-cluster registry mirror and package
// repository that a control plane runs as a kubelet static pod after `appliance handoff`.
func newClusterMirrorCommand(g *globalFlags) *cobra.Command {
	o := clustermirror.Options{Dir: defaultClusterMirrorDir, Listen: defaultClusterMirrorListen}
	cmd := &cobra.Command{
		Use:    "cluster-mirror --upstream URL --ca-file FILE --cert-file FILE --key-file FILE",
		Short:  "Copy the appliance's registry and package repo to this control plane once, then serve them (hand-off static pod)",
		Hidden: true,
		Long: `Runs until SIGTERM, as a kubelet static pod on every control plane after the hand-off. It copies
every image of the appliance's registry (--upstream /v2/, each blob checked against its digest) and the
signed package repository (/repo/, each file checked against its index, the signed metadata kept as
is) into --dir once, then serves them over HTTPS on --listen under the same paths (/v2/, /repo/,
/ca.crt), so nodes switch by changing host:port only. /healthz answers 503 with what is missing until
the copy is complete, then 200 with {synced, images, blobs, debs, bytes}. A killed copy resumes; once
complete, the appliance is never contacted again (it may be switched off). Delete DIR/synced.json to
copy again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			level := slog.LevelInfo // a pod's log: progress belongs in it
			if g.verbose {
				level = slog.LevelDebug
			}
			hopts := &slog.HandlerOptions{Level: level}
			if g.output == outputJSON {
				o.Log = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopts))
			} else {
				o.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopts))
			}
			return clustermirror.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Upstream, "upstream", "", "the appliance's HTTPS base URL, e.g. https://10.100.0.2:8443 (required)")
	f.StringVar(&o.CAFile, "ca-file", "", "PEM of the appliance CA: the only CA trusted for --upstream, and the CA of --cert-file (required)")
	f.StringVar(&o.Dir, "dir", o.Dir, "data directory for the copy (created 0755)")
	f.StringVar(&o.Listen, "listen", o.Listen, "address:port to serve HTTPS on")
	f.StringVar(&o.CertFile, "cert-file", "", "serving certificate (PEM) signed by the appliance CA, SANs = this node's addresses (required)")
	f.StringVar(&o.KeyFile, "key-file", "", "private key (PEM) of --cert-file (required)")
	f.StringVar(&o.ImagesFile, "images-file", "", "JSON array of image references to copy besides those the upstream's tags list (images named by digest only)")
	return cmd
}
