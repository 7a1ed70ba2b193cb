// Package strictyamltest holds test helpers for the errors of documents decoded with pkg/strictyaml.
package strictyamltest

import (
	"slices"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/strictyaml"
)

// Paths returns the sorted paths of errs.
func Paths(errs []*strictyaml.FieldError) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Path)
	}
	slices.Sort(out)
	return out
}

// Find returns the first error at path, or nil.
func Find(errs []*strictyaml.FieldError, path string) *strictyaml.FieldError {
	for _, e := range errs {
		if e.Path == path {
			return e
		}
	}
	return nil
}

// Require fails t unless errs holds an error at path whose message contains msg (and, when line > 0,
// whose line is line).
func Require(t testing.TB, errs []*strictyaml.FieldError, path, msg string, line int) {
	t.Helper()
	for _, e := range errs {
		if e.Path == path && strings.Contains(e.Msg, msg) && (line == 0 || e.Line == line) {
			return
		}
	}
	t.Errorf("no error at %s containing %q (line %d); got:\n%s", path, msg, line, strictyaml.ErrorList(errs).Error())
}
