// Package deps proves `make deps` (test/deps.sh with the Makefile's DEB_PACKAGES) on a bare Debian 12:
// TestMakeDepsOnBareDebian (build tag e2e, `make check-full`) runs it in a fresh debootstrap root inside
// a systemd-nspawn container whose only way out is an HTTP proxy to this machine's Debian mirror, then
// checks that every program the suites call is there.
//
// The list of programs is read from the code, never kept here (this file, checked by the fast
// TestSuiteToolsDerived in `make test`):
//   - every labns.RequireTool call in Go (a string literal, or the element of a []string literal it
//     ranges over); a call whose name cannot be read is an error, so the list cannot silently shrink;
//   - the program of every exec.Command / exec.CommandContext with a literal name in test code
//     (_test.go files and everything under test/);
//   - what the shell scripts check for themselves: `command -v NAME`, and `for VAR in A B C; do …
//     command -v "$VAR"` loops (the fixture builders' own lists).
package deps

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the module's root (this package is test/deps).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller: no file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// suiteTools maps every program the suites call to the places (path:line, relative to root) that name
// it. unresolved lists the RequireTool calls whose name could not be read.
func suiteTools(root string) (tools map[string][]string, unresolved []string, err error) {
	tools = map[string][]string{}
	add := func(name, site string) {
		if name != "" && !slices.Contains(tools[name], site) {
			tools[name] = append(tools[name], site)
		}
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "vendor" || d.Name() == "testdata" || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(p, ".go"):
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			testCode := strings.HasSuffix(p, "_test.go") || strings.HasPrefix(rel, "test"+string(filepath.Separator))
			goTools(fset, f, rel, testCode, add, &unresolved)
		case strings.HasSuffix(p, ".sh"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			shTools(string(b), rel, add)
		}
		return nil
	})
	return tools, unresolved, err
}

// goTools adds the programs named by labns.RequireTool calls (all code) and by exec.Command /
// exec.CommandContext with a literal program (test code only).
func goTools(fset *token.FileSet, f *ast.File, rel string, testCode bool, add func(name, site string), unresolved *[]string) {
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		site := fmt.Sprintf("%s:%d", rel, fset.Position(call.Pos()).Line)
		arg := -1
		required := false
		switch fun := call.Fun.(type) {
		case *ast.SelectorExpr:
			pkg, ok := fun.X.(*ast.Ident)
			switch {
			case !ok:
			case pkg.Name == "labns" && fun.Sel.Name == "RequireTool":
				arg, required = 1, true
			case testCode && pkg.Name == "exec" && fun.Sel.Name == "Command":
				arg = 0
			case testCode && pkg.Name == "exec" && fun.Sel.Name == "CommandContext":
				arg = 1
			}
		case *ast.Ident: // inside package labns
			if f.Name.Name == "labns" && fun.Name == "RequireTool" {
				arg, required = 1, true
			}
		}
		if arg < 0 || arg >= len(call.Args) {
			return true
		}
		names, ok := stringsOf(call.Args[arg], 0)
		if !ok {
			if required {
				*unresolved = append(*unresolved, site)
			}
			return true
		}
		for _, name := range names {
			if strings.HasPrefix(name, "/") || !strings.Contains(name, "/") {
				add(name, site)
			}
		}
		return true
	})
}

// stringsOf reads the string values an expression can take: a string literal, a literal of string
// literals, or a variable bound to one of those (also by `for _, v := range LITERAL`).
func stringsOf(e ast.Expr, depth int) ([]string, bool) {
	if depth > 4 {
		return nil, false
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return nil, false
		}
		s, err := strconv.Unquote(e.Value)
		return []string{s}, err == nil
	case *ast.CompositeLit:
		var out []string
		for _, el := range e.Elts {
			s, ok := stringsOf(el, depth+1)
			if !ok {
				return nil, false
			}
			out = append(out, s...)
		}
		return out, len(out) > 0
	case *ast.Ident:
		if e.Obj == nil {
			return nil, false
		}
		switch decl := e.Obj.Decl.(type) {
		case *ast.AssignStmt:
			i := slices.IndexFunc(decl.Lhs, func(l ast.Expr) bool { id, ok := l.(*ast.Ident); return ok && id.Name == e.Name })
			if i < 0 {
				return nil, false
			}
			if u, ok := decl.Rhs[0].(*ast.UnaryExpr); ok && len(decl.Rhs) == 1 && u.Op == token.RANGE {
				if i != 1 {
					return nil, false // the index, not the element
				}
				return stringsOf(u.X, depth+1)
			}
			if len(decl.Rhs) == len(decl.Lhs) {
				return stringsOf(decl.Rhs[i], depth+1)
			}
		case *ast.ValueSpec:
			i := slices.IndexFunc(decl.Names, func(id *ast.Ident) bool { return id.Name == e.Name })
			if i >= 0 && i < len(decl.Values) {
				return stringsOf(decl.Values[i], depth+1)
			}
		}
	}
	return nil, false
}

var (
	shForLoop   = regexp.MustCompile(`\bfor ([A-Za-z_][A-Za-z0-9_]*) in ([A-Za-z0-9 ._+-]+); do`)
	shCommandV  = regexp.MustCompile(`command -v ([A-Za-z0-9][A-Za-z0-9._+-]*)`)
	shLoopCheck = `command -v "$%s"`
)

// shTools adds what a shell script checks for itself before it runs: `command -v NAME`, and the words
// of a `for VAR in …; do` loop whose body checks `command -v "$VAR"`.
func shTools(text, rel string, add func(name, site string)) {
	line := func(off int) string { return fmt.Sprintf("%s:%d", rel, 1+strings.Count(text[:off], "\n")) }
	for _, m := range shForLoop.FindAllStringSubmatchIndex(text, -1) {
		body := text[m[1]:]
		if end := strings.Index(body, "done"); end >= 0 {
			body = body[:end]
		}
		if !strings.Contains(body, fmt.Sprintf(shLoopCheck, text[m[2]:m[3]])) {
			continue
		}
		for _, w := range strings.Fields(text[m[4]:m[5]]) {
			add(w, line(m[0]))
		}
	}
	for _, m := range shCommandV.FindAllStringSubmatchIndex(text, -1) {
		add(text[m[2]:m[3]], line(m[0]))
	}
}

// TestSuiteToolsDerived checks the derivation against names the code is known to call (positive controls:
// a broken parser would otherwise make TestMakeDepsOnBareDebian check nothing) and that every
// RequireTool call's name was read.
func TestSuiteToolsDerived(t *testing.T) {
	tools, unresolved, err := suiteTools(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, site := range unresolved {
		t.Errorf("%s: labns.RequireTool's name is neither a string literal nor an element of a []string literal "+
			"it ranges over, so test/deps cannot check that `make deps` installs it: name the tool literally", site)
	}
	for name, from := range map[string]string{
		"ipmi_sim":           "test/lab/nodes_test.go's tool list",
		"qemu-system-x86_64": "a labns.RequireTool literal",
		"grub-install":       "pkg/install's tool list",
		"losetup":            "an exec.Command in test code",
		"xtables-nft-multi":  "build-bundle.sh's command -v",
		"mformat":            "build-iso.sh's for-loop of command -v",
		"jq":                 "test/bench/bundle-create.sh's one-line loop",
	} {
		if len(tools[name]) == 0 {
			t.Errorf("%q (from %s) not derived", name, from)
		}
	}
	if len(tools) < 50 {
		t.Errorf("only %d tools derived; want the suites' ~90", len(tools))
	}
	names := make([]string, 0, len(tools))
	for n := range tools {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("%d tools: %s", len(names), strings.Join(names, " "))
}
