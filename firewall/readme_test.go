package firewall

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEPortTableIsCurrent keeps the README's port table generated from this package's data:
// `make docs` rewrites it.
func TestREADMEPortTableIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	const begin, end = "<!-- BEGIN PORT TABLE -->\n", "<!-- END PORT TABLE -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the %q … %q markers", begin, end)
	}
	if got, want := s[i+len(begin):j], MarkdownTable(0, 0); got != want {
		t.Fatalf("README.md port table is stale: run `make docs`\n--- README ---\n%s\n--- want ---\n%s", got, want)
	}
}
