package strictyaml

import (
	"strconv"
	"unicode/utf8"
)

// Limits on how much of a value an error message repeats: a document may hold a value of megabytes,
// and an error must not echo it back.
const (
	// MaxValueLen is the longest value (in bytes) messages show whole; a longer one is clipped to its
	// first ClipLen bytes followed by "…(N bytes)".
	MaxValueLen = 128
	// ClipLen is how many bytes of a clipped value are shown (less at a UTF-8 boundary).
	ClipLen = 80
	// maxErrorLen is the longest error text (an argument of a message, e.g. from os.Stat with a long
	// path) shown whole; a longer one keeps its head and tail, where errors say what went wrong.
	maxErrorLen = 512
)

// Clip returns s when it is at most MaxValueLen bytes long, else its first ClipLen bytes (cut at a
// UTF-8 boundary) followed by "…(N bytes)", N being len(s).
func Clip(s string) string {
	if len(s) <= MaxValueLen {
		return s
	}
	return s[:runeCut(s, ClipLen)] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// Quote is strconv.Quote(Clip(s)): a value as messages quote it, e.g. `"10.0.0.0/33"`, or for a long
// one `"aaaa…(1048576 bytes)"`.
func Quote(s string) string { return strconv.Quote(Clip(s)) }

// clipMiddle keeps the head and tail of a long error text.
func clipMiddle(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	keep := maxErrorLen/2 - 16
	head := s[:runeCut(s, keep)]
	tail := s[len(s)-keep:]
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return head + "…(" + strconv.Itoa(len(s)) + " bytes)…" + tail
}

// runeCut returns the largest n' <= n such that s[:n'] ends at a UTF-8 boundary.
func runeCut(s string, n int) int {
	if n >= len(s) {
		return len(s)
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// quoted is a value already clipped and quoted for a message (quoteNode): ClipArgs leaves it alone.
type quoted string

// ClipArgs returns args with every string argument clipped (Clip) and every error argument longer
// than 512 bytes shortened in the middle, for fmt.Sprintf of an error message: the message may quote
// a value of the document, which must not come back whole when it is megabytes long. Other arguments
// are left as they are. args is not modified.
func ClipArgs(args []any) []any {
	var out []any
	for i, a := range args {
		var c any
		switch x := a.(type) {
		case string:
			if len(x) > MaxValueLen {
				c = Clip(x)
			}
		case error:
			if s := x.Error(); len(s) > maxErrorLen {
				c = clipMiddle(s)
			}
		}
		if c == nil {
			continue
		}
		if out == nil {
			out = append([]any(nil), args...)
		}
		out[i] = c
	}
	if out == nil {
		return args
	}
	return out
}
