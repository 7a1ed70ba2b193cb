package redfishbmc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// MockupSystemID is the System Id in DMTF's public-rackmount1 mockup, which PrepareTree replaces.
const MockupSystemID = "437XR1138R2"

// PrepareTree copies a DMTF mockup tree (a folder per resource, each holding index.json, as DMTF's
// Redfish Mockup Server lays it out) from src into dst, replacing the mockup's System Id with
// systemID in every folder name and file, so that every @odata.id and link names the emulated system.
// dst must not exist. Errors: src unreadable or not a mockup (no index.json at its top), dst exists.
func PrepareTree(src, dst, systemID string) error {
	if _, err := os.Stat(filepath.Join(src, "index.json")); err != nil {
		return fmt.Errorf("%s is not a Redfish mockup tree (no index.json at its top): %w", src, err)
	}
	if strings.ContainsAny(systemID, "/\\\"") || systemID == "" {
		return fmt.Errorf("system id %q: give a non-empty id without slashes or quotes", systemID)
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		out := filepath.Join(dst, strings.ReplaceAll(rel, MockupSystemID, systemID))
		if d.IsDir() {
			return os.Mkdir(out, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, []byte(strings.ReplaceAll(string(b), MockupSystemID, systemID)), 0o644)
	})
}

// tree is a mockup tree loaded into memory: @odata.id path (e.g. "/redfish/v1/Systems/ID", no
// trailing slash except the service root's "/redfish/v1/") → the decoded resource.
type tree struct {
	res      map[string]map[string]any
	metadata []byte // /redfish/v1/$metadata (CSDL XML)
	messages map[string]registryMessage
	registry string // the Base registry's prefix.version, e.g. "Base.1.5.0"
}

type registryMessage struct {
	Message      string
	Severity     string
	NumberOfArgs int
	Resolution   string
}

// loadTree reads every index.json under dir (path dir/A/B/index.json serves /redfish/v1/A/B), the
// $metadata document, and the Base message registry (Registries/Base.*.json) whose messages the
// error answers carry.
func loadTree(dir string) (*tree, error) {
	t := &tree{res: map[string]map[string]any{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		switch {
		case d.Name() == "index.json":
			var v map[string]any
			b, err := os.ReadFile(p)
			if err == nil {
				err = json.Unmarshal(b, &v)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			key := "/redfish/v1/" + path.Dir(rel)
			if path.Dir(rel) == "." {
				key = "/redfish/v1/"
			}
			t.res[key] = v
		case rel == "$metadata/index.xml":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			t.metadata = b
		case strings.HasPrefix(rel, "Registries/Base.") && strings.HasSuffix(rel, ".json") && !strings.Contains(strings.TrimPrefix(rel, "Registries/"), "/"):
			var reg struct {
				RegistryPrefix, RegistryVersion string
				Messages                        map[string]registryMessage
			}
			b, err := os.ReadFile(p)
			if err == nil {
				err = json.Unmarshal(b, &reg)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			t.messages, t.registry = reg.Messages, reg.RegistryPrefix+"."+reg.RegistryVersion
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if t.res["/redfish/v1/"] == nil {
		return nil, fmt.Errorf("%s: no service root (index.json)", dir)
	}
	if t.messages == nil {
		return nil, errors.New(dir + ": no Base message registry (Registries/Base.*.json)")
	}
	return t, nil
}
