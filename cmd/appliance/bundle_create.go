package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/bundlecreate"
	"github.com/airgap-appliance/appliance/pkg/bundlespec"
	"github.com/airgap-appliance/appliance/registry"
)

func newBundleCreateCommand(g *globalFlags) *cobra.Command {
	var specPath, out, name, since, partSize string
	var imagesOnly bool
	var hostagent string
	cmd := &cobra.Command{
		Use:   "create --spec FILE --out DIR",
		Short: "Make a signed air-gap bundle from a BundleSpecification: images, packages, then finalize and sign",
		Long: `Mirrors every image the spec names (kubeadm's list for kubernetes.version, images.install,
images.extra) from its registry or mirrors into DIR/images, pinned by digest and verified as it arrives;
has apt resolve packages and extraPackages to their full dependency closure from the spec's signed apt
sources (each Release checked against its signedBy keyring) and lays them into DIR/repo/debian, signed
with signing.repoKeyFile; with nodeImage.build, builds the node image from that repository into
DIR/netboot (the recipe carried by this binary: needs root, debootstrap and the Debian mirror); then writes bundle.yaml and SHA256SUMS and signs them (SHA256SUMS.sig,
Ed25519, signing.bundleKeyFile). Keys are created on first use. apt's state and the downloaded .debs
stay in DIR.work. Killed at any moment, the same command finishes the job without fetching again what
is there; until it has finished, DIR does not verify as a bundle.

With --since OLD, DIR becomes a differential bundle on top of the bundle OLD (named in bundle.yaml by the
digest of OLD's SHA256SUMS): OLD's image blobs are reused instead of fetched, and DIR keeps only the files
OLD lacks; its SHA256SUMS and signature cover the complete bundle. The appliance loads it only through
` + "`appliance bundle import DIR --base OLD --out NEW`" + `.

With --part-size SIZE (or the spec's output.partSize), the finished bundle is also cut into DIR.parts for
removable media: parts of at most SIZE with their checksums and a PARTS manifest, put back together
with ` + "`appliance bundle join DIR.parts --out DIR`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := bundlespec.Load(specPath, bundlespec.ValidateOptions{CheckFiles: true})
			if err != nil {
				return fmt.Errorf("%s is not valid:\n%w", specPath, err)
			}
			var parts bundlespec.Size
			if partSize != "" {
				if parts, err = bundlespec.ParseSize(partSize); err != nil {
					return fmt.Errorf("--part-size: %w", err)
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			p := newCreateProgress(cmd.ErrOrStderr(), cmd.OutOrStdout(), g.output == "json")
			res, err := bundlecreate.Create(ctx, bundlecreate.Options{Spec: spec, Out: out, Name: name, Since: since,
				Packages: packagesStep(imagesOnly, out), NodeImage: bundlecreate.NodeImageStep(defaultHostagent(hostagent)), VerifiedStamp: filepath.Join(filepath.Clean(out)+".work", "verified-blobs.json"),
				PartSize: int64(parts), Progress: p.event, Log: g.logger(cmd.ErrOrStderr())})
			p.finish()
			if err != nil {
				return err
			}
			if g.output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"dir": res.Dir, "signedBy": res.Signature.KeyID,
					"publicKey": res.Signature.PublicKey, "bom": res.BOM, "base": res.Base, "partsDir": res.PartsDir, "parts": res.Parts})
			}
			w := cmd.ErrOrStderr()
			fmt.Fprintf(w, "\nbundle %s: %d images (%d blobs fetched, %d reused), %d packages (%d downloaded)\n", res.Dir, len(res.BOM.Images),
				res.Images.Fetched.Blobs, res.Images.Reused.Blobs, res.Packages.Packages, res.Packages.Fetched)
			if res.Base != nil {
				fmt.Fprintf(w, "differential on top of %s: holds %d files (%.1f MiB), leaves %d (%.1f MiB) to the base\n", res.Base,
					res.Pruned.Kept, float64(res.Pruned.KeptBytes)/(1<<20), res.Pruned.Dropped, float64(res.Pruned.DroppedBytes)/(1<<20))
			}
			if res.Parts != nil {
				fmt.Fprintf(w, "%d parts of at most %s in %s (copy all of them with %s; rebuild with appliance bundle join)\n",
					len(res.Parts.Parts), bundlespec.Size(res.Parts.PartSize), res.PartsDir, bundle.PartsFile)
			}
			fmt.Fprintf(w, "signed by %s with %s%s\n", res.Signature.KeyID, res.KeyFile, map[bool]string{true: " (created now: back it up)", false: ""}[res.KeyCreated])
			fmt.Fprintf(w, "pin it in bootstrap.yaml:\n  bundle:\n    publicKeys: [%q]\n", res.Signature.PublicKey)
			return nil
		},
	}
	cmd.Flags().StringVar(&specPath, "spec", "", "BundleSpecification file (required)")
	cmd.Flags().StringVar(&out, "out", "", "bundle directory, created or completed (required)")
	cmd.Flags().StringVar(&name, "name", "", "bundle name in bundle.yaml (default k8s-<version>)")
	cmd.Flags().BoolVar(&imagesOnly, "images-only", false, "carry images only, no Debian repository (nodes must then get their packages elsewhere; for registry-only use and the benchmarks)")
	cmd.Flags().StringVar(&partSize, "part-size", "", "also cut the finished bundle into DIR.parts of at most this size for removable media, e.g. 4GiB (overrides output.partSize)")
	cmd.Flags().StringVar(&since, "since", "", "make a differential bundle: only what the finished bundle in this directory lacks")
	cmd.Flags().StringVar(&hostagent, "hostagent", "", "the hostagent binary the node image carries (nodeImage.build; default: hostagent beside the appliance executable)")
	_ = cmd.MarkFlagRequired("spec")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

// packagesStep is bundle create's Packages step: none for --images-only, else apt with its state and
// the downloaded .debs in OUT.work.
func packagesStep(imagesOnly bool, out string) func(context.Context, *bundlespec.BundleSpecification, string, func(bundlecreate.Event)) (bundlecreate.PackagesResult, error) {
	if imagesOnly {
		return nil
	}
	return bundlecreate.DebianPackages(filepath.Clean(out) + ".work")
}

// createProgress renders bundle create's events: one live line on a terminal (images done, bytes,
// blobs, rate, ETA), plain lines otherwise (each step and image, and a progress line every 10 s), or
// every event as a JSON line.
type createProgress struct {
	w, jsonOut     io.Writer
	tty, json      bool
	start, printed time.Time
	images, done   int
	total, got     int64 // bytes of every resolved image; bytes in place (fetched or reused)
	fetched        int64
	blobs, blobsOK int
	inflight       map[string]int64 // blob digest → bytes received so far
	bytes          *byteProgress    // the "parts" step's progress
}

func newCreateProgress(w, jsonOut io.Writer, jsonEvents bool) *createProgress {
	p := &createProgress{w: w, jsonOut: jsonOut, json: jsonEvents, start: time.Now(), inflight: map[string]int64{}}
	if f, ok := w.(*os.File); ok {
		p.tty = term.IsTerminal(int(f.Fd()))
	}
	return p
}

func (p *createProgress) event(ev bundlecreate.Event) {
	if p.json {
		_ = json.NewEncoder(p.jsonOut).Encode(ev)
		return
	}
	if ev.Status == "progress" {
		if p.bytes == nil {
			p.bytes = &byteProgress{w: p.w, tty: p.tty}
		}
		p.bytes.update(ev.Step, ev.Done, ev.Total)
		return
	}
	if ev.Status == "log" {
		p.clear()
		fmt.Fprintf(p.w, "  %s\n", ev.Detail)
		return
	}
	if ev.Image == nil {
		p.clear()
		fmt.Fprintf(p.w, "%s: %s %s\n", ev.Step, ev.Status, ev.Detail)
		return
	}
	im := ev.Image
	switch im.Kind {
	case registry.EventImageStart:
		p.images++
	case registry.EventImageResolved:
		p.total += im.Size
		p.blobs += im.Blobs
	case registry.EventBlobReused:
		p.got += im.Size
		p.blobsOK++
	case registry.EventBlobProgress:
		p.inflight[im.Digest] = im.Done
	case registry.EventBlobFetched:
		delete(p.inflight, im.Digest)
		p.got += im.Size
		p.fetched += im.Size
		p.blobsOK++
	case registry.EventRetry:
		p.clear()
		fmt.Fprintf(p.w, "  retry %s in %s: %s\n", im.Ref, im.Delay.Round(time.Millisecond), im.Error)
	case registry.EventImageDone:
		p.done++
		if !p.tty {
			status := "ok"
			if im.Error != "" {
				status = "FAILED: " + im.Error
			}
			fmt.Fprintf(p.w, "  %s %s %.1f MiB %s\n", im.Ref, im.Digest, float64(im.Size)/(1<<20), status)
		}
	}
	if p.tty || time.Since(p.printed) > 10*time.Second {
		p.line()
	}
}

// line prints the aggregate: images, bytes, blobs, rate of bytes fetched, ETA.
func (p *createProgress) line() {
	p.printed = time.Now()
	got := p.got
	for _, n := range p.inflight {
		got += n
	}
	secs := time.Since(p.start).Seconds()
	rate := float64(p.fetched) / max(secs, 0.001)
	eta := "-"
	if rate > 0 && p.total > got {
		eta = (time.Duration(float64(p.total-got)/rate) * time.Second).Round(time.Second).String()
	}
	s := fmt.Sprintf("  images %d/%d  %.1f/%.1f MiB  blobs %d/%d  %.1f MiB/s  ETA %s",
		p.done, p.images, float64(got)/(1<<20), float64(p.total)/(1<<20), p.blobsOK, p.blobs, rate/(1<<20), eta)
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[2K%s", s)
	} else {
		fmt.Fprintln(p.w, s)
	}
}

func (p *createProgress) clear() {
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[2K")
	}
}

func (p *createProgress) finish() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
