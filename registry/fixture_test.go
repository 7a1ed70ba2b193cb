package registry

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fixture is a small OCI image layout like the bundle's.
type fixture struct {
	dir    string
	pause  v1.Hash // registry.k8s.io/pause:3.10, an OCI image
	busy   v1.Hash // docker.io/library/busybox:1.36, an OCI index of two platforms
	app    v1.Hash // myreg:5000/team/app:v1, a Docker schema2 image
	layers int     // distinct blobs in the layout
}

// ociImage is a random OCI image (OCI manifest, config and layer media types), so that skopeo copies
// it to an oci: destination without conversion and the digest is preserved.
func ociImage(t testing.TB, layers int, size int64) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for range layers {
		l, err := random.Layer(size, types.OCILayer)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func writeFixture(t testing.TB, dir string) fixture {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{dir: dir}
	ann := func(ref string) layout.Option {
		return layout.WithAnnotations(map[string]string{refNameAnnotation: ref})
	}
	pause := ociImage(t, 2, 2048)
	if err := p.AppendImage(pause, ann("registry.k8s.io/pause:3.10")); err != nil {
		t.Fatal(err)
	}
	f.pause, _ = pause.Digest()

	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        ociImage(t, 1, 1024),
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	if err := p.AppendIndex(idx, ann("docker.io/library/busybox:1.36")); err != nil {
		t.Fatal(err)
	}
	f.busy, _ = idx.Digest()

	app, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(app, ann("myreg:5000/team/app:v1")); err != nil {
		t.Fatal(err)
	}
	f.app, _ = app.Digest()
	ents, _ := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	f.layers = len(ents)
	return f
}

// testCA is a throwaway CA and a serving certificate for 127.0.0.1 signed by it.
type testCA struct {
	certDir string // holds ca.crt, the layout skopeo's --*-cert-dir expects
	pool    *x509.CertPool
	leaf    tls.Certificate
}

func newTestCA(t testing.TB) testCA {
	t.Helper()
	caPEM, leaf := pkitest.Issue(t)
	c := testCA{certDir: t.TempDir(), pool: x509.NewCertPool(), leaf: leaf}
	c.pool.AppendCertsFromPEM(caPEM)
	if err := os.WriteFile(filepath.Join(c.certDir, "ca.crt"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// serveTLS serves h over TLS 1.2+ on 127.0.0.1 with the CA's serving certificate; it returns
// "127.0.0.1:PORT" and a client trusting the CA.
func (c testCA) serveTLS(t testing.TB, h http.Handler) (string, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake failures are expected in negative tests
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{c.leaf}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	return srv.Listener.Addr().String(), &http.Client{Transport: tr}
}
