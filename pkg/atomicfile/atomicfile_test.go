package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "secret")
	changed, err := Write(p, []byte("a"), 0o600)
	if err != nil || !changed {
		t.Fatalf("first write: changed=%v err=%v", changed, err)
	}
	if changed, err = Write(p, []byte("a"), 0o600); err != nil || changed {
		t.Fatalf("identical write: changed=%v err=%v, want false,nil", changed, err)
	}
	if changed, err = Write(p, []byte("a"), 0o644); err != nil || !changed {
		t.Fatalf("mode change: changed=%v err=%v, want true,nil", changed, err)
	}
	if changed, err = Write(p, []byte("b"), 0o600); err != nil || !changed {
		t.Fatalf("content change: changed=%v err=%v", changed, err)
	}
	st, _ := os.Stat(p)
	got, _ := os.ReadFile(p)
	if string(got) != "b" || st.Mode().Perm() != 0o600 {
		t.Fatalf("got %q mode %v", got, st.Mode().Perm())
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}
