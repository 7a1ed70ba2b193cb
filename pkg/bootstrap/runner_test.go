package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// fakePhase records what the runner did with it. The first phase of a test list plays load: it sets
// the state directory.
type fakePhase struct {
	name     string
	stateDir string // set by the load stand-in
	changed  bool
	err      error
	loader   bool
	check    func(st *State) // runs inside Run
	log      *[]string
}

func (f *fakePhase) Name() string { return f.name }
func (f *fakePhase) Run(_ context.Context, st *State) (Result, error) {
	*f.log = append(*f.log, "run "+f.name)
	if f.stateDir != "" {
		st.StateDir = f.stateDir
	}
	if f.check != nil {
		f.check(st)
	}
	return Result{Changed: f.changed, Detail: f.name + " detail"}, f.err
}

// loaderPhase is a fakePhase that can read its result back (Loader).
type loaderPhase struct{ *fakePhase }

func (l loaderPhase) Load(_ context.Context, st *State) error {
	*l.log = append(*l.log, "load "+l.name)
	return nil
}

func phasesFor(dir string, log *[]string, extra ...*fakePhase) []Phase {
	out := []Phase{&fakePhase{name: "load", stateDir: dir, log: log}}
	for _, p := range extra {
		p.log = log
		if p.loader {
			out = append(out, loaderPhase{p})
		} else {
			out = append(out, p)
		}
	}
	return out
}

func TestRunnerLockJournalAndOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var log []string
	var lockedDuringRun error
	phases := phasesFor(dir, &log,
		&fakePhase{name: "a", changed: true, check: func(st *State) {
			// The runner holds the state directory's lock while phases run.
			unlock, err := lockStateDir(st.StateDir)
			if err == nil {
				unlock()
			}
			lockedDuringRun = err
		}},
		&fakePhase{name: "b", loader: true},
		&fakePhase{name: "c"})
	var out bytes.Buffer
	sum, err := runPhases(context.Background(), Options{SkipPhases: []string{"b"}, Progress: &out}, phases)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(lockedDuringRun, ErrLocked) {
		t.Errorf("taking the lock inside a phase = %v, want ErrLocked (the runner holds it)", lockedDuringRun)
	}
	if want := []string{"run load", "run a", "load b", "run c"}; !slices.Equal(log, want) {
		t.Errorf("calls %v, want %v (a skipped Loader phase is loaded, not run)", log, want)
	}
	if !sum.Changed {
		t.Error("summary not changed although phase a changed something")
	}
	evs, err := ReadJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Phase+":"+ev.Status)
	}
	if want := []string{"load:done", "a:done", "b:skipped", "c:done"}; !slices.Equal(got, want) {
		t.Errorf("journal %v, want %v", got, want)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v %v, want 0700", st, err)
	}
	if !strings.Contains(out.String(), "[2/4] a: a detail") || !strings.Contains(out.String(), "[3/4] b: skipped") {
		t.Errorf("progress:\n%s", out.String())
	}
	// The lock is released when Run returns.
	unlock, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after Run: %v", err)
	}
	unlock()
}

func TestRunnerRefusesBadSkipsBeforeAnything(t *testing.T) {
	for _, skip := range []string{"load", "nosuch"} {
		dir := filepath.Join(t.TempDir(), "state")
		var log []string
		_, err := runPhases(context.Background(), Options{SkipPhases: []string{skip}}, phasesFor(dir, &log, &fakePhase{name: "a"}))
		if err == nil || !strings.Contains(err.Error(), skip) {
			t.Errorf("--skip-phases %s: %v, want an error naming it", skip, err)
		}
		if len(log) != 0 {
			t.Errorf("--skip-phases %s: phases ran: %v", skip, log)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--skip-phases %s: state directory created", skip)
		}
	}
}

func TestRunnerStopsAtFailure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var log []string
	_, err := runPhases(context.Background(), Options{}, phasesFor(dir, &log,
		&fakePhase{name: "a", err: errors.New("boom")}, &fakePhase{name: "b"}))
	if err == nil || !strings.Contains(err.Error(), "phase a: boom") {
		t.Fatalf("err = %v", err)
	}
	if slices.Contains(log, "run b") {
		t.Error("a phase ran after a failure")
	}
	evs, _ := ReadJournal(dir)
	if len(evs) != 2 || evs[1].Status != StatusFailed || evs[1].Error != "boom" {
		t.Errorf("journal %+v, want load done and a failed", evs)
	}
}

func TestRunnerDryRunWritesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var log []string
	sum, err := runPhases(context.Background(), Options{DryRun: true}, phasesFor(dir, &log, &fakePhase{name: "a", changed: true}))
	if err != nil || !sum.Changed {
		t.Fatalf("dry run: %v, changed %v", err, sum.Changed)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Error("a dry run on a fresh state created the state directory")
	}
	// On an existing state directory: locked, but no journal is written.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := runPhases(context.Background(), Options{DryRun: true}, phasesFor(dir, &log, &fakePhase{name: "a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(statedir.Journal(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Error("a dry run wrote the journal")
	}
}

func TestWriteRendered(t *testing.T) {
	state := t.TempDir()
	files := map[string][]byte{"cp1/hostagent.yaml": []byte("a"), "cp1/ignition/3.5.0.json": []byte("{}"), "appliance/firewall.json": []byte("{}")}
	written, removed, err := writeRendered(state, files, false)
	if err != nil || len(written) != 3 || len(removed) != 0 {
		t.Fatalf("first write: %v %v %v", written, removed, err)
	}
	for _, p := range []string{filepath.Join(statedir.Rendered(state), "cp1", "hostagent.yaml"), filepath.Join(statedir.Appliance(state), "firewall.json")} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want 0600", p, st, err)
		}
	}
	if written, removed, _ := writeRendered(state, files, false); len(written)+len(removed) != 0 {
		t.Errorf("second write changed %v %v", written, removed)
	}
	// A node gone from the plan: dry run reports its files, removes nothing; the real run removes them.
	delete(files, "cp1/ignition/3.5.0.json")
	files["cp1/hostagent.yaml"] = []byte("b")
	written, removed, _ = writeRendered(state, files, true)
	if !slices.Equal(written, []string{"cp1/hostagent.yaml"}) || len(removed) != 1 {
		t.Errorf("dry run: written %v removed %v", written, removed)
	}
	if b, _ := os.ReadFile(filepath.Join(statedir.Rendered(state), "cp1", "hostagent.yaml")); string(b) != "a" {
		t.Error("dry run wrote a file")
	}
	if _, removed, _ = writeRendered(state, files, false); len(removed) != 1 {
		t.Errorf("removed %v", removed)
	}
	if _, err := os.Stat(filepath.Join(statedir.Rendered(state), "cp1", "ignition")); !errors.Is(err, os.ErrNotExist) {
		t.Error("empty ignition directory left behind")
	}
}

// TestRunnerRemovesCrashLeftovers: a run killed in the pki phase leaves the atomic writers' temporary
// files (.ca.key.tmp-*, .serving.crt.tmp-*, token temporaries; the key's holds the key) and a dry
// run's scratch copy of the PKI; the next run removes them all before any phase after load runs. The
// registry's storage is left to the registry.
func TestRunnerRemovesCrashLeftovers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	old := time.Now().Add(-time.Hour)
	var leftovers []string
	for _, rel := range []string{
		"pki/.ca.key.tmp-2147483646-12345",        // a dead writer's PID (above any pid_max)
		"pki/.serving.crt.tmp-2147483646-99",      //
		"pki/tokens/.node1.tmp-2147483646-5",      //
		"pki/.ca.key.tmp-3141592653",              // written before temporary names carried a PID
		"pki/kubernetes/.ca.key.tmp-2147483646-1", //
		".dry-run-123456/pki/ca.key",              // a killed dry run's PKI copy
		"rendered/node1/.hostagent.yaml.tmp-2147483646-8",
	} {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("-----BEGIN PRIVATE KEY-----\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_ = os.Chtimes(p, old, old)
		leftovers = append(leftovers, p)
	}
	// The bundle import's temporary link and blob in the registry's storage (atomicfile.TempName): a
	// hard link (regular file) and a symlink into the bundle. Before, the registry was not swept.
	blobs := filepath.Join(dir, "registry", "docker", "registry", "v2", "blobs", "sha256", "ab", "abcd")
	repo := filepath.Join(dir, "registry", "docker", "registry", "v2", "repositories", "r", "_layers", "sha256", "abcd")
	for _, d := range []string{blobs, repo} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	regTmp := filepath.Join(repo, ".link.tmp-2147483646-77")
	if err := os.WriteFile(regTmp, []byte("sha256:abcd"), 0o644); err != nil {
		t.Fatal(err)
	}
	regLink := filepath.Join(blobs, ".data.tmp-2147483646-78")
	if err := os.Symlink("/nonexistent/bundle/blob", regLink); err != nil {
		t.Fatal(err)
	}
	leftovers = append(leftovers, regTmp, regLink)
	// Distribution's own files are never touched.
	keep := filepath.Join(blobs, "data")
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var log []string
	var seen []string
	_, err := runPhases(context.Background(), Options{}, phasesFor(dir, &log, &fakePhase{name: "pki", check: func(st *State) {
		for _, p := range leftovers {
			if _, err := os.Lstat(p); err == nil {
				seen = append(seen, p)
			}
		}
	}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 0 {
		t.Errorf("leftovers of a killed run still there when the next run's phases run: %v", seen)
	}
	if _, err := os.Stat(filepath.Join(dir, ".dry-run-123456")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a killed dry run's scratch directory is still there: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("the registry's files were touched: %v", err)
	}
}
