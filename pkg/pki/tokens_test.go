package pki

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnsureNodeTokens(t *testing.T) {
	dir := t.TempDir()
	toks, out, err := EnsureNodeTokens(dir, []string{"cp-1", "worker-1", "cp-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !out.Changed || out.Detail != "created 2 node tokens" || len(toks) != 2 {
		t.Fatalf("first call: %+v %d tokens", out, len(toks))
	}
	for node, tok := range toks {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(raw) != 32 {
			t.Errorf("%s: token is not 256 bits base64url: %v (%d bytes)", node, err, len(raw))
		}
		assertMode(t, filepath.Join(dir, "tokens", node), 0o600)
	}
	if toks["cp-1"] == toks["worker-1"] {
		t.Error("two nodes got the same token")
	}
	st, err := os.Stat(filepath.Join(dir, "tokens"))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("tokens dir: %v %v, want 0700", st.Mode().Perm(), err)
	}
	before, err := os.Stat(filepath.Join(dir, "tokens", "cp-1"))
	if err != nil {
		t.Fatal(err)
	}

	// Stable across calls; a node dropped from the list keeps its file and is reported by name only.
	toks2, out, err := EnsureNodeTokens(dir, []string{"cp-1", "worker-2"})
	if err != nil {
		t.Fatal(err)
	}
	if toks2["cp-1"] != toks["cp-1"] || toks2["worker-2"] == "" || len(toks2) != 2 {
		t.Errorf("second call tokens: cp-1 reused=%v, %d tokens", toks2["cp-1"] == toks["cp-1"], len(toks2))
	}
	want := "created 1 node token, reused 1 node token, left 1 token of unlisted nodes in place (worker-1)"
	if !out.Changed || out.Detail != want {
		t.Errorf("second call: %+v, want Detail %q", out, want)
	}
	for _, tok := range toks2 {
		if strings.Contains(out.Detail, tok) {
			t.Error("Detail contains a token")
		}
	}
	if strings.Contains(out.Detail, toks["worker-1"]) {
		t.Error("Detail contains the unlisted node's token")
	}
	if got := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "tokens", "worker-1")))); got != toks["worker-1"] {
		t.Error("unlisted node's token was changed")
	}

	_, out, err = EnsureNodeTokens(dir, []string{"cp-1", "worker-1"})
	if err != nil || out.Changed || out.Detail != "reused 2 node tokens, left 1 token of unlisted nodes in place (worker-2)" {
		t.Errorf("third call: %+v %v", out, err)
	}
	if after, err := os.Stat(filepath.Join(dir, "tokens", "cp-1")); err != nil || !os.SameFile(before, after) {
		t.Error("reuse rewrote a token file (atomic replace gives a new inode)")
	}
	for _, n := range []string{"cp-1", "worker-1"} {
		if got := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "tokens", n)))); got != toks[n] {
			t.Errorf("%s: token changed on disk", n)
		}
	}
}

func TestEnsureNodeTokensFixesMode(t *testing.T) {
	dir := t.TempDir()
	toks, _, err := EnsureNodeTokens(dir, []string{"n1"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tokens", "n1")
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	toks2, out, err := EnsureNodeTokens(dir, []string{"n1"})
	if err != nil || !out.Changed || out.Detail != "reused 1 node token, set mode 0600 on 1" || toks2["n1"] != toks["n1"] {
		t.Errorf("out=%+v err=%v same=%v", out, err, toks2["n1"] == toks["n1"])
	}
	assertMode(t, p, 0o600)
}

func TestEnsureNodeTokensErrors(t *testing.T) {
	tests := []struct {
		name     string
		nodes    []string
		existing string // content planted in tokens/n1
		conflict bool
		want     string
	}{
		{"empty name", []string{""}, "", false, `node name ""`},
		{"path traversal", []string{"../ca.key"}, "", false, "RFC 1123"},
		{"slash", []string{"a/b"}, "", false, "RFC 1123"},
		{"upper case", []string{"Node1"}, "", false, "RFC 1123"},
		{"hidden", []string{".n1"}, "", false, "RFC 1123"},
		{"too long", []string{strings.Repeat("a", 254)}, "", false, "RFC 1123"},
		{"corrupt token", []string{"n1"}, "not-a-token\n", true, "tokens/n1: not a 256-bit base64url token"},
		{"short token", []string{"n1"}, "AAAA\n", true, "tokens/n1: not a 256-bit base64url token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.existing != "" {
				if err := os.MkdirAll(filepath.Join(dir, "tokens"), 0o700); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "tokens", "n1"), []byte(tc.existing))
			}
			toks, _, err := EnsureNodeTokens(dir, tc.nodes)
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrConflict) != tc.conflict {
				t.Fatalf("err = %v, want %q (conflict=%v)", err, tc.want, tc.conflict)
			}
			if toks != nil {
				t.Error("tokens returned with an error")
			}
			if tc.existing != "" {
				if got := string(readFile(t, filepath.Join(dir, "tokens", "n1"))); got != tc.existing {
					t.Error("conflicting token file was overwritten")
				}
				if strings.Contains(err.Error(), strings.TrimSpace(tc.existing)) {
					t.Error("error message leaks the token file's content")
				}
			}
		})
	}
}

func TestVerifyToken(t *testing.T) {
	tok, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		want, got string
		ok        bool
	}{
		{"equal", tok, tok, true},
		{"last char differs", tok, tok[:len(tok)-1] + "x", tok[len(tok)-1] == 'x'},
		{"prefix", tok, tok[:10], false},
		{"longer", tok, tok + "A", false},
		{"empty got", tok, "", false},
		{"empty want and got", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := VerifyToken(tc.want, tc.got); got != tc.ok {
				t.Errorf("VerifyToken = %v, want %v", got, tc.ok)
			}
		})
	}
}

func BenchmarkVerifyToken(b *testing.B) {
	tok, _ := newToken()
	other, _ := newToken()
	for b.Loop() {
		VerifyToken(tok, other)
	}
}

func BenchmarkEnsureServingCertReuse(b *testing.B) {
	dir := b.TempDir()
	ca, _, err := EnsureCA(dir, "bench", t0)
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := EnsureServingCert(dir, ca, testIPs, testDNS, t0); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, out, err := EnsureServingCert(dir, ca, testIPs, testDNS, t0); err != nil || out.Changed {
			b.Fatal(out, err)
		}
	}
}

func BenchmarkEnsureCACreate(b *testing.B) {
	for b.Loop() {
		if _, _, err := EnsureCA(b.TempDir(), "bench", t0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRotateRevokeReadNodeToken: a rotation replaces the token atomically (new inode, 0600, a new
// 256-bit value that EnsureNodeTokens then reuses); a revocation removes it (ReadNodeToken finds
// none, a second revocation reports nothing removed); EnsureNodeTokens creates a revoked node's
// token anew; bad node names are refused before any file is touched.
func TestRotateRevokeReadNodeToken(t *testing.T) {
	dir := t.TempDir()
	toks, _, err := EnsureNodeTokens(dir, []string{"w1"})
	if err != nil {
		t.Fatal(err)
	}
	path := NodeTokenPath(dir, "w1")
	before, _ := os.Stat(path)
	tok, err := RotateNodeToken(dir, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if tok == toks["w1"] || !validToken(tok) {
		t.Fatalf("rotated token equals the old one or is not 256-bit base64url")
	}
	assertMode(t, path, 0o600)
	if after, _ := os.Stat(path); os.SameFile(before, after) {
		t.Error("rotation rewrote the file in place; want an atomic replace (new inode)")
	}
	if got, found, err := ReadNodeToken(dir, "w1"); err != nil || !found || got != tok {
		t.Errorf("ReadNodeToken after rotation: found=%v err=%v, same=%v", found, err, got == tok)
	}
	if again, _, err := EnsureNodeTokens(dir, []string{"w1"}); err != nil || again["w1"] != tok {
		t.Errorf("EnsureNodeTokens after rotation: %v, reused=%v", err, again["w1"] == tok)
	}

	if had, err := RevokeNodeToken(dir, "w1"); err != nil || !had {
		t.Fatalf("revoke: had=%v err=%v", had, err)
	}
	if _, found, err := ReadNodeToken(dir, "w1"); err != nil || found {
		t.Errorf("ReadNodeToken after revocation: found=%v err=%v", found, err)
	}
	if had, err := RevokeNodeToken(dir, "w1"); err != nil || had {
		t.Errorf("second revoke: had=%v err=%v, want nothing removed", had, err)
	}
	fresh, out, err := EnsureNodeTokens(dir, []string{"w1"})
	if err != nil || !out.Changed || fresh["w1"] == tok || fresh["w1"] == toks["w1"] {
		t.Errorf("EnsureNodeTokens after revocation: %+v %v; want a new token", out, err)
	}

	// A first rotation creates the tokens directory and file.
	if _, err := RotateNodeToken(dir, "w2"); err != nil {
		t.Fatal(err)
	}
	assertMode(t, NodeTokenPath(dir, "w2"), 0o600)

	for _, bad := range []string{"", "../x", "W1", ".hidden"} {
		if _, err := RotateNodeToken(dir, bad); err == nil {
			t.Errorf("RotateNodeToken(%q): no error", bad)
		}
		if _, err := RevokeNodeToken(dir, bad); err == nil {
			t.Errorf("RevokeNodeToken(%q): no error", bad)
		}
	}
	if err := os.WriteFile(NodeTokenPath(dir, "w3"), []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadNodeToken(dir, "w3"); !errors.Is(err, ErrConflict) || strings.Contains(err.Error(), "short") {
		t.Errorf("ReadNodeToken of a bad file: %v, want ErrConflict without the content", err)
	}
}
