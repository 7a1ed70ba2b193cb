package bootstrap

import (
	"context"
	"fmt"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/registry"
)

// bundlePhase verifies every file of the air-gap bundle against its checksums (cached by file
// identity, so a rerun re-hashes nothing unchanged) and makes its images pullable by linking the OCI
// layout's blobs into the registry's storage, never copying bytes where a link will do. Verification
// comes first: nothing of a bundle that fails it becomes servable.
type bundlePhase struct{}

func (bundlePhase) Name() string { return "bundle" }

func (bundlePhase) Run(ctx context.Context, st *State) (Result, error) {
	// The VRRP pre-flight only listens (3 s) while this phase hashes: run it now for the serve phase.
	startVIPPreflight(ctx, st)
	b, err := bundle.Open(st.Config.Bundle.Path)
	if err != nil {
		return Result{}, fmt.Errorf("bundle.path: %w", err)
	}
	// The signature first: nothing of a bundle its maker did not sign is read further.
	keys, err := st.Config.Bundle.TrustedKeys()
	if err != nil {
		return Result{}, err
	}
	sig, err := b.VerifySignature(keys)
	if err != nil {
		return Result{}, fmt.Errorf("bundle.path: %w", err)
	}
	signed := "signed by " + sig.KeyID
	if st.Options.DryRun {
		// Verify without the stamp (which it would rewrite) and check the registry without linking.
		vr, err := b.Verify(ctx, "")
		if err != nil {
			return Result{}, err
		}
		ir, ok, err := registry.Check(b.ImagesDir(), statedir.Registry(st.StateDir))
		if err != nil {
			return Result{}, err
		}
		self, img, selfOK, err := applianceImage(ctx, st, true)
		if err != nil {
			return Result{}, err
		}
		st.ApplianceImage = img
		ir = mergeImports(ir, self)
		ok = ok && selfOK
		st.Images = ir
		detail := fmt.Sprintf("%s, verified %d files (%s), %d images from %d registries", signed, vr.Files, humanBytes(vr.Bytes), len(ir.Images), len(ir.Registries))
		if ok {
			return Result{Detail: detail + " already pullable"}, nil
		}
		return Result{Changed: true, Detail: detail + " would be made pullable"}, nil
	}
	vr, err := b.Verify(ctx, statedir.BundleVerifyStamp(st.StateDir))
	if err != nil {
		return Result{}, err
	}
	ir, err := registry.Import(ctx, b.ImagesDir(), statedir.Registry(st.StateDir), st.Options.Logger)
	if err != nil {
		return Result{}, err
	}
	// The links Import makes change the blobs' ctime; the stamp does not key hard-linked files on
	// ctime (bundle.Verify), so the next run hashes nothing unchanged without a second Verify here.
	// The appliance's own executable as an image, beside the bundle's (the hand-off runs it).
	self, img, _, err := applianceImage(ctx, st, false)
	if err != nil {
		return Result{}, fmt.Errorf("the appliance image: %w", err)
	}
	st.ApplianceImage = img
	ir = mergeImports(ir, self)
	st.Images = ir
	return Result{
		Changed: vr.Changed || ir.Changed,
		Detail: fmt.Sprintf("%s, verified %d files (%s; %d hashed, %d unchanged since last check), %d images pullable from %d registries (%d blobs: %d linked, %d copied)",
			signed, vr.Files, humanBytes(vr.Bytes), vr.Hashed, vr.Cached, len(ir.Images), len(ir.Registries), ir.Blobs, ir.Linked, ir.Copied),
	}, nil
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Load, for a skipped bundle phase: the registries the registry storage already serves
// (registry.Check, read-only), which render needs for the nodes' mirrors.
func (bundlePhase) Load(ctx context.Context, st *State) error {
	b, err := bundle.Open(st.Config.Bundle.Path)
	if err != nil {
		return fmt.Errorf("bundle.path: %w", err)
	}
	ir, _, err := registry.Check(b.ImagesDir(), statedir.Registry(st.StateDir))
	if err != nil {
		return err
	}
	self, img, _, err := applianceImage(ctx, st, true)
	if err != nil {
		return err
	}
	st.ApplianceImage = img
	st.Images = mergeImports(ir, self)
	return nil
}
