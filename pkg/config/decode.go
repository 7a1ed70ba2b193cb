package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Limits that keep a hostile document (deep alias fan-out, a flood of errors) cheap to reject.
const (
	// maxNodes bounds the YAML nodes visited while decoding, aliases counted at every use.
	maxNodes = 1 << 20
	// maxErrors bounds the errors reported for one document.
	maxErrors = 200
)

// Decode strictly decodes one BootstrapConfiguration YAML document. It does not apply defaults or
// run Validate. On failure it returns a nil configuration and an ErrorList holding every problem
// found, each with its field path and line:
//   - YAML syntax errors, an empty input, or more than one document;
//   - an apiVersion or kind other than APIVersion and Kind (then nothing else is checked, since the
//     schema of another version is unknown);
//   - unknown keys, duplicate keys, merge keys ("<<");
//   - values of the wrong shape (a list where a mapping belongs, a quoted "6443" for a port) and values
//     that do not parse (CIDRs, IP addresses, integers out of range, an explicit 0 where 0 is not a
//     valid value).
func Decode(data []byte) (*BootstrapConfiguration, error) {
	r := decodeAll(data)
	if len(r.errs) > 0 {
		return nil, r.errs
	}
	return r.cfg, nil
}

// decodeResult is what decodeAll found.
type decodeResult struct {
	// cfg is the decoded configuration; fields whose value could not be decoded are left zero. nil
	// when fatal.
	cfg *BootstrapConfiguration
	// errs are all decoding problems.
	errs ErrorList
	// covers are the paths whose value could not be decoded: validation errors at or under them are
	// consequences, not news.
	covers []string
	// fatal: the document could not be walked at all (syntax, empty, several documents, wrong
	// apiVersion or kind).
	fatal bool
}

// decodeAll is Decode that also returns the partially decoded configuration when the errors are
// confined to fields, so Load can run Validate and report everything at once.
func decodeAll(data []byte) decodeResult {
	root, ferr := parseSingleDocument(data)
	if ferr != nil {
		return decodeResult{errs: ErrorList{ferr}, fatal: true}
	}
	if errs := checkTypeMeta(root); len(errs) > 0 {
		return decodeResult{errs: errs, fatal: true}
	}
	d := &decoder{lines: map[string]int{}}
	c := &BootstrapConfiguration{}
	d.value("", root, reflect.ValueOf(c).Elem(), false)
	c.lines = d.lines
	return decodeResult{cfg: c, errs: d.errs, covers: d.covers}
}

// parseSingleDocument parses data and returns the root node of its only document.
func parseSingleDocument(data []byte) (*yaml.Node, *FieldError) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{Msg: emptyMsg}
		}
		return nil, syntaxError(err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		line := extra.Line
		if len(extra.Content) > 0 {
			line = extra.Content[0].Line
		}
		return nil, &FieldError{Line: line, Msg: "a second YAML document starts here: the file must hold exactly one " +
			Kind + " document; remove the '---' separator and what follows, or split it into another file"}
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &FieldError{Msg: emptyMsg}
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, &FieldError{Line: root.Line, Msg: emptyMsg}
	}
	if root.Kind != yaml.MappingNode {
		return nil, &FieldError{Line: root.Line, Msg: "the document must be a mapping (apiVersion: ..., kind: ..., ...), not " + describe(root)}
	}
	return root, nil
}

const emptyMsg = "the configuration is empty: it must be one YAML document starting with `apiVersion: " +
	APIVersion + "` and `kind: " + Kind + "` (`appliance config defaults` prints a complete example)"

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
func checkTypeMeta(root *yaml.Node) ErrorList {
	var errs ErrorList
	for _, want := range []struct{ key, value string }{{"apiVersion", APIVersion}, {"kind", Kind}} {
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

// lookupKey finds key in a mapping node (first occurrence), following aliases on the value.
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

var (
	prefixType = reflect.TypeFor[netip.Prefix]()
	addrType   = reflect.TypeFor[netip.Addr]()
)

// decoder walks a yaml.Node tree into a Go value by reflection, driven by the yaml struct tags, and
// records every problem instead of stopping at the first. A struct field tagged `config:"nonzero"`
// rejects an explicit 0 (0 means "unset, use the default" in Go, so it may not be written).
type decoder struct {
	errs    ErrorList
	covers  []string
	lines   map[string]int
	visited int
}

// bad records that the value at path could not be decoded (see decodeResult.covers) and why.
func (d *decoder) bad(path string, line int, format string, args ...any) {
	d.covers = append(d.covers, path)
	d.fail(path, line, format, args...)
}

func (d *decoder) fail(path string, line int, format string, args ...any) {
	switch {
	case len(d.errs) < maxErrors:
		d.errs = append(d.errs, &FieldError{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
	case len(d.errs) == maxErrors:
		d.errs = append(d.errs, &FieldError{Line: line, Msg: fmt.Sprintf("too many errors (more than %d): fix these first", maxErrors)})
	}
}

func (d *decoder) value(path string, n *yaml.Node, v reflect.Value, nonzero bool) {
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.bad(path, n.Line, "alias *%s refers to no anchor", n.Value)
			return
		}
		n = n.Alias
	}
	if d.visited++; d.visited > maxNodes {
		if d.visited == maxNodes+1 {
			d.bad("", n.Line, "the document is too large: more than %d YAML nodes (aliases counted at each use)", maxNodes)
		}
		return
	}
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = n.Line
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // null or empty: leave the zero value, defaults apply
	}
	t := v.Type()
	switch {
	case t == prefixType:
		if !d.scalar(path, n, "a CIDR such as 10.0.0.0/24") || n.Value == "" {
			return
		}
		p, err := netip.ParsePrefix(n.Value)
		if err != nil {
			d.bad(path, n.Line, "%q is not a CIDR: write a network address and prefix length, e.g. 10.0.0.0/24", n.Value)
			return
		}
		v.Set(reflect.ValueOf(p))
		return
	case t == addrType:
		if !d.scalar(path, n, "an IP address such as 10.0.0.1") || n.Value == "" {
			return
		}
		a, err := netip.ParseAddr(n.Value)
		if err != nil || a.Zone() != "" {
			d.bad(path, n.Line, "%q is not an IP address: write a plain IPv4 or IPv6 address (no prefix length, no %%zone), e.g. 10.0.0.1", n.Value)
			return
		}
		v.Set(reflect.ValueOf(a))
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
		// Unreachable for the types of this package; a programming error, not a user error.
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
		fields[name] = fieldInfo{index: i, nonzero: f.Tag.Get("config") == "nonzero"}
		names = append(names, name)
	}
	return fields, names
}

func (d *decoder) mapping(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.bad(path, n.Line, "must be a mapping of key: value, not %s", describe(n))
		return
	}
	fields, names := structFields(v.Type())
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
		key := k.Value
		child := key
		if path != "" {
			child = path + "." + key
		}
		if key == "<<" {
			d.fail(child, k.Line, "merge keys (<<) are not supported: write the fields out")
			continue
		}
		if first, dup := seen[key]; dup {
			d.fail(child, k.Line, "duplicate key (first set at line %d): keep one", first)
			continue
		}
		seen[key] = k.Line
		f, ok := fields[key]
		if !ok {
			msg := fmt.Sprintf("unknown field %q", key)
			if s := suggest(key, names); s != "" {
				msg += fmt.Sprintf(": did you mean %q?", s)
			} else {
				msg += fmt.Sprintf(": valid keys here are %s", strings.Join(names, ", "))
			}
			d.fail(child, k.Line, "%s", msg)
			continue
		}
		if _, ok := d.lines[child]; !ok {
			d.lines[child] = k.Line
		}
		d.value(child, val, v.Field(f.index), f.nonzero)
	}
}

// describe names the shape of a node for error messages.
func describe(n *yaml.Node) string {
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

// quoteNode renders a node's value for messages: strings quoted, other scalars as written.
func quoteNode(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return describe(n)
	}
	if n.ShortTag() == "!!str" {
		return strconv.Quote(n.Value)
	}
	return n.Value
}

// suggest returns the key in names that key most likely misspells: equal ignoring case; or, for keys
// longer than 3 characters, a prefix of it or the closest within 2 edits. "" when none.
func suggest(key string, names []string) string {
	best, bestDist := "", 3
	for _, name := range names {
		if strings.EqualFold(key, name) {
			return name
		}
		if len(key) <= 3 {
			continue
		}
		if strings.HasPrefix(strings.ToLower(name), strings.ToLower(key)) {
			return name // "password" for "passwordFile"
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
