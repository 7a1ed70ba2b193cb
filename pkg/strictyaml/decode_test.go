package strictyaml

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const header = "apiVersion: example.test/v1\nkind: Widget\n"

// color is a document-specific scalar type, decoded through Decoder.Scalars.
type color uint8

const (
	red color = iota + 1
	green
)

var colorNames = map[color]string{red: "red", green: "green"}

// MarshalText renders c for the fuzz round trip ("" when unset). color has no UnmarshalText: the
// Scalars entry decodes it.
func (c color) MarshalText() ([]byte, error) { return []byte(colorNames[c]), nil }

type server struct {
	Name string `yaml:"name"`
	Port uint16 `yaml:"port,omitempty" strictyaml:"nonzero"`
}

type host struct {
	Mirrors []string `yaml:"mirrors,omitempty"`
	CAFile  string   `yaml:"caFile,omitempty"`
}

// widget uses every field kind Decode supports.
type widget struct {
	APIVersion string          `yaml:"apiVersion"`
	Kind       string          `yaml:"kind"`
	Name       string          `yaml:"name,omitempty"`
	Enabled    *bool           `yaml:"enabled,omitempty"`
	Port       uint16          `yaml:"port,omitempty" strictyaml:"nonzero"`
	Count      uint8           `yaml:"count,omitempty"`
	Color      color           `yaml:"color,omitempty"`
	Listen     netip.AddrPort  `yaml:"listen"` // encoding.TextUnmarshaler (no omitempty: yaml.v3 omits every netip.AddrPort)
	Tags       []string        `yaml:"tags,omitempty"`
	Servers    []server        `yaml:"servers,omitempty"`
	Hosts      map[string]host `yaml:"hosts,omitempty"`
	Skipped    string          `yaml:"-"`
	unexported string
}

var widgetDecoder = &Decoder{
	APIVersion: "example.test/v1",
	Kind:       "Widget",
	Empty:      "the widget is empty: start it with `apiVersion: example.test/v1` and `kind: Widget`",
	Scalars: map[reflect.Type]ScalarType{
		reflect.TypeFor[color](): {Want: "a color such as red", Parse: func(s Scalar) (any, error) {
			for c, name := range colorNames {
				if s.Text == name {
					return c, nil
				}
			}
			if s.Text == "" {
				return nil, nil
			}
			return nil, fmt.Errorf("%s is not a color: write red or green", s.Quoted)
		}},
	},
	Synonyms: map[string]string{"hostname": "name", "registries": "hosts", "nowhere": "absent"},
}

// TestDecodeErrors asserts the exact path, line and message of every error, in order.
func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		fatal bool
		want  []FieldError // exactly these, in order
	}{
		{"empty input", "", true, []FieldError{{Msg: widgetDecoder.Empty}}},
		{"only comments", "# nothing\n\n# here\n", true, []FieldError{{Msg: widgetDecoder.Empty}}},
		{"empty document", "---\n", true, []FieldError{{Line: 2, Msg: widgetDecoder.Empty}}},
		{"null document", "~\n", true, []FieldError{{Line: 1, Msg: widgetDecoder.Empty}}},
		{"two documents", header + "name: a\n---\n" + header, true, []FieldError{{Line: 5,
			Msg: "a second YAML document starts here: the file must hold exactly one Widget document; remove the '---' separator and what follows, or split it into another file"}}},
		{"two documents, second broken", header + "---\n: : :\n", true, []FieldError{{Line: 3, Msg: "invalid YAML: did not find expected key"}}},
		{"syntax error", header + "tags: [a\nname: x\n", true, []FieldError{{Line: 2, Msg: "invalid YAML: did not find expected ',' or ']'"}}},
		{"tab indentation", header + "hosts:\n\tx: {}\n", true, []FieldError{{Line: 4, Msg: "invalid YAML: found character that cannot start any token"}}},
		{"alias to nothing", header + "tags: *nope\n", true, []FieldError{{Msg: "invalid YAML: unknown anchor 'nope' referenced"}}},
		{"list at the root", "- a\n- b\n", true, []FieldError{{Line: 1, Msg: "the document must be a mapping (apiVersion: ..., kind: ..., ...), not a list"}}},
		{"scalar at the root", "hello\n", true, []FieldError{{Line: 1, Msg: `the document must be a mapping (apiVersion: ..., kind: ..., ...), not "hello"`}}},
		{"missing apiVersion and kind", "name: a\n", true, []FieldError{
			{Path: "apiVersion", Line: 1, Msg: "is required: add `apiVersion: example.test/v1` at the top of the document"},
			{Path: "kind", Line: 1, Msg: "is required: add `kind: Widget` at the top of the document"}}},
		{"wrong apiVersion, nothing else checked", "apiVersion: example.test/v2\nkind: Widget\nbogus: 1\n", true, []FieldError{
			{Path: "apiVersion", Line: 1, Msg: `"example.test/v2" is not supported: this appliance reads example.test/v1 only`}}},
		{"kind as a list", "apiVersion: example.test/v1\nkind: [Widget]\n", true, []FieldError{
			{Path: "kind", Line: 2, Msg: "a list is not supported: this appliance reads Widget only"}}},

		{"unknown key with a suggestion", header + "name: a\nnmae: b\n", false, []FieldError{
			{Path: "nmae", Line: 4, Msg: `unknown field "nmae": did you mean "name"?`}}},
		{"unknown key, case", header + "Name: a\n", false, []FieldError{{Path: "Name", Line: 3, Msg: `unknown field "Name": did you mean "name"?`}}},
		{"unknown key, prefix", header + "servers:\n- nam: a\n", false, []FieldError{
			{Path: "servers[0].nam", Line: 4, Msg: `unknown field "nam": valid keys here are name, port`}}},
		{"unknown key, prefix of a longer key", header + "enable: true\n", false, []FieldError{
			{Path: "enable", Line: 3, Msg: `unknown field "enable": did you mean "enabled"?`}}},
		{"unknown key, synonym", header + "hostname: a\n", false, []FieldError{
			{Path: "hostname", Line: 3, Msg: `unknown field "hostname": did you mean "name"?`}}},
		{"synonym not valid here", header + "servers:\n- hostname: a\n", false, []FieldError{
			{Path: "servers[0].hostname", Line: 4, Msg: `unknown field "hostname": did you mean "name"?`}}},
		{"unknown key without suggestion", header + "servers:\n- url: x\n", false, []FieldError{
			{Path: "servers[0].url", Line: 4, Msg: `unknown field "url": valid keys here are name, port`}}},
		{"unknown key in a map entry", header + "hosts:\n  quay.io:\n    mirors: [m]\n", false, []FieldError{
			{Path: "hosts[quay.io].mirors", Line: 5, Msg: `unknown field "mirors": did you mean "mirrors"?`}}},
		{"yaml:\"-\" and unexported fields are unknown keys", header + "Skipped: a\nunexported: b\n", false, []FieldError{
			{Path: "Skipped", Line: 3, Msg: `unknown field "Skipped": valid keys here are apiVersion, kind, name, enabled, port, count, color, listen, tags, servers, hosts`},
			{Path: "unexported", Line: 4, Msg: `unknown field "unexported": valid keys here are apiVersion, kind, name, enabled, port, count, color, listen, tags, servers, hosts`}}},

		{"duplicate key", header + "name: a\nname: b\n", false, []FieldError{
			{Path: "name", Line: 4, Msg: "duplicate key (first set at line 3): keep one"}}},
		{"duplicate map key", header + "hosts:\n  quay.io: {}\n  quay.io: {}\n", false, []FieldError{
			{Path: "hosts[quay.io]", Line: 5, Msg: "duplicate key (first set at line 4): keep one"}}},
		{"merge key", header + "servers:\n- <<: {name: a}\n", false, []FieldError{
			{Path: "servers[0].<<", Line: 4, Msg: "merge keys (<<) are not supported: write the fields out"}}},
		{"merge key in a map", header + "hosts:\n  <<: {a: {}}\n", false, []FieldError{
			{Path: "hosts[<<]", Line: 4, Msg: "merge keys (<<) are not supported: write the fields out"}}},
		{"non-string key", header + "? [a, b]\n: c\n", false, []FieldError{{Line: 3, Msg: "keys must be plain strings, not a list"}}},

		{"string as mapping", header + "name: {a: b}\n", false, []FieldError{{Path: "name", Line: 3, Msg: "must be a string, not a mapping"}}},
		{"list as string", header + "tags: a\n", false, []FieldError{
			{Path: "tags", Line: 3, Msg: `must be a list (e.g. [a, b] or one '- item' per line), not "a"`}}},
		{"mapping as list", header + "servers: [[a]]\n", false, []FieldError{
			{Path: "servers[0]", Line: 3, Msg: "must be a mapping of key: value, not a list"}}},
		{"map as list", header + "hosts: [a]\n", false, []FieldError{{Path: "hosts", Line: 3, Msg: "must be a mapping of key: value, not a list"}}},
		{"bool as word", header + "enabled: maybe\n", false, []FieldError{{Path: "enabled", Line: 3, Msg: `"maybe" is not a boolean: write true or false`}}},
		{"bool as list", header + "enabled: []\n", false, []FieldError{{Path: "enabled", Line: 3, Msg: "must be true or false, not a list"}}},
		{"integer quoted", header + "count: \"7\"\n", false, []FieldError{
			{Path: "count", Line: 3, Msg: `"7" is not valid: write an integer from 0 to 255 (without quotes)`}}},
		{"integer too large", header + "count: 256\n", false, []FieldError{{Path: "count", Line: 3, Msg: "256 is not valid: write an integer from 0 to 255"}}},
		{"integer negative", header + "count: -1\n", false, []FieldError{{Path: "count", Line: 3, Msg: "-1 is not valid: write an integer from 0 to 255"}}},
		{"integer float", header + "count: 1.5\n", false, []FieldError{{Path: "count", Line: 3, Msg: "1.5 is not valid: write an integer from 0 to 255"}}},
		{"nonzero explicit 0", header + "port: 0\n", false, []FieldError{
			{Path: "port", Line: 3, Msg: "0 is not valid: write an integer from 1 to 65535; omit the key to use the default"}}},
		{"nonzero as list", header + "servers:\n- port: [1]\n", false, []FieldError{
			{Path: "servers[0].port", Line: 4, Msg: "must be an integer from 1 to 65535, not a list"}}},
		{"scalar hook", header + "color: blue\n", false, []FieldError{{Path: "color", Line: 3, Msg: `"blue" is not a color: write red or green`}}},
		{"scalar hook, number", header + "color: 7\n", false, []FieldError{{Path: "color", Line: 3, Msg: "7 is not a color: write red or green"}}},
		{"scalar hook, list", header + "color: [red]\n", false, []FieldError{{Path: "color", Line: 3, Msg: "must be a color such as red, not a list"}}},
		{"TextUnmarshaler", header + "listen: 10.0.0.1\n", false, []FieldError{
			{Path: "listen", Line: 3, Msg: `"10.0.0.1" is not valid: not an ip:port`}}},
		{"TextUnmarshaler, mapping", header + "listen: {a: b}\n", false, []FieldError{{Path: "listen", Line: 3, Msg: "must be a string, not a mapping"}}},

		{"standard tag on a value", header + "name: !!binary aGVsbG8=\n", false, []FieldError{
			{Path: "name", Line: 3, Msg: "YAML tags are not supported (!!binary): remove the tag and write the plain value"}}},
		{"custom tag on a value", header + "name: !foo bar\n", false, []FieldError{
			{Path: "name", Line: 3, Msg: "YAML tags are not supported (!foo): remove the tag and write the plain value"}}},
		{"tag matching the type", header + "port: !!int 8443\n", false, []FieldError{
			{Path: "port", Line: 3, Msg: "YAML tags are not supported (!!int): remove the tag and write the plain value"}}},
		{"tag on a null", header + "name: !!null\n", false, []FieldError{
			{Path: "name", Line: 3, Msg: "YAML tags are not supported (!!null): remove the tag and write the plain value"}}},
		{"tag on a mapping", header + "servers:\n- !srv {name: a}\n", false, []FieldError{
			{Path: "servers[0]", Line: 4, Msg: "YAML tags are not supported (!srv): remove the tag and write the plain value"}}},
		{"tag on a list", header + "tags: !!seq [a]\n", false, []FieldError{
			{Path: "tags", Line: 3, Msg: "YAML tags are not supported (!!seq): remove the tag and write the plain value"}}},
		{"tag on a key", header + "!k name: a\n", false, []FieldError{
			{Path: "name", Line: 3, Msg: "YAML tags are not supported (!k): remove the tag and write the plain key"}}},
		{"tag on a map key", header + "hosts:\n  !h quay.io: {}\n", false, []FieldError{
			{Path: "hosts[quay.io]", Line: 4, Msg: "YAML tags are not supported (!h): remove the tag and write the plain key"}}},
		{"tag on the document", "--- !widget\n" + header, false, []FieldError{
			{Line: 1, Msg: "YAML tags are not supported (!widget): remove the tag and write the plain value"}}},
		{"tag behind an alias", header + "name: &n !x a\ntags: [*n]\n", false, []FieldError{
			{Path: "name", Line: 3, Msg: "YAML tags are not supported (!x): remove the tag and write the plain value"},
			{Path: "tags[0]", Line: 3, Msg: "YAML tags are not supported (!x): remove the tag and write the plain value"}}},
		{"a long value is clipped", header + "count: \"" + strings.Repeat("9", 100000) + "\"\n", false, []FieldError{
			{Path: "count", Line: 3, Msg: `"` + strings.Repeat("9", 80) + `…(100000 bytes)" is not valid: write an integer from 0 to 255 (without quotes)`}}},
		{"a long unknown key is clipped", header + "? " + strings.Repeat("k", 100000) + "\n: 1\n", false, []FieldError{
			{Path: strings.Repeat("k", 80) + "…(100000 bytes)", Line: 3, Msg: `unknown field "` + strings.Repeat("k", 80) + `…(100000 bytes)": valid keys here are apiVersion, kind, name, enabled, port, count, color, listen, tags, servers, hosts`}}},
		{"a long value in a scalar hook's error is clipped", header + "color: " + strings.Repeat("b", 100000) + "\n", false, []FieldError{
			{Path: "color", Line: 3, Msg: `"` + strings.Repeat("b", 80) + `…(100000 bytes)" is not a color: write red or green`}}},
		{"a long string in a list is clipped", header + "tags: " + strings.Repeat("t", 100000) + "\n", false, []FieldError{
			{Path: "tags", Line: 3, Msg: `must be a list (e.g. [a, b] or one '- item' per line), not "` + strings.Repeat("t", 80) + `…(100000 bytes)"`}}},

		{"several at once, in document order", header + "nmae: a\ntags: x\nservers:\n- {name: s, port: 0}\n- name: [t]\ncolor: pink\n", false, []FieldError{
			{Path: "nmae", Line: 3, Msg: `unknown field "nmae": did you mean "name"?`},
			{Path: "tags", Line: 4, Msg: `must be a list (e.g. [a, b] or one '- item' per line), not "x"`},
			{Path: "servers[0].port", Line: 6, Msg: "0 is not valid: write an integer from 1 to 65535; omit the key to use the default"},
			{Path: "servers[1].name", Line: 7, Msg: "must be a string, not a list"},
			{Path: "color", Line: 8, Msg: `"pink" is not a color: write red or green`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w widget
			r := widgetDecoder.Decode([]byte(tt.doc), &w)
			if r.Fatal != tt.fatal {
				t.Errorf("Fatal = %v, want %v", r.Fatal, tt.fatal)
			}
			if tt.fatal && (!reflect.DeepEqual(w, widget{}) || r.Lines != nil) {
				t.Errorf("fatal result touched the output (%+v) or has lines (%v)", w, r.Lines)
			}
			var got []FieldError
			for _, e := range r.Errors {
				got = append(got, *e)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			var err error = r.Errors
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
		})
	}
}

// TestDecodeValues: what decodes, decodes to the right values, also next to fields that fail; Lines
// holds every path present with the line of its key.
func TestDecodeValues(t *testing.T) {
	doc := header + `name: w
enabled: false
port: 0x20FB
count: 0o17
color: green
listen: "[::1]:443"
tags: &t [a, b]
servers:
- name: s1
  port: 22
- &s {name: s2}
- *s
hosts:
  quay.io:
    mirrors: *t
  "[fd00::5]:5000": {caFile: /ca.pem}
  empty.example:
`
	var w widget
	r := widgetDecoder.Decode([]byte(doc), &w)
	if len(r.Errors) > 0 || r.Fatal {
		t.Fatalf("Decode: %v", r.Errors)
	}
	f := false
	want := widget{APIVersion: "example.test/v1", Kind: "Widget", Name: "w", Enabled: &f, Port: 8443, Count: 15, Color: green,
		Listen: netip.MustParseAddrPort("[::1]:443"), Tags: []string{"a", "b"},
		Servers: []server{{Name: "s1", Port: 22}, {Name: "s2"}, {Name: "s2"}},
		Hosts:   map[string]host{"quay.io": {Mirrors: []string{"a", "b"}}, "[fd00::5]:5000": {CAFile: "/ca.pem"}, "empty.example": {}}}
	if diff := cmp.Diff(want, w, cmpWidget...); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
	for path, line := range map[string]int{
		"": 1, "apiVersion": 1, "name": 3, "tags": 9, "tags[1]": 9, "servers": 10, "servers[0].port": 12,
		"servers[2]": 13, "servers[2].name": 13, "hosts[quay.io].mirrors": 17, "hosts[quay.io].mirrors[0]": 9,
		"hosts[[fd00::5]:5000].caFile": 18, "hosts[empty.example]": 19,
	} {
		if got := r.Lines[path]; got != line {
			t.Errorf("Lines[%q] = %d, want %d", path, got, line)
		}
	}

	// Nulls and empty values leave fields unset; a failing field leaves the others decoded.
	w = widget{}
	r = widgetDecoder.Decode([]byte(header+"name: ~\nport:\ncolor: \"\"\nlisten: \"\"\ntags: []\nservers: null\ncount: x\nenabled: true\n"), &w)
	if len(r.Errors) != 1 || r.Errors[0].Path != "count" || !reflect.DeepEqual(r.Covered, []string{"count"}) {
		t.Fatalf("errors %v, covered %v; want one at count", r.Errors, r.Covered)
	}
	if w.Name != "" || w.Port != 0 || w.Color != 0 || w.Listen.IsValid() || len(w.Tags) != 0 || w.Servers != nil || w.Enabled == nil || !*w.Enabled {
		t.Errorf("decoded %+v", w)
	}
}

var cmpWidget = []cmp.Option{cmpopts.EquateEmpty(), cmpopts.IgnoreUnexported(widget{}),
	cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })}

// TestLimits: a flood of errors is cut at MaxErrors, an alias bomb at MaxNodes.
func TestLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString(header)
	for i := range MaxErrors + 50 {
		fmt.Fprintf(&b, "unknown%d: x\n", i)
	}
	var w widget
	r := widgetDecoder.Decode([]byte(b.String()), &w)
	if len(r.Errors) != MaxErrors+1 {
		t.Fatalf("got %d errors, want %d", len(r.Errors), MaxErrors+1)
	}
	if last := r.Errors[MaxErrors]; *last != (FieldError{Line: MaxErrors + 3, Msg: "too many errors (more than 200): fix these first"}) {
		t.Errorf("last error = %+v", last)
	}

	// 16^6 leaves behind six aliases: far more than MaxNodes nodes, decoded in bounded time.
	type bomb struct {
		APIVersion string                 `yaml:"apiVersion"`
		Kind       string                 `yaml:"kind"`
		L0         []string               `yaml:"l0"`
		L1         [][]string             `yaml:"l1"`
		L2         [][][]string           `yaml:"l2"`
		L3         [][][][]string         `yaml:"l3"`
		L4         [][][][][]string       `yaml:"l4"`
		L5         [][][][][][]string     `yaml:"l5"`
		L6         [][][][][][][]string   `yaml:"l6"`
		L7         [][][][][][][][]string `yaml:"l7"`
	}
	b.Reset()
	b.WriteString(header + "l0: &l0 [" + strings.Repeat("x, ", 15) + "x]\n")
	for i := 1; i <= 7; i++ {
		fmt.Fprintf(&b, "l%d: &l%d [%s*l%d]\n", i, i, strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 15), i-1)
	}
	r = widgetDecoder.Decode([]byte(b.String()), &bomb{})
	want := []FieldError{{Line: 3, Msg: "the document is too large: more than 1048576 YAML nodes (aliases counted at each use)"}}
	var got []FieldError
	for _, e := range r.Errors {
		got = append(got, *e)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("alias bomb errors (-want +got):\n%s", diff)
	}
	if !reflect.DeepEqual(r.Covered, []string{""}) {
		t.Errorf("Covered = %q, want the whole document", r.Covered)
	}
}

func TestDecodeProgrammingErrors(t *testing.T) {
	for _, out := range []any{widget{}, (*widget)(nil), new(int), nil} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Decode into %T did not panic", out)
				}
			}()
			widgetDecoder.Decode([]byte(header), out)
		}()
	}
	type odd struct {
		APIVersion string              `yaml:"apiVersion"`
		Kind       string              `yaml:"kind"`
		F          float64             `yaml:"f"`
		M          map[int]string      `yaml:"m"`
		I          map[string]chan int `yaml:"i"`
	}
	r := widgetDecoder.Decode([]byte(header+"f: 1.5\nm: {1: a}\ni: {a: 1}\n"), &odd{})
	want := []string{"f: internal error: cannot decode into float64 (line 3)",
		"m: internal error: cannot decode into map[int]string (line 4)",
		"i[a]: internal error: cannot decode into chan int (line 5)"}
	if got := strings.Split(r.Errors.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("errors = %q, want %q", got, want)
	}
}

// TestMerge: validation errors under a path that failed to decode are dropped; the rest come in
// document order, errors without a line last.
func TestMerge(t *testing.T) {
	var w widget
	r := widgetDecoder.Decode([]byte(header+"servers:\n- name: [a]\n  port: 0\ntags: x\n"), &w)
	validation := ErrorList{
		{Path: "name", Msg: "is required"},
		{Path: "servers[0].name", Line: 4, Msg: "is required"},
		{Path: "servers[0]", Line: 4, Msg: "is odd"},
		{Path: "servers[01]", Line: 2, Msg: "is odd"},
		{Path: "tags[0]", Line: 6, Msg: "is required"},
		{Path: "tagsX", Line: 1, Msg: "is odd"},
	}
	var got []string
	for _, e := range r.Merge(validation) {
		got = append(got, e.Error())
	}
	want := []string{
		"tagsX: is odd (line 1)",
		"servers[01]: is odd (line 2)",
		"servers[0].name: must be a string, not a list (line 4)",
		"servers[0]: is odd (line 4)",
		"servers[0].port: 0 is not valid: write an integer from 1 to 65535; omit the key to use the default (line 5)",
		`tags: must be a list (e.g. [a, b] or one '- item' per line), not "x" (line 6)`,
		"name: is required",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Merge (-want +got):\n%s", diff)
	}
	if got := (&Result{}).Merge(nil); len(got) != 0 {
		t.Errorf("Merge of nothing = %v", got)
	}
}
