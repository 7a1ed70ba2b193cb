package bundlecreate

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/bundlespec"
	"github.com/airgap-appliance/appliance/pkg/k8sversion"
	"github.com/airgap-appliance/appliance/registry"
	"github.com/airgap-appliance/appliance/test/upstream"
)

// labSpec is a spec whose registry.k8s.io images come from a real local upstream registry (Debian's
// docker-registry with TLS and basic auth) configured as registry.k8s.io's only mirror (mirrorsOnly:
// the test never contacts the real registry.k8s.io, nor looks its name up).
func labSpec(t *testing.T, up *upstream.Registry) *bundlespec.BundleSpecification {
	t.Helper()
	spec := bundlespec.Example()
	spec.Images.Install, spec.Images.Extra = nil, []string{"registry.k8s.io/extra/tool:1.0"}
	spec.Registries = bundlespec.Registries{Hosts: map[string]bundlespec.Registry{
		"registry.k8s.io": {Mirrors: []string{"https://" + up.Host}, MirrorsOnly: true, CAFile: up.CAFile,
			Auth: bundlespec.RegistryAuth{DockerConfigFile: up.DockerConfig(t, up.Password)}},
	}}
	spec.Signing.BundleKeyFile = filepath.Join(t.TempDir(), "keys", "bundle.pem")
	spec.Output = bundlespec.Output{} // no parts (TestCreateParts splits)
	// No node image: a Debian system built with debootstrap, the fixture bundle's (and test/nodeimage's);
	// TestNodeImageNeedsStep checks the refusal without a step.
	spec.NodeImage = bundlespec.NodeImage{}
	bundlespec.SetDefaults(spec)
	return spec
}

// pushAll pushes a small random image for every image the spec needs, under the repository path the
// mirror is asked for (registry.k8s.io/kube-apiserver → kube-apiserver).
func pushAll(t *testing.T, up *upstream.Registry, spec *bundlespec.BundleSpecification) []string {
	t.Helper()
	refs, err := Images(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		img, err := random.Image(1024, 2)
		if err != nil {
			t.Fatal(err)
		}
		up.Push(t, strings.TrimPrefix(r, "registry.k8s.io/"), img)
	}
	return refs
}

type countingTransport struct {
	next  http.RoundTripper
	blobs *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
		c.blobs.Add(1)
	}
	return c.next.RoundTrip(r)
}

func TestCreateImagesSignedAndResumable(t *testing.T) {
	up := upstream.Start(t, upstream.Options{})
	spec := labSpec(t, up)
	refs := pushAll(t, up, spec)
	if len(refs) != 8 || refs[0] != "registry.k8s.io/kube-apiserver:"+spec.Kubernetes.Version {
		t.Fatalf("images %v: want kubeadm's seven and the extra one", refs)
	}
	out := filepath.Join(t.TempDir(), "bundle")
	var blobGets atomic.Int64
	var events []Event
	o := Options{Spec: spec, Out: out,
		Progress:      func(ev Event) { events = append(events, ev) },
		WrapTransport: func(next http.RoundTripper) http.RoundTripper { return countingTransport{next, &blobGets} }}
	res, err := Create(context.Background(), o)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !res.KeyCreated || len(res.BOM.Images) != 8 || res.BOM.SignedBy != res.Signature.KeyID {
		t.Fatalf("result: key created %v, %d images, signed by %q (%q)", res.KeyCreated, len(res.BOM.Images), res.BOM.SignedBy, res.Signature.KeyID)
	}
	// What bootstrap checks: the signature under the maker's key, then every file.
	priv, _, err := bundle.EnsureSigningKey(spec.Signing.BundleKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.VerifySignature([]ed25519.PublicKey{priv.Public().(ed25519.PublicKey)}); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if _, err := b.Verify(context.Background(), ""); err != nil {
		t.Fatalf("bundle does not verify: %v", err)
	}
	// The appliance can serve it.
	if _, err := registry.Import(context.Background(), b.ImagesDir(), t.TempDir(), nil); err != nil {
		t.Fatalf("registry.Import: %v", err)
	}
	if got := blobGets.Load(); got == 0 {
		t.Fatal("no blob was fetched")
	}
	var sawDone bool
	for _, ev := range events {
		sawDone = sawDone || (ev.Step == "finalize" && ev.Status == "done")
	}
	if !sawDone {
		t.Error("no finalize done event")
	}

	// A rerun with nothing new fetches no blob and gives the same bundle content.
	blobGets.Store(0)
	res2, err := Create(context.Background(), o)
	if err != nil {
		t.Fatalf("rerun: %v", err)
	}
	if got := blobGets.Load(); got != 0 || res2.Images.Fetched.Blobs != 0 || res2.KeyCreated {
		t.Errorf("rerun fetched %d blobs (%d per Mirror), key created %v; want none", got, res2.Images.Fetched.Blobs, res2.KeyCreated)
	}

	// A run that fails leaves a directory that is not a bundle: never half a bundle that verifies.
	spec.Images.Extra = append(spec.Images.Extra, "registry.k8s.io/does-not-exist:1.0")
	_, err = Create(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "does-not-exist") || !errors.Is(err, registry.ErrUpstreamNotFound) {
		t.Fatalf("Create with a missing image: %v, want an error naming it", err)
	}
	if _, err := bundle.Open(out); err == nil {
		t.Error("after a failed run the directory still opens as a bundle")
	}
	if _, err := os.Stat(filepath.Join(out, bundle.SignatureFile)); !errors.Is(err, os.ErrNotExist) {
		t.Error("after a failed run the old signature is still there")
	}
}

// TestCreateWithPackages makes a whole bundle: images from the local upstream registry, packages
// resolved by the real apt-get from a signed upstream apt repository served over HTTPS (its Release
// signature checked against the spec's signedBy keyring), laid into the bundle's own signed repository.
func TestCreateWithPackages(t *testing.T) {
	up := upstream.Start(t, upstream.Options{})
	apt := upstream.StartAptRepo(t, []upstream.Deb{
		{Name: "alpha", Version: "1.0-1", Arch: "amd64", Extra: "Depends: bravo (>= 2.0)\n"},
		{Name: "bravo", Version: "2.0-1", Arch: "all", Extra: "Pre-Depends: charlie\n"},
		{Name: "charlie", Version: "3.0-1", Arch: "amd64"},
		{Name: "unrelated", Version: "1.0-1", Arch: "amd64"},
	})
	spec := labSpec(t, up)
	pushAll(t, up, spec)
	spec.Apt = bundlespec.Apt{CAFile: apt.CAFile, Sources: []bundlespec.AptSource{
		{URI: apt.URL, Suite: apt.Suite, Components: []string{"main"}, SignedBy: apt.Keyring}}}
	spec.Packages, spec.ExtraPackages = []string{"alpha"}, nil
	spec.Signing.RepoKeyFile = filepath.Join(t.TempDir(), "repo.asc")
	if errs := bundlespec.Validate(spec, bundlespec.ValidateOptions{}); len(errs) > 0 {
		t.Fatalf("spec: %v", errs)
	}
	out := filepath.Join(t.TempDir(), "bundle")
	o := Options{Spec: spec, Out: out, Packages: DebianPackages(out + ".work")}
	res, err := Create(context.Background(), o)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	var names []string
	for _, p := range res.BOM.Packages {
		names = append(names, p.Name+"="+p.Version)
		if want := apt.URL + " " + apt.Suite; p.Origin != want {
			t.Errorf("bill of materials: %s comes from %q, want %q", p.Name, p.Origin, want)
		}
	}
	if got := strings.Join(names, " "); got != "alpha=1.0-1 bravo=2.0-1 charlie=3.0-1" {
		t.Errorf("bundle packages %q, want the closure of alpha only", got)
	}
	b, err := bundle.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Verify(context.Background(), ""); err != nil {
		t.Fatalf("bundle does not verify: %v", err)
	}
	for _, f := range []string{"dists/stable/InRelease", "dists/stable/Release.gpg", RepoKeyringFile()} {
		if _, err := os.Stat(filepath.Join(b.RepoDir(), f)); err != nil {
			t.Errorf("the bundle's repository lacks %s: %v", f, err)
		}
	}
	fetched := apt.DebGets.Load()
	if fetched != 3 || res.Packages.Packages != 3 {
		t.Errorf("downloaded %d .debs, %d packages; want 3 and 3", fetched, res.Packages.Packages)
	}
	// Rerun: nothing downloaded again.
	if _, err := Create(context.Background(), o); err != nil {
		t.Fatalf("rerun: %v", err)
	}
	if got := apt.DebGets.Load(); got != fetched {
		t.Errorf("rerun downloaded %d more .debs, want 0", got-fetched)
	}
	// A package nobody has: one line naming it; the directory is not a bundle afterwards.
	spec.ExtraPackages = []string{"no-such-package"}
	_, err = Create(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "no-such-package") {
		t.Fatalf("Create with an unknown package: %v, want an error naming it", err)
	}
	if _, err := bundle.Open(out); err == nil {
		t.Error("after a failed run the directory still opens as a bundle")
	}
}

// TestCreateParts: with a part size the finished bundle is also split into OUT.parts, which joins back
// into a bundle that verifies under the maker's key; a rerun with another part size leaves no stale
// part; a part size below the minimum is refused before anything is fetched.
func TestCreateParts(t *testing.T) {
	ctx := context.Background()
	small := bundlespec.Example()
	bundlespec.SetDefaults(small)
	small.Output.PartSize = 1000
	if _, err := Create(ctx, Options{Spec: small, Out: filepath.Join(t.TempDir(), "b")}); err == nil || !strings.Contains(err.Error(), "too small") {
		t.Fatalf("Create with 1000-byte parts = %v, want a refusal", err)
	}

	up := upstream.Start(t, upstream.Options{})
	spec := labSpec(t, up)
	pushAll(t, up, spec)
	big, err := random.Image(3<<20, 1) // so that 1 MiB parts make several
	if err != nil {
		t.Fatal(err)
	}
	up.Push(t, "extra/tool:1.0", big)
	spec.Output.PartSize = 2 << 20
	out := filepath.Join(t.TempDir(), "bundle")
	if _, err := Create(ctx, Options{Spec: spec, Out: out}); err != nil {
		t.Fatalf("Create with output.partSize: %v", err)
	}
	first, err := bundle.ReadParts(out + ".parts")
	if err != nil {
		t.Fatal(err)
	}

	var last Event
	res, err := Create(ctx, Options{Spec: spec, Out: out, PartSize: int64(bundlespec.MinPartSize), Progress: func(ev Event) {
		if ev.Step == "parts" && ev.Status == "progress" {
			if ev.Done < last.Done || ev.Total == 0 {
				t.Errorf("parts progress went from %d/%d to %d/%d", last.Done, last.Total, ev.Done, ev.Total)
			}
			last = ev
		}
	}})
	if err != nil {
		t.Fatalf("Create with --part-size: %v", err)
	}
	if res.Parts == nil || res.PartsDir != out+".parts" || len(res.Parts.Parts) < 3 || len(res.Parts.Parts) <= len(first.Parts) {
		t.Fatalf("parts %+v in %s, want at least 3, more than the %d of 2 MiB", res.Parts, res.PartsDir, len(first.Parts))
	}
	if last.Done != res.Parts.Size || last.Total != res.Parts.Size {
		t.Errorf("last parts progress %d/%d, want %d/%d", last.Done, last.Total, res.Parts.Size, res.Parts.Size)
	}
	entries, _ := os.ReadDir(res.PartsDir)
	if len(entries) != 2*len(res.Parts.Parts)+1 {
		t.Errorf("%d files in %s for %d parts: stale parts of the first run?", len(entries), res.PartsDir, len(res.Parts.Parts))
	}

	joined := filepath.Join(t.TempDir(), "joined")
	if err := bundle.Join(ctx, res.PartsDir, joined, nil); err != nil {
		t.Fatalf("Join: %v", err)
	}
	openSigned(t, joined, spec)
}

// openSigned opens the bundle in dir and checks it is signed by spec's bundle key.
func openSigned(t *testing.T, dir string, spec *bundlespec.BundleSpecification) *bundle.Bundle {
	t.Helper()
	b, err := bundle.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	priv, _, err := bundle.EnsureSigningKey(spec.Signing.BundleKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.VerifySignature([]ed25519.PublicKey{priv.Public().(ed25519.PublicKey)}); err != nil {
		t.Errorf("signature of %s: %v", dir, err)
	}
	return b
}

// TestImagesFollowTheMinor: kubeadm's images for each supported minor are the control-plane images of
// the version and the CoreDNS, pause and etcd images of kubeadm of that minor (pkg/k8sversion); a
// minor outside the table is refused naming kubernetes.version.
func TestImagesFollowTheMinor(t *testing.T) {
	for _, tt := range []struct{ version, coredns, pause, etcd string }{
		{"v1.35.4", "v1.13.1", "3.10.1", "3.6.6-0"},
		{"v1.36.3", "v1.14.2", "3.10.2", "3.6.8-0"},
		{"v1.37.2", "v1.14.6", "3.10.2", "3.7.0-0"},
	} {
		spec := bundlespec.Example()
		spec.Kubernetes.Version = tt.version
		spec.Images.Install, spec.Images.Extra = nil, nil
		got, err := Images(spec)
		if err != nil {
			t.Fatalf("%s: %v", tt.version, err)
		}
		want := []string{
			"registry.k8s.io/kube-apiserver:" + tt.version, "registry.k8s.io/kube-controller-manager:" + tt.version,
			"registry.k8s.io/kube-scheduler:" + tt.version, "registry.k8s.io/kube-proxy:" + tt.version,
			"registry.k8s.io/coredns/coredns:" + tt.coredns, "registry.k8s.io/pause:" + tt.pause, "registry.k8s.io/etcd:" + tt.etcd,
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: Images = %q, want %q", tt.version, got, want)
		}
	}
	spec := bundlespec.Example()
	for _, v := range []string{"v1.34.4", "v1.33.5"} {
		spec.Kubernetes.Version = v
		if _, err := Images(spec); err == nil || !strings.HasPrefix(err.Error(), "kubernetes.version: ") || !strings.Contains(err.Error(), "unsupported Kubernetes minor "+v[:5]) {
			t.Errorf("Images(%s) = %v, want a refusal naming kubernetes.version", v, err)
		}
	}
}

// TestCreateOtherMinor: an images-only bundle of Kubernetes v1.35.4 (the example's is v1.37.2),
// mirrored from a real local registry (Debian's docker-registry as registry.k8s.io's only mirror),
// carries kubeadm v1.35's image set and names the version in bundle.yaml; no warning.
func TestCreateOtherMinor(t *testing.T) {
	up := upstream.Start(t, upstream.Options{})
	spec := labSpec(t, up)
	spec.Kubernetes.Version = "v1.35.4"
	rel, err := k8sversion.Lookup(spec.Kubernetes.Version)
	if err != nil {
		t.Fatal(err)
	}
	for i, src := range spec.Apt.Sources {
		if _, ok := k8sversion.AptRepositoryMinor(src.URI); ok {
			spec.Apt.Sources[i].URI = rel.AptRepository()
		}
	}
	if errs := bundlespec.Validate(spec, bundlespec.ValidateOptions{}); len(errs) > 0 {
		t.Fatalf("spec for v1.35.4: %v", errs)
	}
	refs := pushAll(t, up, spec)
	var logs bytes.Buffer
	out := filepath.Join(t.TempDir(), "bundle")
	res, err := Create(context.Background(), Options{Spec: spec, Out: out,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	var got []string
	for _, im := range res.BOM.Images {
		got = append(got, im.Ref)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(refs))
	if !slices.Equal(got, want) || res.BOM.KubernetesVersion != "v1.35.4" || res.BOM.Name != "k8s-1.35.4" {
		t.Errorf("bundle %s (%s) images %q, want %q", res.BOM.Name, res.BOM.KubernetesVersion, got, want)
	}
	for _, r := range []string{"registry.k8s.io/kube-apiserver:v1.35.4", "registry.k8s.io/coredns/coredns:v1.13.1",
		"registry.k8s.io/pause:3.10.1", "registry.k8s.io/etcd:3.6.6-0"} {
		if !slices.Contains(got, r) {
			t.Errorf("bundle lacks %s: %q", r, got)
		}
	}
	if logs.Len() > 0 {
		t.Errorf("warnings:\n%s", logs.String())
	}
}

// TestNodeImageNeedsStep: nodeImage.build without a node-image step (Options.NodeImage) is refused
// before anything is fetched or the output directory is made.
func TestNodeImageNeedsStep(t *testing.T) {
	spec := bundlespec.Example()
	out := filepath.Join(t.TempDir(), "b")
	_, err := Create(context.Background(), Options{Spec: spec, Out: out})
	if err == nil || !strings.Contains(err.Error(), "nodeImage.build is set") {
		t.Fatalf("Create = %v, want the nodeImage.build refusal", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s was made (%v)", out, err)
	}
}
