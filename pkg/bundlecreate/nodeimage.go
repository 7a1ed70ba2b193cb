package bundlecreate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/iso"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/bundle"
)

// NodeImageResult is what the node-image step put into the bundle.
type NodeImageResult struct {
	// Bytes maps each of bundle.NodeImageFiles (paths relative to the bundle) to its size.
	Bytes map[string]int64
	// Took is the step's wall time (the Debian system is cached by content: a rebuild with the same
	// packages takes seconds).
	Took time.Duration
}

// String is a progress line: "vmlinuz 8.1 MiB, initrd.img …, in 41s".
func (r NodeImageResult) String() string {
	var parts []string
	for _, f := range bundle.NodeImageFiles {
		parts = append(parts, fmt.Sprintf("%s %.1f MiB", path.Base(f), float64(r.Bytes[f])/(1<<20)))
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" in %s", r.Took.Round(time.Second))
}

// NodeImageStep is the node-image step (Options.NodeImage): it writes the recipe carried by this
// binary (package iso) to a scratch directory beside the bundle (bundleDir + ".work/node-image"), runs
// it with bash against the bundle's repository and with hostagent (the agent binary to put in the
// image), and places its files in bundleDir/bundle.NetbootDir, each by an atomic rename, so that a kill
// leaves either the old file or the new one. The recipe's product is cached there by content, so a
// rerun after a kill reuses it. Errors carry the recipe's last log lines (it needs root, debootstrap
// and the Debian mirror; it says which tool is missing).
func NodeImageStep(hostagent string) func(ctx context.Context, bundleDir string, emit func(Event)) (NodeImageResult, error) {
	return func(ctx context.Context, bundleDir string, emit func(Event)) (NodeImageResult, error) {
		start := time.Now()
		res := NodeImageResult{Bytes: map[string]int64{}}
		if hostagent == "" {
			return res, errors.New("no hostagent binary to put in the node image: install hostagent beside the appliance executable")
		}
		if st, err := os.Stat(hostagent); err != nil || !st.Mode().IsRegular() {
			return res, fmt.Errorf("hostagent binary %s: not a regular file (%v): install hostagent beside the appliance executable", hostagent, err)
		}
		work := filepath.Join(filepath.Clean(bundleDir)+".work", "node-image")
		recipeDir := filepath.Join(work, "recipe")
		if err := os.RemoveAll(recipeDir); err != nil {
			return res, err
		}
		if err := os.MkdirAll(recipeDir, 0o755); err != nil {
			return res, err
		}
		script, err := iso.WriteNodeImageRecipe(recipeDir)
		if err != nil {
			return res, fmt.Errorf("write the node image recipe: %w", err)
		}
		out := filepath.Join(work, "out")
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", script, "--bundle", bundleDir, "--hostagent", hostagent, "--out", out)
		cmd.Stderr = &lineWriter{buf: &stderr, line: func(l string) { emit(Event{Step: "node-image", Status: "log", Detail: l}) }}
		if err := cmd.Run(); err != nil {
			return res, fmt.Errorf("%s: %v\n%s", script, err, lastLines(stderr.String(), 15))
		}
		if err := os.MkdirAll(filepath.Join(bundleDir, bundle.NetbootDir), 0o755); err != nil {
			return res, err
		}
		for _, f := range bundle.NodeImageFiles {
			n, err := placeFile(filepath.Join(out, path.Base(f)), filepath.Join(bundleDir, filepath.FromSlash(f)))
			if err != nil {
				return res, err
			}
			res.Bytes[f] = n
		}
		res.Took = time.Since(start)
		return res, nil
	}
}

// placeFile puts src at dst by a hard link to a temporary name in dst's directory and an atomic
// rename, or, across file systems, by a streamed atomic copy (atomicfile.WriteFrom, 0644); it returns
// the size.
func placeFile(src, dst string) (int64, error) {
	st, err := os.Stat(src)
	if err != nil {
		return 0, fmt.Errorf("the node image recipe did not make %s: %w", filepath.Base(src), err)
	}
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		in, err := os.Open(src)
		if err != nil {
			return 0, err
		}
		defer in.Close()
		return st.Size(), atomicfile.WriteFrom(dst, in, 0o644)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return 0, err
	}
	return st.Size(), nil
}

// lineWriter keeps everything written to it and calls line for each complete line.
type lineWriter struct {
	buf     *bytes.Buffer
	pending []byte
	line    func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	w.pending = append(w.pending, p...)
	for {
		i := bytes.IndexByte(w.pending, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(w.pending[:i]))
		w.pending = w.pending[i+1:]
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
