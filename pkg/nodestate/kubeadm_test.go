package nodestate

import (
	"testing"
)

// TestRanKubeadm: a node has run kubeadm once it reports the step done, and stays so across a
// reboot (which forgets status.json's steps) until it is removed; added again, it has not.
func TestRanKubeadm(t *testing.T) {
	s := Open(t.TempDir())
	ran := func(want bool, when string) {
		t.Helper()
		got, err := s.RanKubeadm("cp1")
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s: RanKubeadm = %v, want %v", when, got, want)
		}
	}
	record := func(boot, step, status string) {
		t.Helper()
		if _, _, err := s.Record("cp1", nil, rep(boot, step, status, "")); err != nil {
			t.Fatal(err)
		}
	}
	ran(false, "no record")
	if err := s.RecordLifecycle("cp1", Added, "bootstrap"); err != nil {
		t.Fatal(err)
	}
	record("boot-1", "config", "done")
	record("boot-1", "kubeadm", "running")
	ran(false, "kubeadm running")
	record("boot-1", "kubeadm", "done")
	ran(true, "kubeadm done")
	record("boot-2", "config", "done") // rebooted before it was ever ready
	if st, _ := s.Get("cp1"); len(st.Steps) != 1 {
		t.Fatalf("a new boot keeps steps: %v", st.Steps)
	}
	ran(true, "after a reboot before ready")
	if err := s.RecordLifecycle("cp1", Removed, "node remove"); err != nil {
		t.Fatal(err)
	}
	ran(false, "removed")
	if err := s.RecordLifecycle("cp1", Added, "bootstrap"); err != nil {
		t.Fatal(err)
	}
	record("boot-3", "config", "done")
	ran(false, "added again")
}

// TestRanKubeadmFromHistory: a node that joined before the mark existed (no kubeadm-done.json) and
// rebooted counts by its history (ready since added).
func TestRanKubeadmFromHistory(t *testing.T) {
	s := Open(t.TempDir())
	if err := s.RecordLifecycle("w1", Added, "bootstrap"); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordLifecycle("w1", Ready, "first ready"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RanKubeadm("w1"); err != nil || !got {
		t.Fatalf("RanKubeadm = %v, %v; want true", got, err)
	}
	if _, err := s.RanKubeadm("../x"); err == nil {
		t.Fatal("a node name with a path was accepted")
	}
}
