package bootstrap

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHostagentSHA256Memo: the served hostagent is hashed once per run while its path, size and
// modification time stay (the render phase, the hand-off's re-renders and the upgrade phase share
// it); a file with another modification time is hashed again.
func TestHostagentSHA256Memo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hostagent")
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	write := func(b []byte, mtime time.Time) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	write([]byte("build one"), t0)
	st := &State{Options: Options{HostagentBinary: path}}
	if got, err := st.hostagentSHA256(); err != nil || got != sum([]byte("build one")) {
		t.Fatalf("first hash: %s %v", got, err)
	}
	// Same path, size and time: the memo answers (the file is not read again).
	write([]byte("build two"), t0)
	if got, _ := st.hostagentSHA256(); got != sum([]byte("build one")) {
		t.Errorf("unchanged key: %s, want the memoized hash", got)
	}
	// A new modification time: hashed again.
	write([]byte("build two"), t0.Add(time.Second))
	if got, _ := st.hostagentSHA256(); got != sum([]byte("build two")) {
		t.Errorf("after a new build: %s, want %s", got, sum([]byte("build two")))
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := st.hostagentSHA256(); err == nil {
		t.Error("a missing hostagent binary gave no error")
	}
}
