// Package strictyaml strictly decodes one typed YAML document (apiVersion and kind, in the manner of
// Kubernetes) into a Go struct, and reports every problem at once, each a FieldError with its field
// path and line, so that the person who wrote the document can fix it in one go. It is the decoding
// step shared by the appliance's documents (pkg/config's BootstrapConfiguration, pkg/bundlespec's
// BundleSpecification); each keeps its own defaults and semantic validation.
//
// The struct is walked by reflection, driven by its yaml tags (the same tags go.yaml.in/yaml/v3 uses
// to marshal it). Field paths use YAML keys: struct fields are joined with '.', list items are
// [index] and map entries [key] (see KeyPath), e.g. "nodes[0].power.kind" or
// "registries.hosts[quay.io].mirrors[1]".
//
// Decoder.Decode rejects, each with a message saying what to do:
//   - YAML syntax errors, an empty document and more than one document;
//   - an apiVersion or kind other than the Decoder's (then nothing else is checked, since the schema
//     of another version is unknown);
//   - unknown keys (with the valid key they most likely misspell), duplicate keys, merge keys ("<<"),
//     keys that are not strings;
//   - YAML tags on any key or value, standard (!!binary, !!str) or custom (!foo): a tag would change
//     what a value means (!!binary is base64 of other bytes) or be silently ignored;
//   - values of the wrong shape (a list where a mapping belongs, a quoted "6443" for a port) and values
//     that do not parse (see Decoder.Scalars; integers out of range; an explicit 0 in a field tagged
//     `strictyaml:"nonzero"`);
//   - documents beyond MaxNodes nodes (aliases counted at every use); at most MaxErrors errors are
//     listed.
//
// No message repeats more than MaxValueLen bytes of a value or key: longer ones are clipped (Clip).
//
// Supported field kinds: structs, pointers, slices, maps with string keys, strings, bools and unsigned
// integers; types listed in Decoder.Scalars; other types implementing encoding.TextUnmarshaler. A
// YAML null or empty value leaves a field at its zero value.
package strictyaml

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Limits that keep a hostile document (deep alias fan-out, a flood of errors) cheap to reject.
const (
	// MaxNodes bounds the YAML nodes visited while decoding, aliases counted at every use.
	MaxNodes = 1 << 20
	// MaxErrors bounds the errors reported for one document (one more says there are too many).
	MaxErrors = 200
)

// Decoder describes one kind of document. The zero value is not usable: set APIVersion, Kind and
// Empty.
type Decoder struct {
	// APIVersion and Kind are the only apiVersion and kind accepted, e.g.
	// "appliance.airgap.dev/v1alpha1" and "BootstrapConfiguration".
	APIVersion, Kind string
	// Empty is the message for an empty document (no content, only comments, or null): say what the
	// document must start with.
	Empty string
	// Scalars decodes document-specific scalar types (netip.Prefix, a size with units), by type, with
	// the document's own wording. They take precedence over encoding.TextUnmarshaler.
	Scalars map[reflect.Type]ScalarType
	// Synonyms maps keys people are likely to write from other tools' vocabulary ("keyring") to this
	// document's key for the same thing ("signedBy"); an unknown key is told the synonym when it is a
	// valid key at that place, ahead of any spelling suggestion.
	Synonyms map[string]string
}

// ScalarType decodes one Go type from YAML scalars.
type ScalarType struct {
	// Want names a valid value, for the error when a list or mapping is written instead:
	// "must be <Want>, not a list", e.g. "a CIDR such as 10.0.0.0/24".
	Want string
	// Parse returns the value for s (of the Go type; nil leaves the field unset, e.g. for ""), or an
	// error whose text is the whole message for the field (Decode adds path and line). Quote the
	// value with s.Quoted (or Quote), never s.Text whole: it may be megabytes long.
	Parse func(s Scalar) (any, error)
}

// Scalar is a YAML scalar as ScalarType.Parse sees it.
type Scalar struct {
	// Text is the value as written, without quotes or escapes.
	Text string
	// Quoted is Text as messages show it: a YAML string quoted (strconv.Quote), other scalars (numbers,
	// booleans) as written; clipped to ClipLen bytes and "…(N bytes)" when longer than MaxValueLen.
	Quoted string
}

// Result is what Decode found.
type Result struct {
	// Errors are all decoding problems, in the order found; empty when the document decoded cleanly.
	Errors ErrorList
	// Lines maps every field path present in the document to its line. nil when Fatal.
	Lines Lines
	// Covered are the paths whose values could not be decoded (their fields are left as they were):
	// validation errors at or under them are consequences, not news (see Merge).
	Covered []string
	// Fatal: the document could not be walked at all (syntax, empty, several documents, wrong
	// apiVersion or kind); the output was not touched.
	Fatal bool
}

// Decode decodes data, which must hold exactly one document, into out, a non-nil pointer to a struct
// (it panics otherwise: a programming error). Unless the result is Fatal, out receives every field that
// decoded, also when others did not, so that the caller can run its own validation and report all at
// once (see Merge).
func (dec *Decoder) Decode(data []byte, out any) *Result {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("strictyaml: Decode into %T, want a non-nil pointer to a struct", out))
	}
	root, ferr := dec.parseSingleDocument(data)
	if ferr != nil {
		return &Result{Errors: ErrorList{ferr}, Fatal: true}
	}
	if errs := dec.checkTypeMeta(root); len(errs) > 0 {
		return &Result{Errors: errs, Fatal: true}
	}
	d := &decoder{dec: dec, lines: Lines{}}
	d.value("", root, v.Elem(), false)
	return &Result{Errors: d.errs, Lines: d.lines, Covered: d.covers}
}

// Merge returns the decoding errors together with the validation errors of the decoded value, in
// document order (errors without a line last); a validation error at or under a Covered path is
// dropped, since the decoding error already says what is wrong there.
func (r *Result) Merge(validation ErrorList) ErrorList {
	errs := r.Errors
	for _, e := range validation {
		covered := false
		for _, p := range r.Covered {
			if Covers(p, e.Path) {
				covered = true
				break
			}
		}
		if !covered {
			errs = append(errs, e)
		}
	}
	sortByLine(errs)
	return errs
}

// parseSingleDocument parses data and returns the root node of its only document.
func (dec *Decoder) parseSingleDocument(data []byte) (*yaml.Node, *FieldError) {
	yd := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := yd.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{Msg: dec.Empty}
		}
		return nil, syntaxError(err)
	}
	var extra yaml.Node
	switch err := yd.Decode(&extra); {
	case err == nil:
		line := extra.Line
		if len(extra.Content) > 0 {
			line = extra.Content[0].Line
		}
		return nil, &FieldError{Line: line, Msg: "a second YAML document starts here: the file must hold exactly one " +
			dec.Kind + " document; remove the '---' separator and what follows, or split it into another file"}
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &FieldError{Msg: dec.Empty}
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, &FieldError{Line: root.Line, Msg: dec.Empty}
	}
	if root.Kind != yaml.MappingNode {
		return nil, &FieldError{Line: root.Line, Msg: "the document must be a mapping (apiVersion: ..., kind: ..., ...), not " + string(describe(root))}
	}
	return root, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError turns a yaml.v3 parse error ("yaml: line 3: mapping values are not allowed in this
// context") into a FieldError carrying the line.
func syntaxError(err error) *FieldError {
	msg := err.Error()
	line := 0
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return &FieldError{Line: line, Msg: "invalid YAML: " + msg}
}

// checkTypeMeta checks apiVersion and kind before anything else.
func (dec *Decoder) checkTypeMeta(root *yaml.Node) ErrorList {
	var errs ErrorList
	for _, want := range []struct{ key, value string }{{"apiVersion", dec.APIVersion}, {"kind", dec.Kind}} {
		k, v := lookupKey(root, want.key)
		switch {
		case k == nil:
			errs = append(errs, &FieldError{Path: want.key, Line: root.Line,
				Msg: fmt.Sprintf("is required: add `%s: %s` at the top of the document", want.key, want.value)})
		case v.Kind != yaml.ScalarNode || v.Value != want.value:
			errs = append(errs, &FieldError{Path: want.key, Line: k.Line,
				Msg: fmt.Sprintf("%s is not supported: this appliance reads %s only", quoteNode(v), want.value)})
		}
	}
	return errs
}

// lookupKey finds key in a mapping node (first occurrence), following an alias on the value.
func lookupKey(m *yaml.Node, key string) (k, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == key {
			v = m.Content[i+1]
			if v.Kind == yaml.AliasNode && v.Alias != nil {
				v = v.Alias
			}
			return m.Content[i], v
		}
	}
	return nil, nil
}

var textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()

// decoder walks a yaml.Node tree into a Go value by reflection, driven by the yaml struct tags, and
// records every problem instead of stopping at the first.
type decoder struct {
	dec     *Decoder
	errs    ErrorList
	covers  []string
	lines   Lines
	visited int
}

// bad records that the value at path could not be decoded (see Result.Covered) and why.
func (d *decoder) bad(path string, line int, format string, args ...any) {
	d.covers = append(d.covers, path)
	d.fail(path, line, format, args...)
}

// fail records an error. Long string and error arguments and a long path are clipped (ClipArgs).
func (d *decoder) fail(path string, line int, format string, args ...any) {
	switch {
	case len(d.errs) < MaxErrors:
		d.errs = append(d.errs, &FieldError{Path: clipPath(path), Line: line, Msg: fmt.Sprintf(format, ClipArgs(args)...)})
	case len(d.errs) == MaxErrors:
		d.errs = append(d.errs, &FieldError{Line: line, Msg: fmt.Sprintf("too many errors (more than %d): fix these first", MaxErrors)})
	}
}

// value decodes n into v. nonzero: an explicit 0 is rejected (0 means "unset, use the default" in
// Go, so it may not be written).
func (d *decoder) value(path string, n *yaml.Node, v reflect.Value, nonzero bool) {
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.bad(path, n.Line, "alias *%s refers to no anchor", n.Value)
			return
		}
		n = n.Alias
	}
	if d.visited++; d.visited > MaxNodes {
		if d.visited == MaxNodes+1 {
			d.bad("", n.Line, "the document is too large: more than %d YAML nodes (aliases counted at each use)", MaxNodes)
		}
		return
	}
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = n.Line
	}
	if n.Style&yaml.TaggedStyle != 0 {
		d.bad(path, n.Line, "YAML tags are not supported (%s): remove the tag and write the plain value", n.Tag)
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // null or empty: leave the zero value, defaults apply
	}
	t := v.Type()
	if st, ok := d.dec.Scalars[t]; ok {
		if !d.scalar(path, n, st.Want) {
			return
		}
		x, err := st.Parse(Scalar{Text: n.Value, Quoted: string(quoteNode(n))})
		if err != nil {
			d.bad(path, n.Line, "%v", err)
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
		return
	}
	if t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(textUnmarshalerType) {
		if !d.scalar(path, n, "a string") {
			return
		}
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			d.bad(path, n.Line, "%s is not valid: %v", quoteNode(n), err)
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		d.value(path, n, v.Elem(), nonzero)
	case reflect.Struct:
		d.mapping(path, n, v)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.bad(path, n.Line, "must be a list (e.g. [a, b] or one '- item' per line), not %s", describe(n))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.value(fmt.Sprintf("%s[%d]", path, i), item, s.Index(i), false)
		}
		v.Set(s)
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			d.bad(path, n.Line, "internal error: cannot decode into %s", t)
			return
		}
		d.stringMap(path, n, v)
	case reflect.String:
		if d.scalar(path, n, "a string") {
			v.SetString(n.Value)
		}
	case reflect.Bool:
		if !d.scalar(path, n, "true or false") {
			return
		}
		var b bool
		if n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
			d.bad(path, n.Line, "%s is not a boolean: write true or false", quoteNode(n))
			return
		}
		v.SetBool(b)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		lo, hi := uint64(0), uint64(1)<<(8*t.Size())-1
		if nonzero {
			lo = 1
		}
		if !d.scalar(path, n, fmt.Sprintf("an integer from %d to %d", lo, hi)) {
			return
		}
		var i int64
		if n.ShortTag() != "!!int" || n.Decode(&i) != nil || i < int64(lo) || uint64(i) > hi {
			hint := ""
			if n.ShortTag() == "!!str" && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
				hint = " (without quotes)"
			}
			if nonzero && n.ShortTag() == "!!int" && i == 0 {
				hint = "; omit the key to use the default"
			}
			d.bad(path, n.Line, "%s is not valid: write an integer from %d to %d%s", quoteNode(n), lo, hi, hint)
			return
		}
		v.SetUint(uint64(i))
	default:
		// A field type this package does not support: a programming error, not a user error.
		d.bad(path, n.Line, "internal error: cannot decode into %s", t)
	}
}

// scalar reports whether n is a scalar, recording an error naming want otherwise.
func (d *decoder) scalar(path string, n *yaml.Node, want string) bool {
	if n.Kind == yaml.ScalarNode {
		return true
	}
	d.bad(path, n.Line, "must be %s, not %s", want, describe(n))
	return false
}

// fieldInfo is one struct field as seen from YAML.
type fieldInfo struct {
	index   int
	nonzero bool
}

// structFields maps the YAML keys of struct type t to its fields, and lists the keys in order.
func structFields(t reflect.Type) (map[string]fieldInfo, []string) {
	fields := map[string]fieldInfo{}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = fieldInfo{index: i, nonzero: f.Tag.Get("strictyaml") == "nonzero"}
		names = append(names, name)
	}
	return fields, names
}

// entries walks the key/value pairs of mapping n, reporting non-string, merge and duplicate keys at
// the path child(path, key), and calls f for every other pair with the key node (aliases resolved).
func (d *decoder) entries(path string, n *yaml.Node, child func(path, key string) string, f func(k, val *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.AliasNode && k.Alias != nil {
			k = k.Alias
		}
		if k.Kind != yaml.ScalarNode {
			d.fail(path, k.Line, "keys must be plain strings, not %s", describe(k))
			continue
		}
		if k.Style&yaml.TaggedStyle != 0 {
			d.fail(child(path, Clip(k.Value)), k.Line, "YAML tags are not supported (%s): remove the tag and write the plain key", k.Tag)
			continue
		}
		if k.Value == "<<" {
			d.fail(child(path, k.Value), k.Line, "merge keys (<<) are not supported: write the fields out")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.fail(child(path, Clip(k.Value)), k.Line, "duplicate key (first set at line %d): keep one", first)
			continue
		}
		seen[k.Value] = k.Line
		f(k, val)
	}
}

// mapping decodes mapping n into struct v.
func (d *decoder) mapping(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.bad(path, n.Line, "must be a mapping of key: value, not %s", describe(n))
		return
	}
	fields, names := structFields(v.Type())
	d.entries(path, n, fieldPath, func(k, val *yaml.Node) {
		child := fieldPath(path, k.Value)
		f, ok := fields[k.Value]
		if !ok {
			msg := fmt.Sprintf("unknown field %s", Quote(k.Value))
			if s := d.suggest(k.Value, names); s != "" {
				msg += fmt.Sprintf(": did you mean %q?", s)
			} else {
				msg += fmt.Sprintf(": valid keys here are %s", strings.Join(names, ", "))
			}
			d.fail(fieldPath(path, Clip(k.Value)), k.Line, "%s", quoted(msg))
			return
		}
		if _, ok := d.lines[child]; !ok {
			d.lines[child] = k.Line
		}
		d.value(child, val, v.Field(f.index), f.nonzero)
	})
}

// stringMap decodes a mapping with arbitrary string keys (e.g. registry hosts) into map v; entries are
// addressed as path[key] (KeyPath).
func (d *decoder) stringMap(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.bad(path, n.Line, "must be a mapping of key: value, not %s", describe(n))
		return
	}
	t := v.Type()
	m := reflect.MakeMapWithSize(t, len(n.Content)/2)
	d.entries(path, n, KeyPath, func(k, val *yaml.Node) {
		child := KeyPath(path, k.Value)
		if _, ok := d.lines[child]; !ok {
			d.lines[child] = k.Line
		}
		elem := reflect.New(t.Elem()).Elem()
		d.value(child, val, elem, false)
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(t.Key()), elem)
	})
	v.Set(m)
}

// describe names the shape of a node for error messages.
func describe(n *yaml.Node) quoted {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		return quoteNode(n)
	}
	return "an empty document"
}

// quoteNode renders a node's value for messages: strings quoted, other scalars as written, both
// clipped (Clip).
func quoteNode(n *yaml.Node) quoted {
	if n.Kind != yaml.ScalarNode {
		return describe(n)
	}
	if n.ShortTag() == "!!str" {
		return quoted(Quote(n.Value))
	}
	return quoted(Clip(n.Value))
}

// clipPath shortens a path that holds a long key (clipped like a value).
func clipPath(path string) string {
	if len(path) <= 2*MaxValueLen {
		return path
	}
	return Clip(path)
}

// suggest returns the key in names that key most likely misspells: its Synonyms entry; a name equal
// ignoring case; or, for keys longer than 3 characters, a name it is a prefix of or the closest name
// within 2 edits. "" when none.
func (d *decoder) suggest(key string, names []string) string {
	if syn, ok := d.dec.Synonyms[key]; ok {
		for _, name := range names {
			if syn == name {
				return name
			}
		}
	}
	best, bestDist := "", 3
	for _, name := range names {
		if strings.EqualFold(key, name) {
			return name
		}
		if len(key) <= 3 {
			continue
		}
		if strings.HasPrefix(strings.ToLower(name), strings.ToLower(key)) {
			return name // "passwordFile" for "password"
		}
		if dist := editDistance(strings.ToLower(key), strings.ToLower(name)); dist < bestDist {
			best, bestDist = name, dist
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
