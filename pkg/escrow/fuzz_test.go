package escrow

import (
	"strings"
	"testing"
)

// FuzzUnpack feeds arbitrary plaintext to what Open does after decryption (a key holder controls
// it): it must never panic, and whatever it accepts holds only Contents paths that match the manifest.
func FuzzUnpack(f *testing.F) {
	state, _ := fakeState(f)
	plain, _, err := archive(state, testInfo)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(plain)
	f.Add([]byte{})
	f.Add([]byte("\x1f\x8b\x08\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := unpack(data)
		if err != nil {
			return
		}
		if len(e.files) != len(e.Manifest.Files) {
			t.Fatalf("%d files, manifest %d", len(e.files), len(e.Manifest.Files))
		}
		for _, p := range e.Paths() {
			if !escrowed(p) || hidden(p) || strings.Contains(p, "..") {
				t.Fatalf("accepted %q", p)
			}
		}
	})
}

// FuzzParseRecipient: bootstrap.yaml's escrow.recipients entries never panic the parser, and a
// private key never comes back in the error.
func FuzzParseRecipient(f *testing.F) {
	for _, s := range []string{"age1g75egrjfyf9crvzrmtdyjn8pgkx7406fpjatw345nq5s6l0xwdgswu4wxu", "age1pq1", "AGE-SECRET-KEY-1X", "", "ssh-ed25519 AAAA"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRecipient(s)
		if err == nil && r.r == nil {
			t.Fatal("no recipient and no error")
		}
		if err != nil && strings.HasPrefix(strings.ToUpper(strings.TrimSpace(s)), "AGE-SECRET-KEY-") && len(s) > 20 && strings.Contains(err.Error(), strings.TrimSpace(s)) {
			t.Fatal("the error repeats a private key")
		}
	})
}
