// Command docgen writes the reference pages under docs/reference that come from the code, except the
// CLI pages:
//
//   - configuration.md: the bootstrap.yaml reference, read from pkg/config's Go types and their doc
//     comments with go/parser and go/doc: from BootstrapConfiguration, the type bootstrap.yaml decodes
//     into, down through every struct, each field's path (its yaml tags), type, documented default
//     and doc comment;
//   - ports.md: the firewall's port table (firewall.MarkdownTable), from the data the firewall applies.
//
// The CLI pages beside them, docs/reference/cli, are written by the binaries themselves (`appliance
// docs`, `hostagent docs`: cobra/doc, pkg/clidoc). `make docs` runs all three from the repository's
// root; a test beside each generator fails when a committed page is stale, and this one's also when a
// relative link in README.md or docs/ leads nowhere.
//
// Usage: docgen [-config pkg/config] DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

func main() {
	src := flag.String("config", "pkg/config", "the source directory of package config")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: docgen [-config pkg/config] DIR")
		os.Exit(2)
	}
	if err := write(*src, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

// write writes every page generate makes into dir.
func write(src, dir string) error {
	pages, err := generate(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range sortedKeys(pages) {
		if err := os.WriteFile(filepath.Join(dir, name), pages[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// generate returns the pages by file name, reading package config's source from src.
func generate(src string) (map[string][]byte, error) {
	cfg, err := configurationPage(src)
	if err != nil {
		return nil, fmt.Errorf("configuration reference: %w", err)
	}
	return map[string][]byte{
		"configuration.md": cfg,
		"ports.md":         portsPage(),
	}, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
