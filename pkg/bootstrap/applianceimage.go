package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/version"
	"github.com/airgap-appliance/appliance/registry"
)

// ApplianceImageRepository is the repository under which the appliance's registry serves the
// appliance's own executable as an image (registry.WriteExecutableImage): the hand-off's in-cluster
// mirror runs it as a static pod on the control planes. "appliance.local" is a registry host no
// upstream owns; nodes get a hosts.toml for it like for every registry of the bundle.
const ApplianceImageRepository = "appliance.local/airgap-appliance/appliance"

// applianceImageStamp identifies the executable an image was made of, so that a rerun with the same
// file reuses the image without reading 55 MB again (it matters under TCG, where hashing runs at
// ~45 MB/s).
type applianceImageStamp struct {
	Path  string                   `json:"path"`
	Size  int64                    `json:"size"`
	MTime int64                    `json:"mtimeNs"`
	Inode uint64                   `json:"inode"`
	Image registry.ExecutableImage `json:"image"`
}

var tagUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// applianceImage makes the appliance executable (Options.ApplianceBinary, default this process) an
// image in STATE/appliance-image/layout and, unless dryRun, imports it into the registry. With dryRun
// nothing is written: it checks what an earlier run left. The tag is "<version>-<first 12 hex of the
// layer's SHA-256>" (registry.WriteExecutableImage), so two builds never share one; the executable is
// read and hashed once.
func applianceImage(ctx context.Context, st *State, dryRun bool) (registry.ImportResult, registry.ExecutableImage, bool, error) {
	bin := st.Options.ApplianceBinary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return registry.ImportResult{}, registry.ExecutableImage{}, false, err
		}
	}
	if abs, err := filepath.Abs(bin); err == nil {
		bin = abs
	}
	dir := statedir.ApplianceImage(st.StateDir)
	layoutDir := filepath.Join(dir, "layout")
	stampPath := filepath.Join(dir, "stamp.json")
	fi, err := os.Stat(bin)
	if err != nil {
		return registry.ImportResult{}, registry.ExecutableImage{}, false, fmt.Errorf("the appliance executable: %w", err)
	}
	cur := applianceImageStamp{Path: bin, Size: fi.Size(), MTime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		cur.Inode = sys.Ino
	}
	var img registry.ExecutableImage
	var old applianceImageStamp
	if b, err := os.ReadFile(stampPath); err == nil && json.Unmarshal(b, &old) == nil {
		if old.Path == cur.Path && old.Size == cur.Size && old.MTime == cur.MTime && old.Inode == cur.Inode {
			img = old.Image
		}
	}
	if img.Digest == "" {
		if dryRun {
			return registry.ImportResult{}, registry.ExecutableImage{}, false, nil
		}
		prefix := tagUnsafe.ReplaceAllString(strings.TrimPrefix(version.Version, "v"), "_") + "-"
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return registry.ImportResult{}, registry.ExecutableImage{}, false, err
		}
		// One read and one hash of the executable: the tag's digits are the layer's digest.
		if img, err = registry.WriteExecutableImage(layoutDir, ApplianceImageRepository, prefix, bin); err != nil {
			return registry.ImportResult{}, registry.ExecutableImage{}, false, err
		}
		cur.Image = img
		b, _ := json.MarshalIndent(cur, "", "  ")
		if _, err := atomicfile.Write(stampPath, b, 0o644); err != nil {
			return registry.ImportResult{}, registry.ExecutableImage{}, false, err
		}
	}
	if dryRun {
		ir, ok, err := registry.Check(layoutDir, statedir.Registry(st.StateDir))
		return ir, img, ok, err
	}
	ir, err := registry.Import(ctx, layoutDir, statedir.Registry(st.StateDir), st.Options.Logger)
	return ir, img, !ir.Changed, err
}

// mergeImports adds b's images and registries to a (the bundle's import result).
func mergeImports(a, b registry.ImportResult) registry.ImportResult {
	a.Images = append(append([]registry.Image(nil), a.Images...), b.Images...)
	seen := map[string]bool{}
	var regs []string
	for _, r := range append(append([]string(nil), a.Registries...), b.Registries...) {
		if !seen[r] {
			seen[r] = true
			regs = append(regs, r)
		}
	}
	slices.Sort(regs)
	a.Registries = regs
	a.Blobs += b.Blobs
	a.Linked += b.Linked
	a.Copied += b.Copied
	a.Changed = a.Changed || b.Changed
	return a
}
