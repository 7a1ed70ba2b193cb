package strictyaml

import (
	"errors"
	"strings"
	"testing"
)

// TestPaths: ParentPath undoes fieldPath, KeyPath and list indexes whatever the map keys hold
// (dots, brackets, IPv6 hosts with ports), and Covers sees every such child under its parent only.
func TestPaths(t *testing.T) {
	keys := []string{"quay.io", "a.b.c", "[fd00::1]:5000", "x[0]", "", "<<", "a]b[c", "[[]]"}
	bases := []string{"", "a", "a.b", "hosts[quay.io]", "hosts[[fd00::1]:5000].mirrors[3]"}
	for _, base := range bases {
		children := []string{fieldPath(base, "name"), base + "[12]"}
		for _, k := range keys {
			if strings.Count(k, "[") == strings.Count(k, "]") && !strings.Contains(k, "]b[") { // balanced keys only
				children = append(children, KeyPath(base, k))
			}
		}
		for _, c := range children {
			if got := ParentPath(c); got != base {
				t.Errorf("ParentPath(%q) = %q, want %q", c, got, base)
			}
			if !Covers(base, c) || !Covers(c, c) || Covers(c, base) {
				t.Errorf("Covers(%q, %q) = %v, Covers(%q, %q) = %v", base, c, Covers(base, c), c, base, Covers(c, base))
			}
		}
	}
	// Look-alikes that are not children.
	for _, pq := range [][2]string{{"nodes[0]", "nodes[01]"}, {"name", "nameX"}, {"name", "nodes"}, {"nodes[0].name", "nodes[0]"}} {
		if Covers(pq[0], pq[1]) {
			t.Errorf("Covers(%q, %q) = true", pq[0], pq[1])
		}
	}
	// Unbalanced brackets have no parent; a top-level key has the empty one.
	for _, p := range []string{"hosts[a]b]", "name", ""} {
		if got := ParentPath(p); got != "" {
			t.Errorf("ParentPath(%q) = %q, want \"\"", p, got)
		}
	}
	if got := KeyPath("registries.hosts", "[fd00::1]:5000"); got != "registries.hosts[[fd00::1]:5000]" {
		t.Errorf("KeyPath = %q", got)
	}
}

func TestLinesLine(t *testing.T) {
	l := Lines{"nodes": 3, "nodes[0]": 4, "hosts[a.b]": 9}
	for path, want := range map[string]int{
		"nodes[0].power.kind": 4, "nodes[1].name": 3, "nodes": 3, "hosts[a.b].caFile": 9, "hosts[a]": 0, "other": 0, "": 0,
	} {
		if got := l.Line(path); got != want {
			t.Errorf("Line(%q) = %d, want %d", path, got, want)
		}
	}
	if got := Lines(nil).Line("nodes"); got != 0 {
		t.Errorf("nil Lines: Line = %d", got)
	}
}

func TestFieldErrorFormat(t *testing.T) {
	tests := []struct {
		e    FieldError
		want string
	}{
		{FieldError{Path: "nodes[1].name", Line: 7, Msg: "is required"}, "nodes[1].name: is required (line 7)"},
		{FieldError{Path: "name", Msg: "is required"}, "name: is required"},
		{FieldError{Line: 3, Msg: "invalid YAML: x"}, "invalid YAML: x (line 3)"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	var err error = ErrorList{&tests[0].e, &tests[1].e}
	if got := err.Error(); got != tests[0].want+"\n"+tests[1].want {
		t.Errorf("ErrorList.Error() = %q", got)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe != &tests[0].e || !errors.Is(err, ErrInvalid) || errors.Is(&tests[0].e, ErrInvalid) {
		t.Errorf("errors.As/Is on ErrorList: %v", fe)
	}
}
