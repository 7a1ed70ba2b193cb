package firewall

import (
	"os"
	"strings"
	"testing"
)

// TestPortTableDocIsCurrent keeps the port table of docs/reference/ports.md generated from this package's
// data: `make docs` rewrites it (cmd/docgen).
func TestPortTableDocIsCurrent(t *testing.T) {
	const page = "docs/reference/ports.md"
	b, err := os.ReadFile("../" + page)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	const begin, end = "<!-- BEGIN PORT TABLE -->\n", "<!-- END PORT TABLE -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the %q … %q markers", page, begin, end)
	}
	if got, want := s[i+len(begin):j], MarkdownTable(0, 0); got != want {
		t.Fatalf("%s port table is stale: run `make docs`\n--- %s ---\n%s\n--- want ---\n%s", page, page, got, want)
	}
}
