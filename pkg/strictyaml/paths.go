package strictyaml

import "strings"

// fieldPath is the path of struct field key under path.
func fieldPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// KeyPath is the path of map entry key under path (Kubernetes field.Path.Key style):
// KeyPath("registries.hosts", "quay.io") is "registries.hosts[quay.io]".
func KeyPath(path, key string) string { return path + "[" + key + "]" }

// ParentPath returns the path one level up: "a.b[1]" → "a.b", "a.hosts[x.y]" → "a.hosts", "a.b" → "a",
// "a" → "". Map keys may hold dots and balanced brackets ("[[fd00::1]:5000]").
func ParentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		depth := 0
		for i := len(p) - 1; i >= 0; i-- {
			switch p[i] {
			case ']':
				depth++
			case '[':
				if depth--; depth == 0 {
					return p[:i]
				}
			}
		}
		return ""
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// Covers reports whether an error at path p makes an error at path q redundant: q is p or lies under p
// ("nodes[0]" covers "nodes[0].power.kind" but not "nodes[01]"; "" covers everything).
func Covers(p, q string) bool {
	if !strings.HasPrefix(q, p) {
		return false
	}
	if len(q) == len(p) || p == "" {
		return true
	}
	return q[len(p)] == '.' || q[len(p)] == '['
}

// Lines maps the field paths present in a decoded document to the 1-based lines they were read from.
type Lines map[string]int

// Line returns the line of path, or of its nearest ancestor present in the document, or 0 (also for a
// nil Lines, e.g. a document built in Go): the line a validation error about path should name.
func (l Lines) Line(path string) int {
	for path != "" {
		if n, ok := l[path]; ok {
			return n
		}
		path = ParentPath(path)
	}
	return 0
}
