package bootstrap

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Journal is the append-only record of phase outcomes, STATE/journal.jsonl: one Event per line,
// fsynced after each append. A line torn by a crash is ignored on read.
type Journal struct {
	f *os.File
}

// OpenJournal opens (creating 0600) the journal in stateDir.
func OpenJournal(stateDir string) (*Journal, error) {
	f, err := os.OpenFile(statedir.Journal(stateDir), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return &Journal{f: f}, nil
}

// Append writes one event and fsyncs.
func (j *Journal) Append(ev Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("append to journal: %w", err)
	}
	return j.f.Sync()
}

// Close closes the journal file.
func (j *Journal) Close() error { return j.f.Close() }

// ReadJournal returns every intact event in stateDir's journal, oldest first (none if there is no
// journal yet).
func ReadJournal(stateDir string) ([]Event, error) {
	f, err := os.Open(statedir.Journal(stateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Phase != "" {
			out = append(out, ev)
		}
	}
	return out, sc.Err()
}

// ErrLocked is returned when another `appliance bootstrap` holds the state directory.
var ErrLocked = errors.New("another appliance bootstrap is running on this state directory")

// lockStateDir takes an exclusive flock on STATE/bootstrap.lock; the kernel drops it when the
// process dies, so a killed run never leaves a stale lock.
func lockStateDir(stateDir string) (func(), error) {
	f, err := os.OpenFile(statedir.Lock(stateDir), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w (%s); wait for it or stop it", ErrLocked, stateDir)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
