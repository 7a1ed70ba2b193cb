package strictyaml

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every ErrorList: the document was read but is not valid. (Its
// text, "invalid configuration", predates this package and is kept for the documents that use it.)
var ErrInvalid = errors.New("invalid configuration")

// FieldError is one problem with one field of the document. Its JSON form (for `-o json` output) is
// {"path": …, "line": …, "message": …}.
type FieldError struct {
	// Path is the field path in YAML keys, e.g. "networks.controlPlane.cidrs[1]" or
	// "nodes[0].power.kind"; empty for problems with the document as a whole (syntax, empty file).
	Path string `json:"path"`
	// Line is the 1-based line in the source document, 0 when unknown (e.g. a configuration built in
	// Go, or a field that is absent from the document and has no present ancestor).
	Line int `json:"line"`
	// Msg says what is wrong and what to do about it.
	Msg string `json:"message"`
}

// Error renders `path: msg (line N)`; the path is left out when empty and the line when 0.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	return b.String()
}

// ErrorList is every error found in a document. It implements error (one FieldError per line) and
// matches ErrInvalid with errors.Is.
type ErrorList []*FieldError

// Error joins the errors, one per line.
func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Is reports whether target is ErrInvalid.
func (l ErrorList) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the FieldErrors as errors, for errors.As on a single *FieldError.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// sortByLine orders errors by source line (unknown lines last), keeping the order of equal lines.
func sortByLine(l []*FieldError) {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i].Line, l[j].Line
		if a == 0 || b == 0 {
			return a != 0 && b == 0
		}
		return a < b
	})
}
