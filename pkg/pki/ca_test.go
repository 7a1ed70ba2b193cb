package pki

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/test/labns"
)

var t0 = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

func mustCA(t *testing.T, dir string, now time.Time) *CA {
	t.Helper()
	ca, _, err := EnsureCA(dir, "test CA", now)
	if err != nil {
		t.Fatalf("EnsureCA(%s): %v", dir, err)
	}
	return ca
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s: mode %v, want %v", filepath.Base(path), st.Mode().Perm(), want)
	}
}

func TestEnsureCACreateThenReuse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca, out, err := EnsureCA(dir, "appliance CA", t0)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Changed || out.Detail != "created CA (expires 2036-11-20)" {
		t.Errorf("first call: %+v", out)
	}
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("CA constraints: IsCA=%v MaxPathLen=%d zero=%v", c.IsCA, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 || c.Subject.CommonName != "appliance CA" {
		t.Errorf("usage %v CN %q", c.KeyUsage, c.Subject.CommonName)
	}
	if c.PublicKeyAlgorithm != x509.ECDSA || c.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		t.Errorf("algorithms %v %v, want ECDSA P-256 / SHA-256", c.PublicKeyAlgorithm, c.SignatureAlgorithm)
	}
	if !c.NotBefore.Equal(t0.Add(-time.Hour)) || !c.NotAfter.Equal(t0.AddDate(10, 0, 0)) {
		t.Errorf("validity %v..%v", c.NotBefore, c.NotAfter)
	}
	if c.CheckSignatureFrom(c) != nil {
		t.Error("CA is not self-signed")
	}
	assertMode(t, filepath.Join(dir, "ca.key"), 0o600)
	assertMode(t, filepath.Join(dir, "ca.crt"), 0o644)
	if !bytes.Equal(ca.CertPEM, readFile(t, filepath.Join(dir, "ca.crt"))) {
		t.Error("CertPEM differs from ca.crt")
	}
	crt, key := readFile(t, filepath.Join(dir, "ca.crt")), readFile(t, filepath.Join(dir, "ca.key"))

	ca2, out, err := EnsureCA(dir, "another name", t0.AddDate(5, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if out.Changed || out.Detail != "reused CA (expires 2036-11-20)" {
		t.Errorf("second call: %+v", out)
	}
	if !ca2.Cert.Equal(ca.Cert) || !keyMatches(ca2.Cert, ca2.Key) || !bytes.Equal(ca2.CertPEM, ca.CertPEM) {
		t.Error("reused CA differs from the created one")
	}
	if !bytes.Equal(crt, readFile(t, filepath.Join(dir, "ca.crt"))) || !bytes.Equal(key, readFile(t, filepath.Join(dir, "ca.key"))) {
		t.Error("reuse rewrote the CA files")
	}
}

func TestEnsureCAConflicts(t *testing.T) {
	other := mustCA(t, t.TempDir(), t0)
	otherKey, err := encodeKey(other.Key)
	if err != nil {
		t.Fatal(err)
	}
	// A leaf certificate and its key, to plant as a "CA".
	leafDir := t.TempDir()
	if _, _, err := EnsureServingCert(leafDir, other, []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil, t0); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		setup    func(t *testing.T, dir string) // dir holds a valid CA made at t0 before setup
		now      time.Time
		wantFile string
		wantText string
	}{
		{"key does not match cert", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.key"), otherKey)
		}, t0, "ca.key", "does not match"},
		{"only key", func(t *testing.T, dir string) {
			_ = os.Remove(filepath.Join(dir, "ca.crt"))
		}, t0, "ca.crt", "half-written pair"},
		{"only cert", func(t *testing.T, dir string) {
			_ = os.Remove(filepath.Join(dir, "ca.key"))
		}, t0, "ca.key", "missing"},
		{"garbage cert PEM", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.crt"), []byte("not a certificate\n"))
		}, t0, "ca.crt", "no PEM block"},
		{"garbage key PEM", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.key"), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
		}, t0, "ca.key", "parse private key"},
		{"encrypted key", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.key"), []byte("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"))
		}, t0, "ca.key", "encrypted"},
		{"cert file holds a key", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.crt"), otherKey)
		}, t0, "ca.crt", `"PRIVATE KEY", want CERTIFICATE`},
		{"bundle of two certs", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.crt"), append(readFile(t, filepath.Join(dir, "ca.crt")), other.CertPEM...))
		}, t0, "ca.crt", "more than one PEM block"},
		{"expired CA", func(*testing.T, string) {}, t0.AddDate(10, 0, 1), "ca.crt", "expired on 2036-11-20"},
		{"CA not yet valid", func(*testing.T, string) {}, t0.Add(-2 * time.Hour), "ca.crt", "clock"},
		{"non-CA cert", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "ca.crt"), readFile(t, filepath.Join(leafDir, "serving.crt")))
			writeFile(t, filepath.Join(dir, "ca.key"), readFile(t, filepath.Join(leafDir, "serving.key")))
		}, t0, "ca.crt", "not a CA"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mustCA(t, dir, t0)
			tc.setup(t, dir)
			before := snapshot(t, dir)
			ca, out, err := EnsureCA(dir, "test CA", tc.now)
			if !errors.Is(err, ErrConflict) {
				t.Fatalf("err = %v, want ErrConflict", err)
			}
			if ca != nil || out.Changed {
				t.Errorf("conflict returned ca=%v out=%+v", ca, out)
			}
			msg := err.Error()
			if !strings.Contains(msg, filepath.Join(dir, tc.wantFile)+": ") || !strings.Contains(msg, tc.wantText) {
				t.Errorf("error %q does not name %s with %q", msg, tc.wantFile, tc.wantText)
			}
			if !strings.Contains(msg, "move") && !strings.Contains(msg, "restore") {
				t.Errorf("error %q does not say what to do", msg)
			}
			if after := snapshot(t, dir); after != before {
				t.Errorf("conflict changed the directory:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// snapshot returns the names, modes and contents of the files in dir.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		info, _ := e.Info()
		b.WriteString(e.Name() + " " + info.Mode().String() + "\n")
		if e.Type().IsRegular() {
			b.Write(readFile(t, filepath.Join(dir, e.Name())))
		}
	}
	return b.String()
}

// TestEnsureCAReusesOpenSSLCA checks that a CA made by a real peer (OpenSSL, ECDSA and RSA, PKCS #8 and
// traditional key encodings) is reused, and that serving certificates it signs verify.
func TestEnsureCAReusesOpenSSLCA(t *testing.T) {
	openssl := labns.RequireTool(t, "openssl")
	tests := []struct {
		name, newkey string
		keyConv      []string // openssl command rewriting the key in another encoding
		wantHeader   string
	}{
		{"ec pkcs8", "ec", nil, "PRIVATE KEY"},
		{"ec sec1", "ec", []string{"ec"}, "EC PRIVATE KEY"},
		{"rsa pkcs1", "rsa:2048", []string{"rsa", "-traditional"}, "RSA PRIVATE KEY"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			key, crt := filepath.Join(dir, "ca.key"), filepath.Join(dir, "ca.crt")
			args := []string{"req", "-x509", "-newkey", tc.newkey, "-nodes", "-keyout", key, "-out", crt,
				"-subj", "/CN=operator CA", "-days", "30", "-addext", "basicConstraints=critical,CA:TRUE",
				"-addext", "keyUsage=critical,keyCertSign,cRLSign"}
			if tc.newkey == "ec" {
				args = append(args, "-pkeyopt", "ec_paramgen_curve:P-256")
			}
			runTool(t, openssl, args...)
			if tc.keyConv != nil {
				runTool(t, openssl, append(tc.keyConv, "-in", key, "-out", key)...)
			}
			if !bytes.Contains(readFile(t, key), []byte("BEGIN "+tc.wantHeader+"-----")) {
				t.Fatalf("openssl wrote %q, want a %s block", readFile(t, key)[:40], tc.wantHeader)
			}
			ca, out, err := EnsureCA(dir, "ignored", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if out.Changed || ca.Cert.Subject.CommonName != "operator CA" {
				t.Errorf("out=%+v CN=%q", out, ca.Cert.Subject.CommonName)
			}
			cert, _, err := EnsureServingCert(dir, ca, nil, []string{"registry.lab"}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)
			if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "registry.lab"}); err != nil {
				t.Error(err)
			}
		})
	}
}

func runTool(t *testing.T, argv0 string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv0, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", argv0, args, err, out)
	}
	return string(out)
}

// TestPinMatchesOpenSSL compares agentapi.PinOf (the contract's pin of the CA pki makes) with the pin computed by a real peer, as the kubeadm docs
// compute --discovery-token-ca-cert-hash.
func TestPinMatchesOpenSSL(t *testing.T) {
	labns.RequireTool(t, "openssl")
	labns.RequireTool(t, "sha256sum")
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	out := runTool(t, "sh", "-c", `openssl x509 -pubkey -noout -in "$1" | openssl pkey -pubin -outform der | sha256sum`, "sh", filepath.Join(dir, "ca.crt"))
	fields := strings.Fields(out)
	if len(fields) == 0 || len(fields[0]) != 64 {
		t.Fatalf("unexpected sha256sum output %q", out)
	}
	if got, want := agentapi.PinOf(ca.Cert), "sha256:"+fields[0]; got != want {
		t.Errorf("agentapi.PinOf = %s, openssl says %s", got, want)
	}
	other := mustCA(t, t.TempDir(), t0)
	if agentapi.PinOf(other.Cert) == agentapi.PinOf(ca.Cert) {
		t.Error("two CAs have the same pin")
	}
}

func FuzzEnsureCA(f *testing.F) {
	dir := f.TempDir()
	ca, _, err := EnsureCA(dir, "fuzz", t0)
	if err != nil {
		f.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(dir, "ca.key"))
	f.Add(ca.CertPEM, key)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), key)
	f.Fuzz(func(t *testing.T, crt, key []byte) {
		d := t.TempDir()
		writeFile(t, filepath.Join(d, "ca.crt"), crt)
		writeFile(t, filepath.Join(d, "ca.key"), key)
		got, out, err := EnsureCA(d, "fuzz", t0)
		if err != nil && !errors.Is(err, ErrConflict) {
			t.Fatalf("error is not ErrConflict: %v", err)
		}
		if err == nil && (out.Changed || !keyMatches(got.Cert, got.Key) || !got.Cert.IsCA) {
			t.Fatalf("accepted an unusable CA: %+v", out)
		}
	})
}
