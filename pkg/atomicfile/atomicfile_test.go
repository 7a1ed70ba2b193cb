package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
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

// TestWriteFrom: a streamed write replaces the file with the reader's bytes and mode; a reader that
// fails leaves the old content and no temporary file.
func TestWriteFrom(t *testing.T) {
	p := filepath.Join(t.TempDir(), "node-amd64.iso")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("iso9660 ", 1<<17) // 1 MiB, more than one io.Copy buffer
	if err := WriteFrom(p, strings.NewReader(big), 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if got, _ := os.ReadFile(p); string(got) != big || st.Mode().Perm() != 0o644 {
		t.Fatalf("got %d bytes mode %v, want %d bytes 0644", len(got), st.Mode().Perm(), len(big))
	}
	boom := errors.New("the source file went away")
	if err := WriteFrom(p, io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(boom)), 0o644); !errors.Is(err, boom) {
		t.Fatalf("failing reader: %v, want its error", err)
	}
	if got, _ := os.ReadFile(p); string(got) != big {
		t.Errorf("a failed write changed the file (%d bytes)", len(got))
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

// TestHelperWriter is not a test: run by TestCleanStale as a child process (ATOMICFILE_HELPER_DIR set),
// it starts a write the way Write does, prints the temporary file's name and blocks until killed.
func TestHelperWriter(t *testing.T) {
	dir := os.Getenv("ATOMICFILE_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process for TestCleanStale")
	}
	tmp, err := os.CreateTemp(dir, tempPrefix(filepath.Join(dir, "ca.key"))+"*")
	if err != nil {
		os.Exit(2)
	}
	_, _ = tmp.WriteString("-----BEGIN PRIVATE KEY-----\n")
	fmt.Println(tmp.Name())
	select {}
}

// TestCleanStale: a real writer process killed (SIGKILL) in the middle of a write leaves its
// temporary file; CleanStale keeps it while the writer lives and removes it once the writer is gone.
// Files without a PID (older writers) go when older than a minute; other files and skipped
// directories are left alone.
func TestCleanStale(t *testing.T) {
	root := t.TempDir()
	pkiDir := filepath.Join(root, "pki")
	skipDir := filepath.Join(root, "registry")
	for _, d := range []string{pkiDir, skipDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_HELPER_DIR="+pkiDir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper writer: %v", err)
	}
	childTmp := strings.TrimSpace(line)

	old := time.Now().Add(-2 * time.Hour)
	write := func(p string, age time.Time) string {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, age, age); err != nil {
			t.Fatal(err)
		}
		return p
	}
	legacyOld := write(filepath.Join(pkiDir, ".serving.crt.tmp-123456"), old)
	legacyNew := write(filepath.Join(root, ".journal.tmp-654321"), time.Now())
	mine := write(filepath.Join(root, tempPrefix(filepath.Join(root, "x"))+"42"), old)
	deadTok := write(filepath.Join(pkiDir, ".node1.tmp-999999999-7"), old) // PID beyond pid_max
	plain := write(filepath.Join(pkiDir, "ca.key"), old)
	skipped := write(filepath.Join(skipDir, ".data.tmp-1-2"), old)

	removed, err := CleanStale(root, "registry")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{deadTok, legacyOld}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("first sweep removed %v, want %v", removed, want)
	}
	for _, p := range []string{childTmp, legacyNew, mine, plain, skipped} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s (live writer's, fresh, or not a temporary file) was removed: %v", p, err)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	removed, err = CleanStale(root, "registry")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{childTmp}) {
		t.Errorf("after the writer's SIGKILL CleanStale removed %v, want [%s]", removed, childTmp)
	}
	if _, err := os.Stat(childTmp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("killed writer's temporary file still there: %v", err)
	}
	if removed, err := CleanStale(filepath.Join(root, "nosuch")); err != nil || len(removed) != 0 {
		t.Errorf("missing root: %v %v, want nothing and no error", removed, err)
	}
}

// TestTempNameIsSwept: a TempName of a dead writer, a regular file or a symlink (the registry import
// renames hard links and symlinks into place), is removed by CleanStale; this process's is not.
func TestTempNameIsSwept(t *testing.T) {
	root := t.TempDir()
	mine := TempName(filepath.Join(root, "link"))
	if !strings.HasPrefix(filepath.Base(mine), fmt.Sprintf(".link.tmp-%d-", os.Getpid())) {
		t.Fatalf("TempName = %s, want .link.tmp-%d-N", mine, os.Getpid())
	}
	dead := filepath.Join(root, ".data.tmp-2147483646-5") // a PID above any pid_max
	for _, p := range []string{mine, dead} {
		if err := os.Symlink("/nonexistent", p); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := CleanStale(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Errorf("removed %v, want only %s", removed, dead)
	}
}
