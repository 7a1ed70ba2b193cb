package bundle

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// The whole bundle is signed offline: SHA256SUMS lists every file's SHA-256 (bundle.yaml included),
// so one Ed25519 signature (RFC 8032) over it covers the bundle. The signature travels beside it as
// SHA256SUMS.sig, one line:
//
//	ed25519 <key ID> <base64 signature>
//
// over the message SignatureContext + the bytes of SHA256SUMS (the context keeps a bundle signature
// from being valid for anything else signed with the same key). The key ID is the first 16 hex digits
// of the SHA-256 of the raw 32-byte public key. Operators pin the public key in bootstrap.yaml
// (bundle.publicKeys) in the form PublicKeyString gives: "ed25519:<base64 of the 32 bytes>".
const (
	SignatureFile    = "SHA256SUMS.sig"
	SignatureContext = "appliance.airgap.dev bundle SHA256SUMS v1\n"
)

var (
	// ErrUnsigned: the bundle has no SHA256SUMS.sig.
	ErrUnsigned = errors.New("bundle is not signed")
	// ErrBadSignature: SHA256SUMS.sig is malformed, made by a key that is not trusted, or does not
	// verify.
	ErrBadSignature = errors.New("bundle signature does not verify")
	// ErrKey: a key file or key string is malformed.
	ErrKey = errors.New("invalid bundle signing key")
)

// GenerateSigningKey makes a new Ed25519 key pair.
func GenerateSigningKey() (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	return priv, err
}

// MarshalPrivateKey encodes priv as a PEM "PRIVATE KEY" block (PKCS #8, RFC 8410), the format
// `openssl genpkey -algorithm ed25519` writes.
func MarshalPrivateKey(priv ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKey decodes a PEM PKCS #8 Ed25519 private key. Errors wrap ErrKey.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%w: want a PEM PRIVATE KEY block (PKCS #8 Ed25519)", ErrKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: the key is %T, want Ed25519", ErrKey, k)
	}
	return priv, nil
}

// EnsureSigningKey returns the Ed25519 private key in path (PEM, 0600), creating it when the file does
// not exist (created=true). An existing file that does not parse is refused, never replaced: bundles
// already signed with it are pinned by their operators.
func EnsureSigningKey(path string) (priv ed25519.PrivateKey, created bool, err error) {
	data, err := os.ReadFile(path)
	if err == nil {
		priv, err := ParsePrivateKey(data)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w (restore it or point to another key; it is never replaced)", path, err)
		}
		return priv, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	if priv, err = GenerateSigningKey(); err != nil {
		return nil, false, err
	}
	pemBytes, err := MarshalPrivateKey(priv)
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, err
	}
	if _, err := atomicfile.Write(path, pemBytes, 0o600); err != nil {
		return nil, false, err
	}
	return priv, true, nil
}

// PublicKeyString is pub as operators pin it: "ed25519:" + standard base64 of the 32 bytes.
func PublicKeyString(pub ed25519.PublicKey) string {
	return "ed25519:" + base64.StdEncoding.EncodeToString(pub)
}

// ParsePublicKey parses PublicKeyString's form. Errors wrap ErrKey and say the expected form.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	b64, ok := strings.CutPrefix(strings.TrimSpace(s), "ed25519:")
	if !ok {
		return nil, fmt.Errorf("%w: %q does not start with \"ed25519:\" (want ed25519:<base64 of 32 bytes>, as `appliance bundle inspect` prints)", ErrKey, s)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: %q is not the base64 of a 32-byte Ed25519 public key", ErrKey, s)
	}
	return ed25519.PublicKey(raw), nil
}

// KeyID is the first 16 hex digits of SHA-256(pub): short, stable, printed beside signatures.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Sign writes dir/SHA256SUMS.sig: priv's signature over SignatureContext + dir/SHA256SUMS (which
// Create wrote). Atomic; signing twice with the same key writes the same bytes (Ed25519 is
// deterministic).
func Sign(dir string, priv ed25519.PrivateKey) error {
	abs, err := resolveDir(dir)
	if err != nil {
		return err
	}
	sums, err := os.ReadFile(filepath.Join(abs, SumsFile))
	if err != nil {
		return fmt.Errorf("sign bundle: %w (create the bundle first)", err)
	}
	sig := ed25519.Sign(priv, append([]byte(SignatureContext), sums...))
	pub := priv.Public().(ed25519.PublicKey)
	line := fmt.Sprintf("ed25519 %s %s\n", KeyID(pub), base64.StdEncoding.EncodeToString(sig))
	_, err = atomicfile.Write(filepath.Join(abs, SignatureFile), []byte(line), 0o644)
	return err
}

// Signature is what VerifySignature found.
type Signature struct {
	// KeyID of the trusted key that made the signature, and that key as PublicKeyString gives it.
	KeyID, PublicKey string
}

// VerifySignature checks dir/SHA256SUMS.sig against dir/SHA256SUMS with the trusted keys: it passes
// when the signature verifies under one of them. It checks only the signature over the checksum list;
// Verify checks every file against that list, so the two together cover the whole bundle. Errors:
// ErrUnsigned (no signature file: the bundle must be signed), ErrBadSignature (malformed, made by an
// untrusted key, or not matching the checksum list: the bundle or its signature was altered), each
// naming the file and what to do; no trusted keys is an error too.
func (b *Bundle) VerifySignature(trusted []ed25519.PublicKey) (Signature, error) {
	sigPath := filepath.Join(b.Dir, SignatureFile)
	if len(trusted) == 0 {
		return Signature{}, fmt.Errorf("%s: no trusted public key to check it with: pin the key the bundle is signed with (bootstrap.yaml bundle.publicKeys, or --public-key)", sigPath)
	}
	line, err := os.ReadFile(sigPath)
	if errors.Is(err, fs.ErrNotExist) {
		return Signature{}, fmt.Errorf("%s: %w: a bundle must be signed by its maker (appliance bundle create signs it)", sigPath, ErrUnsigned)
	} else if err != nil {
		return Signature{}, err
	}
	f := strings.Fields(string(line))
	if len(f) != 3 || f[0] != "ed25519" {
		return Signature{}, fmt.Errorf("%s: %w: want one line \"ed25519 <key ID> <base64 signature>\"", sigPath, ErrBadSignature)
	}
	sig, err := base64.StdEncoding.DecodeString(f[2])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return Signature{}, fmt.Errorf("%s: %w: the signature is not base64 of %d bytes", sigPath, ErrBadSignature, ed25519.SignatureSize)
	}
	sums, err := os.ReadFile(filepath.Join(b.Dir, SumsFile))
	if err != nil {
		return Signature{}, fmt.Errorf("%s: %w", filepath.Join(b.Dir, SumsFile), err)
	}
	msg := append([]byte(SignatureContext), sums...)
	var ids []string
	for _, pub := range trusted {
		ids = append(ids, KeyID(pub))
		if KeyID(pub) == f[1] && ed25519.Verify(pub, msg, sig) {
			return Signature{KeyID: f[1], PublicKey: PublicKeyString(pub)}, nil
		}
	}
	if !bytes.Contains([]byte(strings.Join(ids, " ")), []byte(f[1])) {
		return Signature{}, fmt.Errorf("%s: %w: signed by key %s, which is not trusted (trusted: %s): pin the maker's public key, or get the bundle from its maker again",
			sigPath, ErrBadSignature, f[1], strings.Join(ids, ", "))
	}
	return Signature{}, fmt.Errorf("%s: %w: key %s is trusted but its signature does not match %s: the bundle's checksum list was altered after signing; get the bundle again",
		sigPath, ErrBadSignature, f[1], SumsFile)
}
