package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/bundle"
)

func newBundleImportCommand() *cobra.Command {
	var base, out string
	var keys, files []string
	cmd := &cobra.Command{
		Use:   "import DIFF --base BASE --out DIR",
		Short: "Make the complete bundle from a differential bundle and the bundle it updates (the one the appliance serves)",
		Long: `DIFF is a differential bundle (` + "`appliance bundle create --since`" + `): its bundle.yaml names its base by
the digest of the base's SHA256SUMS, and it holds only the files the base lacks. Import checks DIFF's
signature with the trusted keys, checks that BASE is that base, builds DIR from DIFF's files and BASE's
(hard links where the filesystem allows, else copies), verifies every file of the result and its
signature, and only then names it DIR. DIR must not exist or be empty; BASE is not changed. Point
bundle.path at DIR and run bootstrap again to serve it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			trusted, err := trustedKeys(keys, files)
			if err != nil {
				return err
			}
			diff, err := bundle.Open(args[0])
			if err != nil {
				return err
			}
			// The signature first: nothing of an update its maker did not sign is used.
			if _, err := diff.VerifySignature(trusted); err != nil {
				return err
			}
			res, err := bundle.Import(cmd.Context(), diff.Dir, base, out)
			if err != nil {
				return err
			}
			merged, err := bundle.Open(res.Dir)
			if err != nil {
				return err
			}
			sig, err := merged.VerifySignature(trusted)
			if err != nil {
				return fmt.Errorf("%s was imported but its signature does not verify: %w", res.Dir, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: bundle %q (Kubernetes %s) signed by %s, %d files (%.1f MiB) verified: %d from %s (%.1f MiB), %d from the base %s (%.1f MiB); %d linked, %d copied\n",
				res.Dir, merged.Meta.Name, merged.Meta.KubernetesVersion, sig.KeyID, res.Verify.Files, float64(res.Verify.Bytes)/(1<<20),
				res.FromDiff, diff.Dir, float64(res.DiffBytes)/(1<<20), res.FromBase, merged.Meta.Base, float64(res.BaseBytes)/(1<<20), res.Linked, res.Copied)
			return nil
		},
	}
	cmd.Flags().StringVar(&base, "base", "", "directory of the bundle DIFF updates, e.g. the one bundle.path names (required)")
	cmd.Flags().StringVar(&out, "out", "", "directory of the complete bundle, new or empty (required)")
	cmd.Flags().StringSliceVar(&keys, "public-key", nil, "trusted bundle key, ed25519:<base64> (repeatable)")
	cmd.Flags().StringSliceVar(&files, "public-key-file", nil, "file holding a trusted bundle key (repeatable)")
	_ = cmd.MarkFlagRequired("base")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}
