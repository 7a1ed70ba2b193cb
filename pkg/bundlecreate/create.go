// Package bundlecreate makes an air-gap bundle on the connected side (`appliance bundle create`): from a
// BundleSpecification (pkg/bundlespec) it mirrors the images from their registries into the bundle's
// OCI layout (registry.Mirror), builds the Debian repository the nodes install from (Packages), then
// finalizes the bundle: bundle.yaml and SHA256SUMS (pkg/bundle.Create) and the Ed25519 signature over
// them (pkg/bundle.Sign), in that order, last. With a part size it then splits the finished bundle
// for removable media into OUT.parts (pkg/bundle.Split), which `appliance bundle join` puts back.
//
// Resumable: the output directory is written in place. Before anything else the finalizing files
// (SHA256SUMS.sig, SHA256SUMS, bundle.yaml) are removed, so a bundle that is being made, or whose
// making was killed, never verifies; a rerun of the same command keeps every verified blob and
// downloaded package and fetches only what is missing.
package bundlecreate

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	km "github.com/airgap-appliance/appliance/kubeadm-manifests"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/bundlespec"
	"github.com/airgap-appliance/appliance/registry"
)

// ImageRepository is where kubeadm's images come from (kubeadm's default imageRepository); the
// appliance mirrors them under the same name, which nodes pull through containerd's hosts.toml.
const ImageRepository = "registry.k8s.io"

// Options are the inputs of Create.
type Options struct {
	// Spec is the defaulted, validated specification (bundlespec.Load).
	Spec *bundlespec.BundleSpecification
	// Out is the bundle directory, created if missing.
	Out string
	// Name is the bundle's name in bundle.yaml (pkg/bundle.Metadata.Name rules); empty means
	// "k8s-" + the Kubernetes version without "v".
	Name string
	// Since, when set, is the directory of the bundle this one updates (a finished, signed bundle that
	// verifies): the result is differential (bundle.Metadata.Base names it; bundle.Prune drops what it
	// holds), and the base's image blobs are linked in first so none of them is fetched again.
	Since string
	// PartSize, when not 0, splits the finished bundle for removable media into parts of at most this
	// many bytes (at least bundlespec.MinPartSize) in Out + ".parts" (bundle.Split); 0 means the
	// spec's output.partSize, and 0 there too means no parts.
	PartSize int64
	// Packages builds Out/repo/debian for the spec's packages. nil leaves the bundle without packages
	// (an images-only bundle, e.g. for an update that carries images only).
	Packages func(ctx context.Context, spec *bundlespec.BundleSpecification, repoDir string, progress func(Event)) (PackagesResult, error)
	// Progress receives every Event (serialized); nil discards them.
	Progress func(Event)
	// Log receives details for debugging, never secrets; nil discards them.
	Log *slog.Logger
	// Now is the clock for bundle.yaml's created field; nil means time.Now.
	Now func() time.Time
	// VerifiedStamp is passed to registry.Mirror: a file outside Out remembering verified blobs, so a
	// rerun hashes only what changed. Empty: every present blob is hashed.
	VerifiedStamp string
	// WrapTransport is passed to registry.Mirror (tests count requests with it).
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// NodeImage builds the node image into the bundle when the spec's nodeImage.build is set (the
	// "node-image" step, after "packages": the image installs the bundle's own packages). NodeImageStep
	// is the real one. Nil with nodeImage.build set fails Create before anything is fetched.
	NodeImage func(ctx context.Context, bundleDir string, emit func(Event)) (NodeImageResult, error)
}

// PackagesResult is what the Packages step put into the bundle.
type PackagesResult struct {
	// Packages counts the .debs in the repository; Fetched of them were downloaded by this run.
	Packages, Fetched int
	// Bytes is their total size.
	Bytes int64
}

// Event reports progress: the images' events as registry.Mirror gives them (Image set), or a step
// of the bundle (Step: "base" with Options.Since, "images", "packages", "node-image" with the spec's
// nodeImage.build, "finalize", "prune" with
// Options.Since, "parts" with a part size; Status: "started", "done", "failed", "progress" for
// "parts", with Done and Total in bytes, Done never decreasing, and "log" for "node-image": a line of
// the recipe's log in Detail).
type Event struct {
	Step   string          `json:"step"`
	Status string          `json:"status,omitempty"`
	Detail string          `json:"detail,omitempty"`
	Image  *registry.Event `json:"image,omitempty"`
	Done   int64           `json:"done,omitempty"`
	Total  int64           `json:"total,omitempty"`
}

// Result is what Create made.
type Result struct {
	Dir string
	// Images is registry.Mirror's result; Packages the Packages step's.
	Images    registry.MirrorResult
	Packages  PackagesResult
	NodeImage NodeImageResult
	// Signature names the key that signed the bundle; KeyCreated says the key was made by this run
	// (its file is the spec's signing.bundleKeyFile or the default in bundlespec.DefaultSigningDir).
	Signature  bundle.Signature
	KeyFile    string
	KeyCreated bool
	// BOM is the finished bundle's bill of materials (of the complete bundle, also when differential).
	BOM bundle.BOM
	// With Options.Since: Base names the base, Seeded counts the base's blobs linked in before
	// mirroring, Pruned what the differential bundle kept and left to its base.
	Base   *bundle.BaseRef
	Seeded bundle.SeedResult
	Pruned bundle.PruneResult
	// With a part size: PartsDir holds the parts (Dir + ".parts") that Parts lists.
	PartsDir string
	Parts    *bundle.PartsManifest
}

// Images returns every image the bundle carries for spec: kubeadm's own list for the Kubernetes
// version (kubeadm-manifests.Images, equal to `kubeadm config images list`: the control-plane images
// tagged with the version, and the CoreDNS, pause and etcd images of kubeadm of its minor from
// pkg/k8sversion's table), then images.install and images.extra, without duplicates, in that order.
// A minor outside the table is an error naming kubernetes.version.
func Images(spec *bundlespec.BundleSpecification) ([]string, error) {
	kubeadm, err := km.Images(km.Cluster{KubernetesVersion: spec.Kubernetes.Version, ImageRepository: ImageRepository})
	if err != nil {
		return nil, fmt.Errorf("kubernetes.version: %w", err)
	}
	var out []string
	for _, r := range slices.Concat(kubeadm, spec.Images.Install, spec.Images.Extra) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// Create makes (or completes) the bundle at o.Out. Errors: the first failing step's, each image's
// failure on its own line naming the image; what was fetched stays for the rerun.
func Create(ctx context.Context, o Options) (Result, error) {
	res := Result{Dir: o.Out}
	emit := func(ev Event) {
		if o.Progress != nil {
			o.Progress(ev)
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	spec := o.Spec
	partSize := o.PartSize
	if partSize == 0 {
		partSize = int64(spec.Output.PartSize)
	}
	if partSize != 0 && partSize < int64(bundlespec.MinPartSize) { // before the long work, not after it
		return res, fmt.Errorf("part size %d bytes is too small: parts hold at least %s", partSize, bundlespec.MinPartSize)
	}
	refs, err := Images(spec)
	if err != nil {
		return res, err
	}
	if spec.NodeImage.Build && o.NodeImage == nil {
		return res, errors.New("nodeImage.build is set but this bundle create has no node-image step (nodeImage.build needs the appliance command)")
	}
	var baseDir string
	if o.Since != "" {
		emit(Event{Step: "base", Status: "started", Detail: o.Since})
		if res.Base, baseDir, err = sinceBase(ctx, o.Since, o.Out); err != nil {
			emit(Event{Step: "base", Status: "failed", Detail: err.Error()})
			return res, err
		}
		emit(Event{Step: "base", Status: "done", Detail: res.Base.String()})
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return res, err
	}
	// Unfinalize first: from now until the signature is written, the directory is not a bundle.
	for _, f := range []string{bundle.SignatureFile, bundle.SumsFile, bundle.MetadataFile} {
		if err := os.Remove(filepath.Join(o.Out, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return res, err
		}
	}
	// Nor do the parts of an earlier run look like those of this one (the split's rerun removes them).
	if err := os.Remove(filepath.Join(partsDir(o.Out), bundle.PartsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, err
	}
	priv, keyFile, created, err := signingKey(spec)
	if err != nil {
		return res, err
	}
	res.KeyFile, res.KeyCreated = keyFile, created

	if baseDir != "" {
		if res.Seeded, err = bundle.SeedBlobs(o.Out, baseDir); err != nil {
			return res, err
		}
	}
	mo, err := mirrorOptions(spec)
	if err != nil {
		return res, err
	}
	mo.Log, mo.WrapTransport, mo.VerifiedStamp = o.Log, o.WrapTransport, o.VerifiedStamp
	mo.Progress = func(ev registry.Event) { emit(Event{Step: "images", Image: &ev}) }
	emit(Event{Step: "images", Status: "started", Detail: fmt.Sprintf("%d images", len(refs))})
	res.Images, err = registry.Mirror(ctx, filepath.Join(o.Out, bundle.ImagesPath), refs, mo)
	if err != nil {
		emit(Event{Step: "images", Status: "failed", Detail: err.Error()})
		return res, fmt.Errorf("images:\n%w", err)
	}
	emit(Event{Step: "images", Status: "done", Detail: fmt.Sprintf("%d images, %d blobs (%d fetched, %d reused), %.1f MiB",
		len(res.Images.Images), res.Images.Blobs, res.Images.Fetched.Blobs, res.Images.Reused.Blobs, float64(res.Images.Size)/(1<<20))})
	if baseDir != "" {
		// The base's blobs no image of this bundle uses would be listed (and trusted unread) below.
		if _, err := bundle.UnseedBlobs(o.Out, baseDir); err != nil {
			return res, err
		}
	}

	if o.Packages != nil {
		emit(Event{Step: "packages", Status: "started"})
		res.Packages, err = o.Packages(ctx, spec, filepath.Join(o.Out, filepath.FromSlash(bundle.RepoPath)), emit)
		if err != nil {
			emit(Event{Step: "packages", Status: "failed", Detail: err.Error()})
			return res, fmt.Errorf("packages: %w", err)
		}
		emit(Event{Step: "packages", Status: "done", Detail: fmt.Sprintf("%d packages (%d fetched), %.1f MiB",
			res.Packages.Packages, res.Packages.Fetched, float64(res.Packages.Bytes)/(1<<20))})
	}

	if spec.NodeImage.Build {
		emit(Event{Step: "node-image", Status: "started"})
		res.NodeImage, err = o.NodeImage(ctx, o.Out, emit)
		if err != nil {
			emit(Event{Step: "node-image", Status: "failed", Detail: err.Error()})
			return res, fmt.Errorf("nodeImage: %w", err)
		}
		emit(Event{Step: "node-image", Status: "done", Detail: res.NodeImage.String()})
	}

	emit(Event{Step: "finalize", Status: "started"})
	name := o.Name
	if name == "" {
		name = "k8s-" + strings.TrimPrefix(spec.Kubernetes.Version, "v")
	}
	meta := bundle.Metadata{APIVersion: bundle.APIVersion, Kind: bundle.Kind, Name: name,
		KubernetesVersion: spec.Kubernetes.Version, Created: o.Now().UTC().Truncate(time.Second), Base: res.Base}
	// Every blob was verified by Mirror just now (hashed as it arrived, or re-hashed/stamp-checked).
	if err := bundle.CreateWith(ctx, o.Out, meta, bundle.CreateOptions{BlobsVerified: true}); err != nil {
		return res, err
	}
	if err := bundle.Sign(o.Out, priv); err != nil {
		return res, err
	}
	b, err := bundle.Open(o.Out)
	if err != nil {
		return res, err
	}
	if res.Signature, err = b.VerifySignature([]ed25519.PublicKey{priv.Public().(ed25519.PublicKey)}); err != nil {
		return res, err
	}
	if res.BOM, err = b.BillOfMaterials(); err != nil {
		return res, err
	}
	emit(Event{Step: "finalize", Status: "done", Detail: "signed by " + res.Signature.KeyID})
	if baseDir != "" {
		if res.Pruned, err = bundle.Prune(o.Out, baseDir); err != nil {
			emit(Event{Step: "prune", Status: "failed", Detail: err.Error()})
			return res, err
		}
		emit(Event{Step: "prune", Status: "done", Detail: fmt.Sprintf("kept %d files (%.1f MiB), left %d (%.1f MiB) to the base %s",
			res.Pruned.Kept, float64(res.Pruned.KeptBytes)/(1<<20), res.Pruned.Dropped, float64(res.Pruned.DroppedBytes)/(1<<20), res.Base)})
	}
	if partSize != 0 {
		if err := splitParts(ctx, &res, partSize, emit); err != nil {
			return res, err
		}
	}
	return res, nil
}

// partsDir is where the parts of the bundle in out go: out + ".parts", beside it.
func partsDir(out string) string { return filepath.Clean(out) + ".parts" }

// splitParts is the "parts" step: bundle.Split of the finished bundle into partsDir(res.Dir), with a
// "progress" event each time another percent is written.
func splitParts(ctx context.Context, res *Result, partSize int64, emit func(Event)) error {
	res.PartsDir = partsDir(res.Dir)
	emit(Event{Step: "parts", Status: "started", Detail: fmt.Sprintf("%s, parts of at most %s", res.PartsDir, bundlespec.Size(partSize))})
	last := int64(-1)
	m, err := bundle.Split(ctx, res.Dir, res.PartsDir, partSize, func(done, total int64) {
		if pct := done * 100 / max(total, 1); pct != last {
			last = pct
			emit(Event{Step: "parts", Status: "progress", Done: done, Total: total})
		}
	})
	if err != nil {
		emit(Event{Step: "parts", Status: "failed", Detail: err.Error()})
		return fmt.Errorf("parts: %w", err)
	}
	res.Parts = &m
	emit(Event{Step: "parts", Status: "done", Detail: fmt.Sprintf("%d parts, %.1f MiB in %s", len(m.Parts), float64(m.Size)/(1<<20), res.PartsDir)})
	return nil
}

// sinceBase checks the base of a differential bundle (Options.Since) and returns the reference that
// names it and its resolved directory. The base must be a finished bundle that verifies in full and
// is signed (the signature itself is checked where the update is imported, with the pinned keys), and
// must not be out.
func sinceBase(ctx context.Context, since, out string) (*bundle.BaseRef, string, error) {
	b, err := bundle.Open(since)
	if err != nil {
		return nil, "", fmt.Errorf("since (the base bundle): %w", err)
	}
	if abs, err := filepath.Abs(out); err == nil {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		if abs == b.Dir {
			return nil, "", fmt.Errorf("since: %s is also the output directory: make the update into a new directory", b.Dir)
		}
	}
	if _, err := os.Stat(filepath.Join(b.Dir, bundle.SignatureFile)); err != nil {
		return nil, "", fmt.Errorf("since: %s: %w: the base must be a finished bundle as it was shipped (%v)", b.Dir, bundle.ErrUnsigned, err)
	}
	if _, err := b.Verify(ctx, ""); err != nil {
		return nil, "", fmt.Errorf("since: the base bundle %s does not verify (if it is differential itself, name the bundle `appliance bundle import` made from it):\n%w", b.Dir, err)
	}
	digest, err := bundle.SumsDigest(b.Dir)
	if err != nil {
		return nil, "", err
	}
	return &bundle.BaseRef{Name: b.Meta.Name, SumsDigest: digest}, b.Dir, nil
}

// signingKey is the bundle signing key: spec.signing.bundleKeyFile, or bundle-signing.pem in
// bundlespec.DefaultSigningDir, created (0600) on first use.
func signingKey(spec *bundlespec.BundleSpecification) (ed25519.PrivateKey, string, bool, error) {
	path := spec.Signing.BundleKeyFile
	if path == "" {
		dir, err := bundlespec.DefaultSigningDir()
		if err != nil {
			return nil, "", false, err
		}
		path = filepath.Join(dir, bundlespec.DefaultBundleKeyFileName)
	}
	priv, created, err := bundle.EnsureSigningKey(path)
	if err != nil {
		return nil, "", false, fmt.Errorf("signing.bundleKeyFile: %w", err)
	}
	return priv, path, created, nil
}

// mirrorOptions turns the spec's platforms and registries into registry.MirrorOptions: mirrors per
// host, every caFile added to the trusted roots (besides the system's), and credentials from the
// hosts' Docker config files, else the spec's default one, else anonymous.
func mirrorOptions(spec *bundlespec.BundleSpecification) (registry.MirrorOptions, error) {
	o := registry.MirrorOptions{Platforms: spec.Platforms, Upstreams: map[string]registry.Upstream{}}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	var chains []authn.Keychain
	for host, r := range spec.Registries.Hosts {
		o.Upstreams[strings.ToLower(host)] = registry.Upstream{Mirrors: r.Mirrors, MirrorsOnly: r.MirrorsOnly}
		if r.CAFile != "" {
			pem, err := os.ReadFile(r.CAFile)
			if err != nil {
				return o, fmt.Errorf("registries.hosts[%s].caFile: %w", host, err)
			}
			if !roots.AppendCertsFromPEM(pem) {
				return o, fmt.Errorf("registries.hosts[%s].caFile: %s holds no PEM certificate", host, r.CAFile)
			}
		}
		if f := r.Auth.DockerConfigFile; f != "" {
			kc, err := registry.DockerConfigKeychain(f)
			if err != nil {
				return o, fmt.Errorf("registries.hosts[%s].auth.dockerConfigFile: %w", host, err)
			}
			chains = append(chains, kc)
		}
	}
	if f := spec.Registries.Auth.DockerConfigFile; f != "" {
		kc, err := registry.DockerConfigKeychain(f)
		if err != nil {
			return o, fmt.Errorf("registries.auth.dockerConfigFile: %w", err)
		}
		chains = append(chains, kc)
	}
	o.RootCAs = roots
	if len(chains) > 0 {
		o.Keychain = authn.NewMultiKeychain(chains...)
	}
	return o, nil
}
