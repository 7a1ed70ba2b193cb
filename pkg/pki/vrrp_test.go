package pki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVRRPAuthCreateReuseRefuse(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := EnsureVRRPAuth(dir, false); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("without create, a missing secret must be an error naming it: %v", err)
	}
	s1, created, err := EnsureVRRPAuth(dir, true)
	if err != nil || !created || len(s1) != 8 {
		t.Fatalf("create: %q %v %v", s1, created, err)
	}
	path := filepath.Join(dir, VRRPAuthFile)
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if s2, created, err := EnsureVRRPAuth(dir, true); err != nil || created || s2 != s1 {
		t.Fatalf("reuse: %q %v %v, want %q unchanged", s2, created, err, s1)
	}
	if err := os.WriteFile(path, []byte("far-too-long-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = EnsureVRRPAuth(dir, true)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a damaged secret must be refused, naming the file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "far-too-long-secret\n" {
		t.Fatalf("the damaged secret was replaced: %q", b)
	}
}
