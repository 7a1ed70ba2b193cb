package ignition

import (
	"errors"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_5"
)

const (
	snippetAddsFile = `{"ignition":{"version":"3.0.0"},"storage":{"files":[{"path":"/etc/sysctl.d/90-k8s.conf","mode":420,"contents":{"source":"data:,net.ipv4.ip_forward%3D1%0A"}}]}}`
	// luks.cex exists only in spec 3.5.0.
	snippetCex35 = `{"ignition":{"version":"3.5.0"},"storage":{"luks":[{"name":"data","device":"/dev/disk/by-partlabel/data","cex":{"enabled":true}}]}}`
	snippet34    = `{"ignition":{"version":"3.4.0"}}`
	// a link over the hostagent config directory: valid alone, invalid merged (a file below a link).
	snippetLinkOverBase = `{"ignition":{"version":"3.3.0"},"storage":{"links":[{"path":"/etc/hostagent","target":"/var/lib/hostagent"}]}}`
	snippetUnknownKey   = `{"ignition":{"version":"3.2.0"},"storage":{"filez":[]}}`
	// the node's snippet overrides the rendered unit (same name: the child wins).
	snippetOverrideUnit = `{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"hostagent.service","enabled":false}]}}`
)

func withSnippets(t *testing.T, snippets ...Snippet) Params {
	p := goldenParams(t)
	p.Snippets = snippets
	return p
}

func TestMergeAddsFile(t *testing.T) {
	c := mustRender(t, withSnippets(t, Snippet{Name: "roles/worker.ign", Data: []byte(snippetAddsFile)}))
	for _, v := range SupportedVersions {
		out, warns, err := c.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if len(warns) != 0 {
			t.Errorf("%s: warnings %q", v, warns)
		}
		cfg, _, err := v3_5.ParseCompatibleVersion(out)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if cfg.Ignition.Version != "3.5.0" { // translated by the parser
			t.Fatalf("version %s", cfg.Ignition.Version)
		}
		paths := map[string]bool{}
		for _, f := range cfg.Storage.Files {
			paths[f.Path] = true
		}
		if !paths["/etc/sysctl.d/90-k8s.conf"] || !paths[HostagentConfigPath] || !paths[CAPathDebian] {
			t.Errorf("%s: merged files %v lack the snippet's or the base's files", v, paths)
		}
		if !strings.Contains(string(out), `"version": "`+v+`"`) {
			t.Errorf("output is not spec %s", v)
		}
	}
}

func TestMergeChildOverridesUnit(t *testing.T) {
	out, _, err := mustRender(t, withSnippets(t, Snippet{Name: "nodes/cp-1.ign", Data: []byte(snippetOverrideUnit)})).Marshal("3.3.0")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := v3_5.ParseCompatibleVersion(out)
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Systemd.Units[0]
	if len(cfg.Systemd.Units) != 1 || u.Enabled == nil || *u.Enabled || u.Contents == nil {
		t.Fatalf("want the base unit with enabled=false from the snippet, got %+v", cfg.Systemd.Units)
	}
}

func TestMergeSnippetNewerThanClient(t *testing.T) {
	c := mustRender(t, withSnippets(t,
		Snippet{Name: "roles/worker.ign", Data: []byte(snippetAddsFile)},
		Snippet{Name: "nodes/cp-1-luks.ign", Data: []byte(snippetCex35)},
	))
	for _, v := range []string{"3.3.0", "3.4.0"} {
		_, _, err := c.Marshal(v)
		if !errors.Is(err, ErrNotAcceptable) || !containsAll(err.Error(), `"nodes/cp-1-luks.ign"`, "3.5.0", "at most "+v) {
			t.Fatalf("Marshal(%s) = %v; want ErrNotAcceptable naming the snippet and both versions", v, err)
		}
	}
	out, _, err := c.Marshal("3.5.0")
	if err != nil {
		t.Fatalf("Marshal(3.5.0): %v", err)
	}
	if !strings.Contains(string(out), `"cex"`) {
		t.Fatalf("3.5 output lacks the snippet's cex:\n%s", out)
	}

	c = mustRender(t, withSnippets(t, Snippet{Name: "s34.ign", Data: []byte(snippet34)}))
	if _, _, err := c.Marshal("3.3.0"); !errors.Is(err, ErrNotAcceptable) {
		t.Fatalf("3.4 snippet for a 3.3 client: %v", err)
	}
	if _, _, err := c.Marshal("3.4.0"); err != nil {
		t.Fatalf("3.4 snippet for a 3.4 client: %v", err)
	}
}

func TestInvalidSnippets(t *testing.T) {
	tests := []struct {
		name, data string
		want       []string
	}{
		{"not json", `{"ignition":`, []string{"unexpected end"}},
		{"no version", `{"storage":{}}`, []string{"ignition.version"}},
		{"spec 2", `{"ignition":{"version":"2.3.0"}}`, []string{"spec 2.3.0", "3.0.0 to 3.5.0"}},
		{"experimental spec", `{"ignition":{"version":"3.6.0-experimental"}}`, []string{"spec 3.6.0-experimental"}},
		{"relative path", `{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"etc/motd"}]}}`, []string{"path not absolute"}},
		{"bad mode type", `{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/a","mode":"0644"}]}}`, []string{"mode"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(withSnippets(t, Snippet{Name: "snippets/bad.ign", Data: []byte(tt.data)}))
			if !errors.Is(err, ErrInvalidSnippet) {
				t.Fatalf("Render: %v; want ErrInvalidSnippet", err)
			}
			if !containsAll(err.Error(), append([]string{`"snippets/bad.ign"`, "snippets[0]"}, tt.want...)...) {
				t.Fatalf("error %q lacks the snippet name or %q", err, tt.want)
			}
		})
	}
}

func TestUnknownKeyIsWarning(t *testing.T) {
	c := mustRender(t, withSnippets(t, Snippet{Name: "snippets/typo.ign", Data: []byte(snippetUnknownKey)}))
	for _, v := range SupportedVersions {
		_, warns, err := c.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if len(warns) != 1 || !containsAll(warns[0], `snippet "snippets/typo.ign"`, "unused key filez") {
			t.Fatalf("%s: warnings %q, want one about filez naming the snippet", v, warns)
		}
	}
}

func TestValidationFailsAfterMerge(t *testing.T) {
	c := mustRender(t, withSnippets(t, Snippet{Name: "snippets/link.ign", Data: []byte(snippetLinkOverBase)}))
	for _, v := range SupportedVersions {
		_, _, err := c.Marshal(v)
		if !errors.Is(err, ErrInvalidConfig) || !containsAll(err.Error(), `"snippets/link.ign"`, "spec "+v, "link") {
			t.Fatalf("%s: Marshal = %v; want ErrInvalidConfig naming the snippet and the link conflict", v, err)
		}
	}
}

func TestMarshalUnsupportedVersion(t *testing.T) {
	_, _, err := mustRender(t, goldenParams(t)).Marshal("3.2.0")
	if !errors.Is(err, ErrNotAcceptable) {
		t.Fatalf("Marshal(3.2.0) = %v", err)
	}
}

func FuzzSnippet(f *testing.F) {
	for _, s := range []string{snippetAddsFile, snippetCex35, snippetLinkOverBase, snippetUnknownKey, `{}`, `{"ignition":{"version":"3.6.0-experimental"}}`} {
		f.Add([]byte(s))
	}
	p := goldenParams(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		p := p
		p.Snippets = []Snippet{{Name: "fuzz.ign", Data: data}}
		c, err := Render(p)
		if err != nil {
			if !errors.Is(err, ErrInvalidSnippet) {
				t.Fatalf("Render error %v is not ErrInvalidSnippet", err)
			}
			return
		}
		for _, v := range SupportedVersions {
			out, _, err := c.Marshal(v)
			if err != nil {
				if !errors.Is(err, ErrNotAcceptable) && !errors.Is(err, ErrInvalidConfig) && !errors.Is(err, ErrInvalidSnippet) {
					t.Fatalf("Marshal(%s) error %v has no sentinel", v, err)
				}
				continue
			}
			if _, _, err := v3_5.ParseCompatibleVersion(out); err != nil {
				t.Fatalf("Marshal(%s) produced a config Ignition rejects: %v", v, err)
			}
		}
	})
}
