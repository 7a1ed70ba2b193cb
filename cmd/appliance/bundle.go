package main

import (
	"cmp"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/bundle"
)

func newBundleCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Make, check and inspect air-gap bundles",
	}
	cmd.AddCommand(newBundleCreateCommand(g), newBundleVerifyCommand(), newBundleInspectCommand(g), newBundleImportCommand(),
		newBundleSplitCommand(g), newBundleJoinCommand(g))
	return cmd
}

// trustedKeys reads --public-key values and --public-key-file files.
func trustedKeys(keys, files []string) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for _, k := range keys {
		pub, err := bundle.ParsePublicKey(k)
		if err != nil {
			return nil, fmt.Errorf("--public-key: %w", err)
		}
		out = append(out, pub)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--public-key-file: %w", err)
		}
		pub, err := bundle.ParsePublicKey(string(data))
		if err != nil {
			return nil, fmt.Errorf("--public-key-file %s: %w", f, err)
		}
		out = append(out, pub)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no trusted key: pass --public-key ed25519:… or --public-key-file FILE (the bundle maker's public key); an unsigned bundle is never accepted")
	}
	return out, nil
}

func newBundleVerifyCommand() *cobra.Command {
	var keys, files []string
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Check a bundle's signature and every file, the Debian repository chain and the OCI layout (what bootstrap checks)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			trusted, err := trustedKeys(keys, files)
			if err != nil {
				return err
			}
			b, err := bundle.Open(args[0])
			if err != nil {
				return err
			}
			sig, err := b.VerifySignature(trusted)
			if err != nil {
				return err
			}
			res, err := b.Verify(cmd.Context(), "")
			if err != nil {
				return fmt.Errorf("%s does not verify:\n%w", b.Dir, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: bundle %q (Kubernetes %s) signed by %s, %d files (%.1f MiB) verified\n",
				b.Dir, b.Meta.Name, b.Meta.KubernetesVersion, sig.KeyID, res.Files, float64(res.Bytes)/(1<<20))
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&keys, "public-key", nil, "trusted bundle key, ed25519:<base64> (repeatable)")
	cmd.Flags().StringSliceVar(&files, "public-key-file", nil, "file holding a trusted bundle key (repeatable)")
	return cmd
}

func newBundleInspectCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect DIR",
		Short: "Print a bundle's bill of materials: every image (reference, digest, platforms, size) and package (name, version, sha256)",
		Long: `Prints what the bundle carries, read from its own metadata. It does not check integrity or the
signature: use ` + "`appliance bundle verify`" + ` for that. With -o json the whole bill of materials is one JSON document.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := bundle.Open(args[0])
			if err != nil {
				return err
			}
			bom, err := b.BillOfMaterials()
			if err != nil {
				return err
			}
			if g.output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(bom)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			signed := "UNSIGNED"
			if bom.SignedBy != "" {
				signed = "key " + bom.SignedBy + " (not checked here: appliance bundle verify)"
			}
			fmt.Fprintf(w, "bundle\t%s\nkubernetes\t%s\ncreated\t%s\nsigned by\t%s\n", bom.Name, bom.KubernetesVersion, bom.Created, signed)
			if bom.Base != nil {
				fmt.Fprintf(w, "base\t%s (an update of it: until imported onto it with `appliance bundle import`, only what it adds is listed)\n", bom.Base)
			}
			fmt.Fprintln(w)
			fmt.Fprintf(w, "IMAGE\tDIGEST\tPLATFORMS\tSIZE\n")
			for _, im := range bom.Images {
				fmt.Fprintf(w, "%s\t%s\t%s\t%.1f MiB\n", im.Ref, im.Digest, strings.Join(im.Platforms, ","), float64(im.Size)/(1<<20))
			}
			fmt.Fprintf(w, "\nPACKAGE\tVERSION\tARCH\tSHA256\tSIZE\tFROM\n")
			for _, p := range bom.Packages {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d KiB\t%s\n", p.Name, p.Version, p.Architecture, p.SHA256, p.Size/1024, cmp.Or(p.Origin, "-"))
			}
			fmt.Fprintf(w, "\n%d images, %d packages\n", len(bom.Images), len(bom.Packages))
			return w.Flush()
		},
	}
}
