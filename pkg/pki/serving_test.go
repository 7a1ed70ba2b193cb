package pki

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

var (
	testIPs  = []netip.Addr{netip.MustParseAddr("10.100.0.2"), netip.MustParseAddr("10.100.0.10"), netip.MustParseAddr("fd00:100::2")}
	testDNS  = []string{"bootstrap.lab"}
	allNames = []string{"10.100.0.2", "10.100.0.10", "fd00:100::2", "bootstrap.lab"}
)

func verifyName(ca *CA, leaf *x509.Certificate, name string, now time.Time) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

func TestEnsureServingCertIssueAndReuse(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	cert, out, err := EnsureServingCert(dir, ca, testIPs, testDNS, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Changed || out.Detail != "issued serving cert (4 SANs)" {
		t.Errorf("first call: %+v", out)
	}
	leaf := cert.Leaf
	for _, name := range allNames {
		if err := verifyName(ca, leaf, name, t0); err != nil {
			t.Errorf("verify as %s: %v", name, err)
		}
	}
	for _, name := range []string{"10.100.0.3", "other.lab"} {
		if verifyName(ca, leaf, name, t0) == nil {
			t.Errorf("verified as %s, which is not a SAN", name)
		}
	}
	if leaf.IsCA || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) ||
		leaf.KeyUsage != x509.KeyUsageDigitalSignature || leaf.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("leaf: IsCA=%v EKU=%v KU=%v alg=%v", leaf.IsCA, leaf.ExtKeyUsage, leaf.KeyUsage, leaf.PublicKeyAlgorithm)
	}
	if !leaf.NotAfter.Equal(t0.AddDate(1, 0, 0)) {
		t.Errorf("NotAfter %v, want one year", leaf.NotAfter)
	}
	if len(cert.Certificate) != 1 || !bytes.Equal(cert.Certificate[0], leaf.Raw) || !keyMatches(leaf, cert.PrivateKey.(crypto.Signer)) {
		t.Error("returned tls.Certificate is inconsistent")
	}
	assertMode(t, filepath.Join(dir, "serving.key"), 0o600)
	assertMode(t, filepath.Join(dir, "serving.crt"), 0o644)
	before := snapshot(t, dir)

	// Same set in another order, with a duplicate and different case: reused, files untouched.
	cert2, out, err := EnsureServingCert(dir, ca, []netip.Addr{testIPs[2], testIPs[0], testIPs[1], testIPs[0]},
		[]string{"Bootstrap.LAB"}, t0.AddDate(0, 6, 0))
	if err != nil {
		t.Fatal(err)
	}
	if out.Changed || out.Detail != "reused serving cert (4 SANs, expires 2027-11-20)" {
		t.Errorf("second call: %+v", out)
	}
	if !cert2.Leaf.Equal(leaf) || snapshot(t, dir) != before {
		t.Error("reuse changed the certificate or the files")
	}
}

func TestEnsureServingCertReissue(t *testing.T) {
	otherCA := mustCA(t, t.TempDir(), t0)
	tests := []struct {
		name       string
		setup      func(t *testing.T, dir string, ca *CA)
		ips        []netip.Addr
		now        time.Time
		wantDetail string
	}{
		{"SAN added", nil, append(slices.Clone(testIPs), netip.MustParseAddr("10.0.0.5")), t0,
			"re-issued serving cert: SANs changed (+10.0.0.5)"},
		{"SAN removed", nil, testIPs[:2], t0, "re-issued serving cert: SANs changed (-fd00:100::2)"},
		{"near expiry", nil, testIPs, t0.AddDate(1, 0, -20), "re-issued serving cert: expires in 20 days (2027-11-20)"},
		{"expired", nil, testIPs, t0.AddDate(1, 0, 1), "re-issued serving cert: outside its validity period"},
		{"signed by another CA", func(t *testing.T, dir string, _ *CA) {
			if _, _, err := EnsureServingCert(dir, otherCA, testIPs, testDNS, t0); err != nil {
				t.Fatal(err)
			}
		}, testIPs, t0, "re-issued serving cert: does not verify against the CA"},
		{"garbage cert", func(t *testing.T, dir string, _ *CA) {
			writeFile(t, filepath.Join(dir, "serving.crt"), []byte("junk"))
		}, testIPs, t0, "re-issued serving cert: serving.crt unreadable (no PEM block found)"},
		{"only key", func(t *testing.T, dir string, _ *CA) {
			_ = os.Remove(filepath.Join(dir, "serving.crt"))
		}, testIPs, t0, "re-issued serving cert: serving.crt missing"},
		{"key mismatch (crash between key and cert)", func(t *testing.T, dir string, _ *CA) {
			k, _ := newKey()
			pemKey, _ := encodeKey(k)
			writeFile(t, filepath.Join(dir, "serving.key"), pemKey)
		}, testIPs, t0, "re-issued serving cert: serving.key does not match serving.crt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ca := mustCA(t, dir, t0)
			old, _, err := EnsureServingCert(dir, ca, testIPs, testDNS, t0)
			if err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, dir, ca)
			}
			cert, out, err := EnsureServingCert(dir, ca, tc.ips, testDNS, tc.now)
			if err != nil {
				t.Fatal(err)
			}
			if !out.Changed || !strings.HasPrefix(out.Detail, tc.wantDetail) {
				t.Errorf("outcome %+v, want Changed and Detail starting %q", out, tc.wantDetail)
			}
			if cert.Leaf.Equal(old.Leaf) {
				t.Error("certificate not re-issued")
			}
			for _, ip := range tc.ips {
				if err := verifyName(ca, cert.Leaf, ip.String(), tc.now); err != nil {
					t.Errorf("new cert as %s: %v", ip, err)
				}
			}
			// On disk now: the new pair, reused on the next call.
			_, out, err = EnsureServingCert(dir, ca, tc.ips, testDNS, tc.now)
			if err != nil || out.Changed {
				t.Errorf("call after re-issue: %+v %v", out, err)
			}
		})
	}
}

func TestEnsureServingCertCappedAtCAExpiry(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	cert, _, err := EnsureServingCert(dir, ca, nil, testDNS, t0.AddDate(9, 6, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !cert.Leaf.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %v, want the CA's %v", cert.Leaf.NotAfter, ca.Cert.NotAfter)
	}
}

func TestEnsureServingCertBadInput(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	tests := []struct {
		name string
		ca   *CA
		ips  []netip.Addr
		dns  []string
		want string
	}{
		{"no SANs", ca, nil, nil, "no SANs requested"},
		{"zero IP", ca, []netip.Addr{{}}, nil, "invalid (zero) IP"},
		{"zoned IP", ca, []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}, nil, "has a zone"},
		{"empty name", ca, nil, []string{""}, "invalid DNS SAN"},
		{"no CA", nil, testIPs, nil, "no CA"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := EnsureServingCert(dir, tc.ca, tc.ips, tc.dns, t0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "serving.crt")); !os.IsNotExist(err) {
				t.Error("bad input wrote a certificate")
			}
		})
	}
}

// TestServingCertWithOpenSSL has real peers check the result: `openssl verify` for every SAN, and an
// `openssl s_client` TLS handshake against the returned tls.Certificate on 127.0.0.1.
func TestServingCertWithOpenSSL(t *testing.T) {
	openssl := labns.RequireTool(t, "openssl")
	dir := t.TempDir()
	now := time.Now()
	ca := mustCA(t, dir, now)
	ips := append(slices.Clone(testIPs), netip.MustParseAddr("127.0.0.1"))
	cert, _, err := EnsureServingCert(dir, ca, ips, testDNS, now)
	if err != nil {
		t.Fatal(err)
	}
	caFile, crtFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "serving.crt")
	for _, ip := range ips {
		runTool(t, openssl, "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile", caFile, "-verify_ip", ip.String(), crtFile)
	}
	runTool(t, openssl, "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile", caFile, "-verify_hostname", "bootstrap.lab", crtFile)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, openssl, "verify", "-CAfile", caFile, "-verify_hostname", "other.lab", crtFile).CombinedOutput(); err == nil {
		t.Errorf("openssl accepted a name that is not a SAN:\n%s", out)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", ln.Addr().String(), "-CAfile", caFile,
		"-verify_return_error", "-verify_ip", "127.0.0.1", "-brief")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Verification: OK") {
		t.Errorf("openssl s_client: %v\n%s", err, out)
	}
}
