package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository's root, seen from this package.
const root = "../.."

// TestReferenceIsCurrent: docs/reference holds exactly what docgen generates now from pkg/config and
// firewall/ (written into a temporary directory first, as `make docs` would write it).
func TestReferenceIsCurrent(t *testing.T) {
	tmp := t.TempDir()
	if err := write(filepath.Join(root, "pkg/config"), tmp); err != nil {
		t.Fatal(err)
	}
	pages, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("docgen wrote no page")
	}
	for _, p := range pages {
		want, err := os.ReadFile(filepath.Join(tmp, p.Name()))
		if err != nil {
			t.Fatal(err)
		}
		committed := filepath.Join("docs/reference", p.Name())
		have, err := os.ReadFile(filepath.Join(root, committed))
		if err != nil {
			t.Errorf("%s: %v: run `make docs`", committed, err)
			continue
		}
		if !bytes.Equal(have, want) {
			t.Errorf("%s is stale (%s): run `make docs`", committed, firstDifference(have, want))
		}
	}
}

// TestRenderTwice: the configuration page is the same bytes every time.
func TestRenderTwice(t *testing.T) {
	a, err := configurationPage(filepath.Join(root, "pkg/config"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := configurationPage(filepath.Join(root, "pkg/config"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("two renderings differ (%s)", firstDifference(a, b))
	}
}

// firstDifference describes the first line where have and want differ.
func firstDifference(have, want []byte) string {
	h, w := strings.Split(string(have), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(h) || i < len(w); i++ {
		var hl, wl string
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if hl != wl || i >= len(h) || i >= len(w) {
			return fmt.Sprintf("line %d is %q, want %q", i+1, short(hl), short(wl))
		}
	}
	return "identical"
}

func short(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// TestRelativeLinksResolve: every relative link in README.md and docs/ leads to a file or directory of
// the repository, and a link with an #anchor to a heading of its Markdown page.
func TestRelativeLinksResolve(t *testing.T) {
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		anchors[file] = headingAnchors(string(b))
		return anchors[file]
	}
	links := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(b)) {
			if schemeRE.MatchString(l.target) {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", f, l.line, l.target, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchorsOf(target)[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", f, l.line, l.target, target, anchor)
			}
		}
	}
	if links < 20 {
		t.Errorf("only %d relative links found in %d files: the link reader is broken", links, len(files))
	}
}

// schemeRE matches a link with a scheme (https:, mailto:), which this test does not follow.
var schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

type link struct {
	target string
	line   int
}

// linkRE matches an inline link's target, [text](target).
var linkRE = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// markdownLinks lists the inline links of a Markdown page outside code blocks and code spans.
func markdownLinks(md string) []link {
	var out []link
	fence := false
	for i, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence || strings.HasPrefix(line, "    ") {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, "``"), -1) {
			out = append(out, link{m[1], i + 1})
		}
	}
	return out
}

// codeSpanRE matches a code span on one line.
var codeSpanRE = regexp.MustCompile("`[^`]*`")

// headingAnchors returns the anchors GitHub gives a page's ATX headings (outside code blocks): slug of
// the heading's text, with -1, -2… on repeats.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	count := map[string]int{}
	fence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		text, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") || len(line)-len(strings.TrimLeft(line, "#")) > 6 {
			continue
		}
		text = inlineLinkRE.ReplaceAllString(text, "$1")
		s := slug(text)
		if n := count[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		count[s]++
	}
	return out
}

// inlineLinkRE matches an inline link, to keep its text.
var inlineLinkRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
