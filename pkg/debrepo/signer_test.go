package debrepo

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp/packet"
)

func TestEnsureRepoKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys", "repo-signing.asc")
	s, created, err := EnsureRepoKey(p)
	if err != nil || !created {
		t.Fatalf("first use: created=%v err=%v", created, err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v mode %v, want 0600", err, st.Mode())
	}
	if dst, _ := os.Stat(filepath.Dir(p)); dst.Mode().Perm() != 0o700 {
		t.Errorf("key directory mode %v, want 0700", dst.Mode().Perm())
	}
	data := readFile(t, p)
	if !bytes.HasPrefix(data, []byte("-----BEGIN PGP PRIVATE KEY BLOCK-----")) {
		t.Errorf("key file is not an armored private key:\n%s", data)
	}
	if s.entity.PrimaryKey.PubKeyAlgo != packet.PubKeyAlgoEdDSA || s.entity.PrimaryKey.Version != 4 || len(s.entity.Subkeys) != 0 {
		t.Errorf("key: algorithm %v version %d subkeys %d, want EdDSA (22) v4 signing-only", s.entity.PrimaryKey.PubKeyAlgo, s.entity.PrimaryKey.Version, len(s.entity.Subkeys))
	}
	again, created, err := EnsureRepoKey(p)
	if err != nil || created || again.Fingerprint() != s.Fingerprint() {
		t.Fatalf("second use: created=%v err=%v fingerprint %s, want %s", created, err, again.Fingerprint(), s.Fingerprint())
	}
	if len(s.KeyID()) != 16 || !strings.HasSuffix(s.Fingerprint(), s.KeyID()) {
		t.Errorf("KeyID %s, Fingerprint %s", s.KeyID(), s.Fingerprint())
	}
	// The exported keyring verifies what the key signs, and holds no secret.
	kr, err := ReadKeyring(writeKeyring(t, s, t.TempDir(), "pub.gpg"))
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("Origin: test\n")
	sig, err := again.DetachSign(msg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyDetached(msg, sig, kr, time.Now()); err != nil {
		t.Error(err)
	}

	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"garbage", []byte("hello\n"), "invalid repository signing key"},
		{"public key", readFile(t, kr.Path), "no private key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "k.asc")
			if err := os.WriteFile(bad, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := EnsureRepoKey(bad)
			if !errors.Is(err, ErrRepoKey) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "never replaced") {
				t.Fatalf("got %v, want ErrRepoKey %q", err, tc.want)
			}
			if !bytes.Equal(readFile(t, bad), tc.data) {
				t.Error("the refused file was changed")
			}
		})
	}
}

// TestEnsureRepoKeyConcurrent: processes racing to create the key all end up with the same one.
func TestEnsureRepoKeyConcurrent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "repo.asc")
	var wg sync.WaitGroup
	fps := make([]string, 4)
	for i := range fps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, err := EnsureRepoKey(p)
			if err != nil {
				t.Error(err)
				return
			}
			fps[i] = s.Fingerprint()
		}()
	}
	wg.Wait()
	for _, fp := range fps[1:] {
		if fp != fps[0] {
			t.Fatalf("fingerprints differ: %v", fps)
		}
	}
}

func TestSignaturesDeterministic(t *testing.T) {
	s := testKey(t)
	when := time.Now().Add(time.Hour)
	a, _ := s.ClearSign([]byte("Origin: x\n"), when)
	b, _ := s.ClearSign([]byte("Origin: x\n"), when)
	c, _ := s.DetachSign([]byte("Origin: x\n"), when)
	d, _ := s.DetachSign([]byte("Origin: x\n"), when)
	if !bytes.Equal(a, b) || !bytes.Equal(c, d) {
		t.Error("signing the same text at the same time twice gave different bytes")
	}
	if !bytes.Contains(a, []byte("\nHash: SHA512\n")) {
		t.Errorf("clear-signed header:\n%s", a)
	}
}

func TestSplitPackets(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		n    int
		err  bool
	}{
		{"new format 1-octet", []byte{0xc2, 0x02, 1, 2, 0xc2, 0x00}, 2, false},
		{"new format 2-octet", append([]byte{0xc2, 0xc0, 0x00}, make([]byte, 192)...), 1, false},
		{"new format 5-octet", append([]byte{0xc2, 0xff, 0, 0, 0, 3}, 1, 2, 3), 1, false},
		{"legacy 1-octet", []byte{0x88, 0x01, 9}, 1, false},
		{"legacy 2-octet", []byte{0x89, 0x00, 0x01, 9}, 1, false},
		{"partial length", []byte{0xc2, 0xe1, 0}, 0, true},
		{"indeterminate", []byte{0x8b, 0}, 0, true},
		{"truncated", []byte{0xc2, 0x05, 1}, 0, true},
		{"not a packet", []byte{0x02}, 0, true},
	} {
		got, err := splitPackets(tc.in)
		if (err != nil) != tc.err || len(got) != tc.n {
			t.Errorf("%s: %d packets, err %v", tc.name, len(got), err)
		}
	}
}
