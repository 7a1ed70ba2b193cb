package pki

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// VRRPAuthFile is the VRRP PASS secret in the PKI directory (0600).
const VRRPAuthFile = "vrrp-auth"

// ErrVRRPAuthMissing is wrapped when the secret does not exist and EnsureVRRPAuth may not create it.
var ErrVRRPAuthMissing = errors.New("VRRP auth secret missing")

// EnsureVRRPAuth returns the VRRP PASS secret shared by the API VIP's speakers (RFC 2338 simple text
// auth, 1..8 bytes) from dir/vrrp-auth (one trailing newline ignored). When create is true and the
// file is missing it is created (0600) with 8 random URL-safe characters and created=true. An existing
// file of the wrong length is refused, never replaced: every node already holds the secret.
// Errors: ErrVRRPAuthMissing (create false), a refusal naming the file and the fix, I/O errors.
func EnsureVRRPAuth(dir string, create bool) (secret string, created bool, err error) {
	path := filepath.Join(dir, VRRPAuthFile)
	b, err := os.ReadFile(path)
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	switch {
	case err == nil && len(b) >= 1 && len(b) <= 8:
		return string(b), false, nil
	case err == nil:
		return "", false, fmt.Errorf("%s holds %d bytes, want 1 to 8 (VRRP PASS auth): restore it, or delete it and rerun bootstrap so that every node gets a new one", path, len(b))
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, fmt.Errorf("VRRP auth secret: %w", err)
	case !create:
		return "", false, fmt.Errorf("%w: %s: run `appliance bootstrap`", ErrVRRPAuthMissing, path)
	}
	raw := make([]byte, 6)
	if _, err := rand.Read(raw); err != nil {
		return "", false, err
	}
	secret = base64.RawURLEncoding.EncodeToString(raw) // 8 characters
	if _, err := atomicfile.Write(path, []byte(secret+"\n"), 0o600); err != nil {
		return "", false, err
	}
	return secret, true, nil
}
