package bundle

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

// signedBundle is newBundle (a complete, verifiable bundle) signed with a new key.
func signedBundle(t *testing.T) (string, ed25519.PrivateKey) {
	t.Helper()
	b := newBundle(t)
	priv, created, err := EnsureSigningKey(filepath.Join(t.TempDir(), "keys", "bundle.key"))
	if err != nil || !created {
		t.Fatalf("EnsureSigningKey: %v, created %v", err, created)
	}
	if err := Sign(b.Dir, priv); err != nil {
		t.Fatal(err)
	}
	return b.Dir, priv
}

func TestSignAndVerify(t *testing.T) {
	dir, priv := signedBundle(t)
	pub := priv.Public().(ed25519.PublicKey)
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The signature file is part of a verified bundle, not an unlisted file.
	if _, err := b.Verify(context.Background(), ""); err != nil {
		t.Fatalf("Verify of a signed bundle: %v", err)
	}
	sig, err := b.VerifySignature([]ed25519.PublicKey{pub})
	if err != nil || sig.KeyID != KeyID(pub) || sig.PublicKey != PublicKeyString(pub) {
		t.Fatalf("VerifySignature = %+v, %v", sig, err)
	}
	// Deterministic: signing again writes the same bytes.
	before, _ := os.ReadFile(filepath.Join(dir, SignatureFile))
	if err := Sign(dir, priv); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, SignatureFile)); string(after) != string(before) {
		t.Error("signing twice gave different signatures")
	}

	other, _ := GenerateSigningKey()
	otherPub := other.Public().(ed25519.PublicKey)
	if _, err := b.VerifySignature([]ed25519.PublicKey{otherPub}); !errors.Is(err, ErrBadSignature) || !strings.Contains(err.Error(), "not trusted") {
		t.Errorf("untrusted key: %v, want ErrBadSignature naming the untrusted key", err)
	}
	if _, err := b.VerifySignature([]ed25519.PublicKey{otherPub, pub}); err != nil {
		t.Errorf("trusted among several: %v", err)
	}
	if _, err := b.VerifySignature(nil); err == nil || !strings.Contains(err.Error(), "no trusted public key") {
		t.Errorf("no keys: %v", err)
	}

	// A flipped byte in the checksum list: the trusted key's signature no longer matches.
	sums := filepath.Join(dir, SumsFile)
	data, _ := os.ReadFile(sums)
	data[0] ^= 1
	if err := os.WriteFile(sums, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := b.VerifySignature([]ed25519.PublicKey{pub}); !errors.Is(err, ErrBadSignature) || !strings.Contains(err.Error(), "altered") {
		t.Errorf("altered SHA256SUMS: %v, want ErrBadSignature saying it was altered", err)
	}

	// Unsigned.
	if err := os.Remove(filepath.Join(dir, SignatureFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.VerifySignature([]ed25519.PublicKey{pub}); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned bundle: %v, want ErrUnsigned", err)
	}
}

// TestSignatureWithOpenSSL checks the key and signature formats with a real peer: openssl reads the
// PKCS #8 key file and produces the same (deterministic) Ed25519 signature over the same message.
func TestSignatureWithOpenSSL(t *testing.T) {
	openssl := labns.RequireTool(t, "openssl")
	dir, priv := signedBundle(t)
	keyPEM, _ := MarshalPrivateKey(priv)
	keyFile := filepath.Join(t.TempDir(), "k.pem")
	msgFile := filepath.Join(t.TempDir(), "msg")
	sums, _ := os.ReadFile(filepath.Join(dir, SumsFile))
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(msgFile, append([]byte(SignatureContext), sums...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(openssl, "pkeyutl", "-sign", "-rawin", "-inkey", keyFile, "-in", msgFile).Output()
	if err != nil {
		t.Fatalf("openssl pkeyutl -sign: %v", err)
	}
	line, _ := os.ReadFile(filepath.Join(dir, SignatureFile))
	f := strings.Fields(string(line))
	if len(f) != 3 || f[2] != base64Std(out) {
		t.Errorf("our signature %q differs from openssl's %q", line, base64Std(out))
	}
}

func TestParseKeys(t *testing.T) {
	priv, _ := GenerateSigningKey()
	pub := priv.Public().(ed25519.PublicKey)
	got, err := ParsePublicKey(" " + PublicKeyString(pub) + "\n")
	if err != nil || !got.Equal(pub) {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range []string{"", "ssh-ed25519 AAAA", "ed25519:", "ed25519:AAAA", "ed25519:!!!"} {
		if _, err := ParsePublicKey(bad); !errors.Is(err, ErrKey) {
			t.Errorf("ParsePublicKey(%q) = %v, want ErrKey", bad, err)
		}
	}
	path := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureSigningKey(path); !errors.Is(err, ErrKey) {
		t.Errorf("EnsureSigningKey on a damaged file = %v, want ErrKey (never replaced)", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not a key" {
		t.Error("a damaged key file was replaced")
	}
	newPath := filepath.Join(t.TempDir(), "new")
	k1, created, err := EnsureSigningKey(newPath)
	if err != nil || !created {
		t.Fatal(err)
	}
	if st, err := os.Stat(newPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("new key file: %v %v, want 0600", st, err)
	}
	k2, created, err := EnsureSigningKey(newPath)
	if err != nil || created || !k2.Equal(k1) {
		t.Errorf("second EnsureSigningKey: created %v, same key %v, %v", created, k2.Equal(k1), err)
	}
}

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func TestBillOfMaterials(t *testing.T) {
	dir, priv := signedBundle(t)
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	bom, err := b.BillOfMaterials()
	if err != nil {
		t.Fatal(err)
	}
	if bom.SignedBy != KeyID(priv.Public().(ed25519.PublicKey)) || bom.Name != testMeta.Name {
		t.Errorf("bom header %+v", bom)
	}
	if len(bom.Images) != 2 || bom.Images[0].Ref != "docker.io/library/busybox:1.36" || bom.Images[1].Ref != "registry.k8s.io/pause:3.10" {
		t.Fatalf("images %+v", bom.Images)
	}
	for _, im := range bom.Images {
		if !strings.HasPrefix(im.Digest, "sha256:") || im.Size <= 0 {
			t.Errorf("image %+v: want a digest and a size", im)
		}
	}
	// random.Index(256, 1, 2) holds two manifests: the index's size covers both.
	if bom.Images[1].Size < bom.Images[0].Size/4 {
		t.Errorf("index size %d looks like one blob only", bom.Images[1].Size)
	}
	if len(bom.Packages) != 2 || bom.Packages[0].Name != "alpha" || bom.Packages[0].Version != "1.0" ||
		bom.Packages[0].Architecture != "amd64" || len(bom.Packages[0].SHA256) != 64 || bom.Packages[0].Suite != "stable" {
		t.Errorf("packages %+v", bom.Packages)
	}
}
