// Package layout checks the house rules of the import graph (issue 9) with the Go tool's own view of
// it (`go list -deps`), non-test code only: the node↔appliance contract is pkg/agentapi, so the node
// agent and the appliance never import each other; each heavy dependency has exactly one door.
package layout

import (
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/airgap-appliance/appliance"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// list runs `go list -deps=false -json` over the module's packages.
func list(t *testing.T) map[string]pkg {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func TestImportGraph(t *testing.T) {
	pkgs := list(t)
	// from must not depend on to or any package under it (go list -deps: the whole closure).
	notDep := []struct{ from, to, why string }{
		{"pkg/hostagent", "pkg/nodestate", "the node agent speaks the contract (pkg/agentapi), not the appliance's store"},
		{"pkg/hostagent", "pkg/bootstrap", "the node agent must not link the appliance"},
		{"pkg/hostagent", "pkg/server", "the node agent must not link the appliance"},
		{"cmd/hostagent", "pkg/bootstrap", "the node binary must not link the appliance"},
		{"cmd/appliance", "pkg/hostagent", "the appliance binary must not link the node agent"},
		{"pkg/power", "pkg/config", "pkg/power takes its own Target, built by the caller"},
		// The node binary reads the boot contract (pkg/agentapi: BootArgs, RootDeviceHints), not the
		// appliance's inputs: bootstrap.yaml's types, the bundle and what reads it.
		{"cmd/hostagent", "pkg/config", "the node binary reads the boot contract (pkg/agentapi), not bootstrap.yaml's types"},
		{"cmd/hostagent", "pkg/bundle", "the node binary must not link the air-gap bundle's reader"},
		{"cmd/hostagent", "pkg/debrepo", "the node binary must not link the bundle's Debian repository code (apt on the node reads the repository)"},
		{"cmd/hostagent", "pkg/nodeiso", "the node binary must not link the appliance's node-ISO server (and its ISO 9660 reader)"},
		{"cmd/hostagent", "registry", "the node binary must not link the appliance's registry (distribution)"},
	}
	for _, r := range notDep {
		p, ok := pkgs[module+"/"+r.from]
		if !ok {
			t.Errorf("package %s not found", r.from)
			continue
		}
		// r.to is a path prefix: the package and every package under it.
		to := module + "/" + r.to
		for _, d := range p.Deps {
			if d == to || strings.HasPrefix(d, to+"/") {
				t.Errorf("%s depends on %s: %s", r.from, strings.TrimPrefix(d, module+"/"), r.why)
			}
		}
	}
	// Positive controls: the graph is read at all (a broken `go list` would make every rule pass).
	for _, r := range [][2]string{{"cmd/appliance", "pkg/bootstrap"}, {"cmd/hostagent", "pkg/hostagent"}, {"pkg/hostagent", "pkg/agentapi"}} {
		if !slices.Contains(pkgs[module+"/"+r[0]].Deps, module+"/"+r[1]) {
			t.Errorf("%s does not depend on %s: the graph was not read", r[0], r[1])
		}
	}
	doors := []struct{ dep, door string }{
		{"github.com/distribution/distribution/v3", "registry"},
		{"github.com/bmc-toolbox/bmclib/v2", "pkg/power"},
		{"github.com/google/nftables", "firewall"},
		{"github.com/kdomanski/iso9660", "pkg/nodeiso"},
		{"filippo.io/age", "pkg/escrow"},
	}
	for _, d := range doors {
		for _, p := range pkgs {
			for _, imp := range p.Imports {
				if imp != d.dep && !strings.HasPrefix(imp, d.dep+"/") {
					continue
				}
				rel := strings.TrimPrefix(p.ImportPath, module+"/")
				if rel != d.door && !strings.HasPrefix(rel, d.door+"/") {
					t.Errorf("%s imports %s: only %s/ may (one door per heavy dependency)", rel, imp, d.door)
				}
			}
		}
	}
}
