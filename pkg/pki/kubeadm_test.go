package pki

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

var (
	tokenFormat = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
	keyFormat   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

const testTTL = 24 * time.Hour

func TestEnsureKubeadmSecretsCreateReuseRenew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, KubeadmSecretsFile)

	s, out, err := EnsureKubeadmSecrets(dir, testTTL, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Changed || !strings.HasPrefix(out.Detail, "created kubeadm join secrets (expire 2026-11-21T12:00:00Z") {
		t.Errorf("first call: %+v", out)
	}
	if !tokenFormat.MatchString(s.BootstrapToken) {
		t.Errorf("bootstrap token %q does not match %s", s.BootstrapToken, tokenFormat)
	}
	if !keyFormat.MatchString(s.CertificateKey) {
		t.Errorf("certificate key %q is not 64 lowercase hex characters", s.CertificateKey)
	}
	if !s.Created.Equal(t0) || !s.Expires(testTTL).Equal(t0.Add(testTTL)) {
		t.Errorf("created %v expires %v", s.Created, s.Expires(testTTL))
	}
	if strings.Contains(out.Detail, s.BootstrapToken) || strings.Contains(out.Detail, s.CertificateKey) {
		t.Errorf("Detail leaks a secret: %q", out.Detail)
	}
	assertMode(t, path, 0o600)

	// The file holds exactly what was returned.
	var onDisk KubeadmSecrets
	if err := json.Unmarshal(readFile(t, path), &onDisk); err != nil {
		t.Fatalf("file is not JSON: %v", err)
	}
	if onDisk.BootstrapToken != s.BootstrapToken || onDisk.CertificateKey != s.CertificateKey || !onDisk.Created.Equal(s.Created) {
		t.Errorf("file %+v, returned %+v", onDisk, s)
	}

	// Reused until KubeadmSecretsMargin before expiry, without touching the file.
	before := readFile(t, path)
	for _, now := range []time.Time{t0, t0.Add(time.Hour), t0.Add(testTTL - KubeadmSecretsMargin - time.Second)} {
		got, out, err := EnsureKubeadmSecrets(dir, testTTL, now)
		if err != nil {
			t.Fatal(err)
		}
		if out.Changed || got != s || !strings.HasPrefix(out.Detail, "reused kubeadm join secrets") {
			t.Errorf("at %v: changed=%v detail=%q same=%v", now, out.Changed, out.Detail, got == s)
		}
	}
	if !bytes.Equal(before, readFile(t, path)) {
		t.Error("reuse rewrote the file")
	}

	// Within the margin (and after expiry): a fresh pair, written to disk.
	for _, now := range []time.Time{t0.Add(testTTL - KubeadmSecretsMargin), t0.Add(testTTL + 48*time.Hour)} {
		prev := s
		got, out, err := EnsureKubeadmSecrets(dir, testTTL, now)
		if err != nil {
			t.Fatal(err)
		}
		if !out.Changed || !strings.HasPrefix(out.Detail, "renewed expiring kubeadm join secrets") {
			t.Errorf("at %v: %+v", now, out)
		}
		if got.BootstrapToken == prev.BootstrapToken || got.CertificateKey == prev.CertificateKey {
			t.Errorf("at %v: renewal kept the old token or key", now)
		}
		if !got.Created.Equal(now.Truncate(time.Second)) {
			t.Errorf("renewed Created %v, want %v", got.Created, now)
		}
		if !tokenFormat.MatchString(got.BootstrapToken) || !keyFormat.MatchString(got.CertificateKey) {
			t.Errorf("renewed secrets malformed: %q %q", got.BootstrapToken, got.CertificateKey)
		}
		assertMode(t, path, 0o600)
		again, out, err := EnsureKubeadmSecrets(dir, testTTL, now)
		if err != nil || out.Changed || again != got {
			t.Errorf("call after renewal: %+v %v same=%v", out, err, again == got)
		}
		s = got
	}
}

// TestEnsureKubeadmSecretsRandom checks that two clusters get different secrets and that the token
// uses its whole alphabet (a stuck generator would show up as a repeated or constant character set).
func TestEnsureKubeadmSecretsRandom(t *testing.T) {
	seen := map[string]bool{}
	chars := map[rune]bool{}
	for range 20 {
		s, _, err := EnsureKubeadmSecrets(t.TempDir(), testTTL, t0)
		if err != nil {
			t.Fatal(err)
		}
		if seen[s.BootstrapToken] || seen[s.CertificateKey] {
			t.Fatalf("repeated secret %q / %q", s.BootstrapToken, s.CertificateKey)
		}
		seen[s.BootstrapToken], seen[s.CertificateKey] = true, true
		for _, c := range strings.ReplaceAll(s.BootstrapToken, ".", "") {
			chars[c] = true
		}
	}
	// 20 tokens × 22 characters from a 36-letter alphabet: missing more than a few is vanishingly unlikely.
	if len(chars) < 30 {
		t.Errorf("only %d distinct token characters in 440 draws", len(chars))
	}
}

func TestEnsureKubeadmSecretsConflicts(t *testing.T) {
	good := KubeadmSecrets{BootstrapToken: "abcdef.0123456789abcdef", CertificateKey: strings.Repeat("0a", 32), Created: t0}
	enc := func(s KubeadmSecrets) string {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	with := func(f func(*KubeadmSecrets)) string { s := good; f(&s); return enc(s) }
	tests := []struct {
		name, content, want string
	}{
		{"not JSON", "{not json", "does not parse"},
		{"empty file", "", "does not parse"},
		{"wrong type", `{"bootstrapToken": 7}`, "does not parse"},
		{"uppercase token", with(func(s *KubeadmSecrets) { s.BootstrapToken = "ABCDEF.0123456789abcdef" }), "malformed"},
		{"short token", with(func(s *KubeadmSecrets) { s.BootstrapToken = "abcde.0123456789abcdef" }), "malformed"},
		{"no dot", with(func(s *KubeadmSecrets) { s.BootstrapToken = "abcdef0123456789abcdefg" }), "malformed"},
		{"empty token", with(func(s *KubeadmSecrets) { s.BootstrapToken = "" }), "malformed"},
		{"short key", with(func(s *KubeadmSecrets) { s.CertificateKey = strings.Repeat("0a", 31) }), "malformed"},
		{"uppercase key", with(func(s *KubeadmSecrets) { s.CertificateKey = strings.Repeat("0A", 32) }), "malformed"},
		{"zero created", with(func(s *KubeadmSecrets) { s.Created = time.Time{} }), "malformed"},
		{"missing created", `{"bootstrapToken":"abcdef.0123456789abcdef","certificateKey":"` + strings.Repeat("0a", 32) + `"}`, "malformed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, KubeadmSecretsFile)
			writeFile(t, path, []byte(tc.content))
			before := snapshot(t, dir)
			// Also at a time when a valid file would be renewed: a conflict must not be "renewed" away.
			for _, now := range []time.Time{t0, t0.Add(10 * testTTL)} {
				_, out, err := EnsureKubeadmSecrets(dir, testTTL, now)
				if !errors.Is(err, ErrConflict) {
					t.Fatalf("err = %v, want ErrConflict", err)
				}
				if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "move it away") {
					t.Errorf("error %q does not name the file, the problem (%q) and the fix", err, tc.want)
				}
				if out.Changed {
					t.Error("conflict reported Changed")
				}
				if after := snapshot(t, dir); after != before {
					t.Errorf("the file was touched:\nbefore %q\nafter  %q", before, after)
				}
			}
		})
	}

	// The well-formed control case is reused, proving the table's failures come from the mutation.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, KubeadmSecretsFile), []byte(enc(good)))
	got, out, err := EnsureKubeadmSecrets(dir, testTTL, t0)
	if err != nil || out.Changed || got != good {
		t.Errorf("well-formed file: %+v %+v %v", got, out, err)
	}
}

func TestEnsureKubeadmSecretsUnreadable(t *testing.T) {
	dir := t.TempDir()
	// A directory where the file should be: reading fails with an I/O error, not a conflict.
	if err := os.Mkdir(filepath.Join(dir, KubeadmSecretsFile), 0o700); err != nil {
		t.Fatal(err)
	}
	_, _, err := EnsureKubeadmSecrets(dir, testTTL, t0)
	if err == nil || errors.Is(err, ErrConflict) {
		t.Errorf("err = %v, want a plain read error", err)
	}
}

func TestIssueClientCert(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	cc, err := IssueClientCert(ca, "kubernetes-admin", []string{"kubeadm:cluster-admins"}, 365*24*time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := parseCertPEM(cc.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != "kubernetes-admin" || !slices.Equal(leaf.Subject.Organization, []string{"kubeadm:cluster-admins"}) {
		t.Errorf("subject %v", leaf.Subject)
	}
	if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage %v, want client auth only", leaf.ExtKeyUsage)
	}
	if leaf.IsCA || leaf.KeyUsage&x509.KeyUsageCertSign != 0 {
		t.Error("client certificate can sign certificates")
	}
	if leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		t.Errorf("KeyUsage %v lacks digitalSignature", leaf.KeyUsage)
	}
	if !leaf.NotBefore.Equal(t0.Add(-time.Hour)) || !leaf.NotAfter.Equal(t0.Add(365*24*time.Hour)) {
		t.Errorf("validity %v..%v", leaf.NotBefore, leaf.NotAfter)
	}
	if leaf.SerialNumber == nil || leaf.SerialNumber.Sign() <= 0 {
		t.Errorf("serial %v", leaf.SerialNumber)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("does not chain to the CA for client auth: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("client certificate verifies for server auth")
	}
	key, err := parseKeyPEM(cc.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !keyMatches(leaf, key) {
		t.Error("KeyPEM does not match the certificate")
	}
	if keyMatches(ca.Cert, key) {
		t.Error("client certificate reuses the CA key")
	}

	// Capped at the CA's expiry.
	late := t0.AddDate(9, 11, 0)
	cc, err = IssueClientCert(ca, "kubernetes-admin", nil, 365*24*time.Hour, late)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err = parseCertPEM(cc.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %v, want the CA's %v", leaf.NotAfter, ca.Cert.NotAfter)
	}
	if len(leaf.Subject.Organization) != 0 {
		t.Errorf("nil organizations gave O=%v", leaf.Subject.Organization)
	}

	if _, err := IssueClientCert(ca, "", nil, time.Hour, t0); err == nil || !strings.Contains(err.Error(), "empty common name") {
		t.Errorf("empty CN: err = %v", err)
	}
}

// TestIssueClientCertWithOpenSSL has OpenSSL check the chain and the client-auth purpose, and read
// the subject back the way the API server's x509 authenticator sees it.
func TestIssueClientCertWithOpenSSL(t *testing.T) {
	openssl := labns.RequireTool(t, "openssl")
	dir := t.TempDir()
	now := time.Now()
	ca := mustCA(t, dir, now)
	cc, err := IssueClientCert(ca, "kubernetes-admin", []string{"kubeadm:cluster-admins", "system:masters"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	crt, key := filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	writeFile(t, crt, cc.CertPEM)
	writeFile(t, key, cc.KeyPEM)
	caFile := filepath.Join(dir, CACertFile)
	out := runTool(t, openssl, "verify", "-x509_strict", "-purpose", "sslclient", "-CAfile", caFile, crt)
	if !strings.Contains(out, ": OK") {
		t.Errorf("openssl verify: %s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, openssl, "verify", "-purpose", "sslserver", "-CAfile", caFile, crt).CombinedOutput(); err == nil {
		t.Errorf("openssl accepted the client certificate as a server certificate:\n%s", out)
	}
	other := filepath.Join(t.TempDir(), "ca")
	mustCA(t, other, now)
	if out, err := exec.CommandContext(ctx, openssl, "verify", "-CAfile", filepath.Join(other, CACertFile), crt).CombinedOutput(); err == nil {
		t.Errorf("openssl verified against an unrelated CA:\n%s", out)
	}
	subj := runTool(t, openssl, "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", crt)
	// crypto/x509 puts all O values in one multi-valued RDN; the API server (Go) reads them all as groups.
	if want := "subject=CN=kubernetes-admin,O=kubeadm:cluster-admins+O=system:masters"; strings.TrimSpace(subj) != want {
		t.Errorf("subject %q, want %q", strings.TrimSpace(subj), want)
	}
	// The key is the certificate's: same public key per OpenSSL.
	pubFromCert := runTool(t, openssl, "x509", "-noout", "-pubkey", "-in", crt)
	pubFromKey := runTool(t, openssl, "pkey", "-pubout", "-in", key)
	if pubFromCert != pubFromKey {
		t.Errorf("openssl: key's public half differs from the certificate's\n%s\n%s", pubFromCert, pubFromKey)
	}
}

func TestCAKeyPEMRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	pemBytes, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(pemBytes, []byte("-----BEGIN PRIVATE KEY-----\n")) {
		t.Errorf("KeyPEM is not PKCS #8 PEM: %.40q", pemBytes)
	}
	key, err := parseKeyPEM(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	if !keyMatches(ca.Cert, key) {
		t.Error("KeyPEM does not match the CA certificate")
	}
	// It is the encoding EnsureCA wrote to ca.key.
	if onDisk := readFile(t, filepath.Join(dir, CAKeyFile)); !bytes.Equal(onDisk, pemBytes) {
		t.Error("KeyPEM differs from ca.key")
	}
	// And a CA reloaded from disk gives the same bytes.
	again, _, err := EnsureCA(dir, "", t0)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := again.KeyPEM()
	if err != nil || !bytes.Equal(p2, pemBytes) {
		t.Errorf("reloaded CA KeyPEM differs (err %v)", err)
	}
}

func TestCAKeyPEMWithOpenSSL(t *testing.T) {
	openssl := labns.RequireTool(t, "openssl")
	dir := t.TempDir()
	ca := mustCA(t, dir, t0)
	pemBytes, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "k.pem")
	writeFile(t, key, pemBytes)
	runTool(t, openssl, "pkey", "-check", "-noout", "-in", key)
	if a, b := runTool(t, openssl, "pkey", "-pubout", "-in", key), runTool(t, openssl, "x509", "-noout", "-pubkey", "-in", filepath.Join(dir, CACertFile)); a != b {
		t.Errorf("openssl: KeyPEM's public key differs from the CA certificate's\n%s\n%s", a, b)
	}
}

// TestNodeBootstrapToken: a node's own bootstrap token has the token format, is the same for the
// same secrets and node, and differs between nodes, from the control-plane token, and after the
// secrets are renewed (another certificate key).
func TestNodeBootstrapToken(t *testing.T) {
	a, err := newKubeadmSecrets(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := newKubeadmSecrets(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w1, w2 := a.NodeBootstrapToken("w1"), a.NodeBootstrapToken("w2")
	for _, tok := range []string{w1, w2} {
		if !bootstrapTokenRE.MatchString(tok) {
			t.Fatalf("token %q does not match %s", tok, bootstrapTokenRE)
		}
	}
	if again := a.NodeBootstrapToken("w1"); again != w1 {
		t.Fatalf("not deterministic: %q then %q", w1, again)
	}
	if w1 == w2 || w1 == a.BootstrapToken || w1 == b.NodeBootstrapToken("w1") {
		t.Fatalf("tokens collide: w1 %q w2 %q control plane %q renewed w1 %q", w1, w2, a.BootstrapToken, b.NodeBootstrapToken("w1"))
	}
	if got := (KubeadmSecrets{CertificateKey: "zz"}).NodeBootstrapToken("w1"); got != "" {
		t.Fatalf("a malformed key gave %q", got)
	}
}
