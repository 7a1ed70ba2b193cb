package strictyaml

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	short := strings.Repeat("a", MaxValueLen)
	if got := Clip(short); got != short {
		t.Errorf("Clip of %d bytes changed it: %q", len(short), got)
	}
	long := strings.Repeat("a", 1<<20)
	if got, want := Clip(long), strings.Repeat("a", ClipLen)+"…(1048576 bytes)"; got != want {
		t.Errorf("Clip(1 MiB) = %q, want %q", got, want)
	}
	if got, want := Quote(long), `"`+strings.Repeat("a", ClipLen)+`…(1048576 bytes)"`; got != want {
		t.Errorf("Quote(1 MiB) = %q, want %q", got, want)
	}
	// A multi-byte rune across the cut is dropped whole, never split.
	multi := "a" + strings.Repeat("é", 200)
	got := Clip(multi)
	if !utf8.ValidString(got) || !strings.HasSuffix(got, "…(401 bytes)") || len(got) > ClipLen+len("…(401 bytes)") {
		t.Errorf("Clip(multi-byte) = %q", got)
	}

	longErr := fmt.Errorf("stat %s: file name too long", long)
	args := []any{long, 7, longErr, errors.New("short"), quoted(`"kept"`)}
	clipped := ClipArgs(args)
	if args[0] != long {
		t.Error("ClipArgs modified its argument slice")
	}
	msg := fmt.Sprintf("%q %d %v %v %s", clipped...)
	if len(msg) > 2*maxErrorLen || !strings.HasSuffix(msg, `: file name too long short "kept"`) || !strings.HasPrefix(msg, `"aaa`) {
		t.Errorf("clipped message (%d bytes): %q", len(msg), msg)
	}
}

func TestFieldErrorJSON(t *testing.T) {
	b, err := json.Marshal(ErrorList{{Path: "nodes[0].name", Line: 3, Msg: "is required"}, {Msg: "invalid YAML"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"path":"nodes[0].name","line":3,"message":"is required"},{"path":"","line":0,"message":"invalid YAML"}]`; string(b) != want {
		t.Errorf("JSON = %s, want %s", b, want)
	}
}
