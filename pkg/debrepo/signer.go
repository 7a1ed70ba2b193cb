package debrepo

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"
	"github.com/ProtonMail/go-crypto/openpgp/packet"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// ErrRepoKey: a repository signing key file is malformed, encrypted, public-only or cannot sign.
var ErrRepoKey = errors.New("invalid repository signing key")

// RepoKeyUserID is the OpenPGP user ID of keys GenerateRepoKey makes.
const RepoKeyUserID = "airgap-appliance repository signing key"

// Signer signs a repository's Release file with one OpenPGP key.
//
// Keys this package makes are version 4 EdDSA keys on Ed25519 (RFC 4880bis "EdDSALegacy", algorithm
// 22, the form GnuPG 2.2 writes and Debian's own archive keys use), signing-only, without expiry:
// Debian 12's apt checks signatures with gpgv 2.2, which verifies them (the tests prove it), while
// RFC 9580's version 6 keys and native Ed25519 (algorithm 27) need GnuPG 2.4+/sqv. Signatures use
// SHA-512.
type Signer struct {
	entity *openpgp.Entity
	key    *packet.PrivateKey // the (sub)key that signs
}

// GenerateRepoKey makes a new signing key created at now (whole seconds).
func GenerateRepoKey(now time.Time) (*Signer, error) {
	cfg := &packet.Config{
		Algorithm: packet.PubKeyAlgoEdDSA, Curve: packet.Curve25519, DefaultHash: crypto.SHA512,
		Time: func() time.Time { return now },
	}
	e, err := openpgp.NewEntity(RepoKeyUserID, "", "", cfg)
	if err != nil {
		return nil, fmt.Errorf("generate repository key: %w", err)
	}
	e.Subkeys = nil // signing only: drop the encryption subkey NewEntity adds
	return newSigner(e, now)
}

func newSigner(e *openpgp.Entity, now time.Time) (*Signer, error) {
	if now.Before(e.PrimaryKey.CreationTime) {
		now = e.PrimaryKey.CreationTime
	}
	k, ok := e.SigningKey(now)
	if !ok || k.PrivateKey == nil {
		return nil, fmt.Errorf("%w: key %016X has no usable signing key (expired, revoked, or no signing flag)", ErrRepoKey, e.PrimaryKey.KeyId)
	}
	if k.PrivateKey.Encrypted {
		return nil, fmt.Errorf("%w: key %016X is protected by a passphrase; export it unprotected (the bundle signs unattended)", ErrRepoKey, e.PrimaryKey.KeyId)
	}
	return &Signer{entity: e, key: k.PrivateKey}, nil
}

// ParseRepoKey reads an unencrypted OpenPGP private key (binary, or ASCII armor "PGP PRIVATE KEY
// BLOCK", as `gpg --export-secret-keys` writes) holding exactly one key that can sign now. Errors
// wrap ErrRepoKey.
func ParseRepoKey(data []byte, now time.Time) (*Signer, error) {
	el, err := parseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRepoKey, err)
	}
	var secret []*openpgp.Entity
	for _, e := range el {
		if e.PrivateKey != nil {
			secret = append(secret, e)
		}
	}
	switch len(secret) {
	case 0:
		return nil, fmt.Errorf("%w: no private key in it (it is a public key?)", ErrRepoKey)
	case 1:
		return newSigner(secret[0], now)
	}
	return nil, fmt.Errorf("%w: %d private keys in it; keep exactly one", ErrRepoKey, len(secret))
}

// EnsureRepoKey returns the signing key in path, creating it (created=true) when the file does not
// exist: a new key (GenerateRepoKey) written ASCII-armored with mode 0600, parent directories 0700.
// The file appears complete or not at all, and a key another process created meanwhile is used, not
// replaced. An existing file that is not a usable key is refused, never replaced: appliances already
// trust it.
func EnsureRepoKey(path string) (s *Signer, created bool, err error) {
	now := time.Now()
	data, err := os.ReadFile(path)
	if err == nil {
		s, err := ParseRepoKey(data, now)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w (restore it or point to another key; it is never replaced)", path, err)
		}
		return s, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("read repository key: %w", err)
	}
	if s, err = GenerateRepoKey(now); err != nil {
		return nil, false, err
	}
	armored, err := s.ArmoredPrivateKey()
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("create directory for %s: %w", path, err)
	}
	switch err := writeNew(path, armored, 0o600); {
	case errors.Is(err, fs.ErrExist):
		return EnsureRepoKey(path) // lost a race: use the winner's key
	case err != nil:
		return nil, false, err
	}
	return s, true, nil
}

// writeNew creates path with data and perm only if it does not exist (fs.ErrExist otherwise): a
// temporary file in the same directory, fsynced, hard-linked to path, then removed.
func writeNew(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err = tmp.Chmod(perm); err == nil {
		if _, err = tmp.Write(data); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// KeyID is the primary key's long key ID, 16 upper-case hex digits (what gpgv and apt print).
func (s *Signer) KeyID() string { return fmt.Sprintf("%016X", s.entity.PrimaryKey.KeyId) }

// Fingerprint is the primary key's fingerprint, upper-case hex (40 digits for a version 4 key).
func (s *Signer) Fingerprint() string { return fmt.Sprintf("%X", s.entity.PrimaryKey.Fingerprint) }

// PublicKeyring is the public key as a binary OpenPGP keyring (a transferable public key, RFC 9580
// §10.1): the file apt's signed-by= option and gpgv --keyring read.
func (s *Signer) PublicKeyring() ([]byte, error) {
	var b bytes.Buffer
	if err := s.entity.Serialize(&b); err != nil {
		return nil, fmt.Errorf("export public key: %w", err)
	}
	return b.Bytes(), nil
}

// WritePublicKeyring writes PublicKeyring to path (mode 0644, parent directories 0755, atomically) for
// apt's signed-by=; changed is false when the file already held it.
func (s *Signer) WritePublicKeyring(path string) (changed bool, err error) {
	kr, err := s.PublicKeyring()
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	return atomicfile.Write(path, kr, 0o644)
}

// ArmoredPrivateKey is the private key as ASCII armor ("PGP PRIVATE KEY BLOCK"), unencrypted.
func (s *Signer) ArmoredPrivateKey() ([]byte, error) {
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PrivateKeyType, nil)
	if err != nil {
		return nil, err
	}
	if err := s.entity.SerializePrivateWithoutSigning(w, nil); err != nil {
		return nil, fmt.Errorf("export private key: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// signConfig makes signatures deterministic: creation time t (never before the key's creation, which
// verifiers refuse), SHA-512, and no random salt notation, so that the same key, content and t give
// the same bytes (Ed25519 itself is deterministic).
func (s *Signer) signConfig(t time.Time) *packet.Config {
	if t.Before(s.key.CreationTime) {
		t = s.key.CreationTime
	}
	no := false
	return &packet.Config{DefaultHash: crypto.SHA512, Time: func() time.Time { return t }, NonDeterministicSignaturesViaNotation: &no}
}

// ClearSign returns data clear-signed (RFC 9580 §7), the InRelease form, with a signature made at t
// (or at the key's creation time if t is earlier).
func (s *Signer) ClearSign(data []byte, t time.Time) ([]byte, error) {
	var b bytes.Buffer
	w, err := clearsign.Encode(&b, s.key, s.signConfig(t))
	if err != nil {
		return nil, fmt.Errorf("clear-sign: %w", err)
	}
	if _, err := w.Write(data); err != nil {
		return nil, fmt.Errorf("clear-sign: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("clear-sign: %w", err)
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// DetachSign returns an ASCII-armored detached binary signature over data (the Release.gpg form),
// made at t (or at the key's creation time if t is earlier).
func (s *Signer) DetachSign(data []byte, t time.Time) ([]byte, error) {
	var b bytes.Buffer
	if err := openpgp.ArmoredDetachSign(&b, s.entity, bytes.NewReader(data), s.signConfig(t)); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}
