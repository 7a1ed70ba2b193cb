package main

import (
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
	"github.com/airgap-appliance/appliance/pkg/bundlespec"
)

func newBundleSplitCommand(g *globalFlags) *cobra.Command {
	var partSize, out string
	cmd := &cobra.Command{
		Use:   "split DIR --part-size SIZE [--out PARTS_DIR]",
		Short: "Cut a finished bundle into parts of at most SIZE for removable media (bundle create --part-size does it too)",
		Long: `Writes the signed bundle DIR as one tar archive cut into PARTS_DIR/NAME.part001, .part002, … of at
most SIZE each (e.g. 4GiB, 700MB, 4.7GB; at least ` + bundlespec.MinPartSize.String() + `), each with NAME.partNNN.sha256, and the
manifest PARTS last: a split that is interrupted leaves no PARTS, and ` + "`appliance bundle join`" + ` refuses it.
Every file is checked against SHA256SUMS as it is read. Parts of an earlier split in PARTS_DIR are
removed first. Copy every file of PARTS_DIR to the media, PARTS included.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := bundlespec.ParseSize(partSize)
			if err != nil {
				return fmt.Errorf("--part-size: %w", err)
			}
			if out == "" {
				out = filepath.Clean(args[0]) + ".parts"
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			p := newByteProgress(cmd.ErrOrStderr())
			m, err := bundle.Split(ctx, args[0], out, int64(size), func(done, total int64) { p.update("splitting", done, total) })
			p.finish()
			if err != nil {
				return err
			}
			return printParts(cmd.OutOrStdout(), g, out, m)
		},
	}
	cmd.Flags().StringVar(&partSize, "part-size", "", "largest part, e.g. 4GiB, 700MB, 4.7GB (required)")
	cmd.Flags().StringVar(&out, "out", "", "directory of the parts (default DIR.parts)")
	_ = cmd.MarkFlagRequired("part-size")
	return cmd
}

// printParts reports a split: the manifest as JSON with -o json, else one line per part.
func printParts(w io.Writer, g *globalFlags, dir string, m bundle.PartsManifest) error {
	if g.output == "json" {
		return json.NewEncoder(w).Encode(map[string]any{"dir": dir, "parts": m})
	}
	fmt.Fprintf(w, "bundle %q in %d parts (%.1f MiB) in %s:\n", m.Bundle, len(m.Parts), float64(m.Size)/(1<<20), dir)
	for _, p := range m.Parts {
		fmt.Fprintf(w, "  %s  %s  %d bytes\n", p.Name, p.SHA256, p.Size)
	}
	fmt.Fprintf(w, "copy all of them with %s; rebuild with: appliance bundle join PARTS_DIR --out DIR\n", bundle.PartsFile)
	return nil
}

func newBundleJoinCommand(g *globalFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "join PARTS_DIR --out DIR",
		Short: "Rebuild a bundle from its parts (bundle split, bundle create --part-size) and verify every file",
		Long: `Reads PARTS_DIR/PARTS, checks every part's size and SHA-256 and names each damaged or missing one
before anything is extracted, then extracts the parts into DIR.tmp (only directories and regular files
inside it: no links, devices or paths leaving it), verifies the bundle (every file against SHA256SUMS,
the Debian repository chain, the OCI layout) and only then names it DIR. DIR must not exist or be
empty. The signature is not checked here: ` + "`appliance bundle verify DIR --public-key …`" + ` and bootstrap check
it with the pinned keys. A differential bundle (bundle create --since) comes back as it went, to be
imported onto its base with ` + "`appliance bundle import`" + `.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := bundle.ReadParts(args[0])
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			p := newByteProgress(cmd.ErrOrStderr())
			err = bundle.Join(ctx, args[0], out, func(done, total int64) {
				// Join counts the check of the parts, then the extraction: shown as two phases.
				if half := total / 2; done <= half {
					p.update("checking parts", done, half)
				} else {
					p.update("extracting", done-half, half)
				}
			})
			p.finish()
			if err != nil {
				return err
			}
			b, err := bundle.Open(out)
			if err != nil {
				return err
			}
			if g.output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"dir": b.Dir, "bundle": b.Meta.Name,
					"kubernetesVersion": b.Meta.KubernetesVersion, "parts": len(m.Parts), "base": b.Meta.Base})
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s: bundle %q (Kubernetes %s) joined from %d parts", b.Dir, b.Meta.Name, b.Meta.KubernetesVersion, len(m.Parts))
			if b.Meta.Base != nil {
				fmt.Fprintf(w, "; differential on top of %s: import it with `appliance bundle import %s --base BASE_DIR --out NEW_DIR`\n", b.Meta.Base, b.Dir)
			} else {
				fmt.Fprintf(w, " and verified; check its signature with `appliance bundle verify %s --public-key …`\n", b.Dir)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory of the rebuilt bundle, new or empty (required)")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

// byteProgress renders bytes done against a total for people: one live line on a terminal (at most
// ten updates a second), else a line every 10 s, at each new phase and at the end of each phase. The
// producers' done never decreases within a phase, so neither does what is shown.
type byteProgress struct {
	w            io.Writer
	tty          bool
	label        string
	start        time.Time // of the current phase
	printed      time.Time
	printedFinal bool
}

func newByteProgress(w io.Writer) *byteProgress {
	p := &byteProgress{w: w}
	if f, ok := w.(*os.File); ok {
		p.tty = term.IsTerminal(int(f.Fd()))
	}
	return p
}

func (p *byteProgress) update(label string, done, total int64) {
	now := time.Now()
	if label != p.label {
		if p.tty && p.label != "" {
			fmt.Fprintln(p.w)
		}
		p.label, p.start, p.printed, p.printedFinal = label, now, time.Time{}, false
	}
	end := done >= total
	switch {
	case end && p.printedFinal:
		return
	case !end && p.tty && now.Sub(p.printed) < 100*time.Millisecond:
		return
	case !end && !p.tty && !p.printed.IsZero() && now.Sub(p.printed) < 10*time.Second:
		return
	}
	p.printed, p.printedFinal = now, end
	rate := float64(done) / max(now.Sub(p.start).Seconds(), 0.001)
	s := fmt.Sprintf("  %s %3d%%  %.1f/%.1f MiB  %.1f MiB/s", label, done*100/max(total, 1), float64(done)/(1<<20), float64(total)/(1<<20), rate/(1<<20))
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[2K%s", s)
	} else {
		fmt.Fprintln(p.w, s)
	}
}

// finish ends the live line.
func (p *byteProgress) finish() {
	if p.tty && p.label != "" {
		fmt.Fprintln(p.w)
	}
}
