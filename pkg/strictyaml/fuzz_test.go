package strictyaml

import (
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// fuzzSeeds cover every error class and field kind of widget.
var fuzzSeeds = []string{
	"",
	"---\n---\n",
	"~\n",
	"- a\n",
	header,
	header + "name: w\nenabled: true\nport: 8443\ncount: 0x10\ncolor: red\nlisten: \"[::1]:443\"\ntags: [a, b]\n",
	header + "servers:\n- {name: a, port: 22}\n- &s {name: b}\n- *s\nhosts:\n  quay.io: {mirrors: [m], caFile: /c}\n  \"[fd00::1]:5\": ~\n",
	header + "nmae: a\nname: b\nname: c\n<<: {}\n? [k]\n: v\nport: 0\ncount: \"1\"\nenabled: yes\ncolor: [x]\n",
	header + "a: &a [*a]\ntags: &t [x, *t]\n",
	header + "hosts: {<<: *x}\n",
	"apiVersion: example.test/v2\nkind: Widget\n",
}

// FuzzDecode feeds arbitrary bytes to Decode and checks: no panic; every error has a message and at
// most MaxErrors+1 are listed; a fatal result leaves the output untouched and has no lines; lines are
// 1-based; a document that decodes without errors marshals (yaml.v3) to one that decodes back to the
// same value.
//
//	go test -run='^$' -fuzz=FuzzDecode -fuzztime=60s ./pkg/strictyaml
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var w widget
		r := widgetDecoder.Decode(data, &w)
		if len(r.Errors) > MaxErrors+1 {
			t.Fatalf("%d errors", len(r.Errors))
		}
		for _, e := range r.Errors {
			if e == nil || e.Msg == "" || e.Line < 0 {
				t.Fatalf("bad error in %v", r.Errors)
			}
		}
		if r.Fatal {
			if len(r.Errors) == 0 || r.Lines != nil || !reflect.DeepEqual(w, widget{}) {
				t.Fatalf("fatal result: errors %v, lines %v, output %+v", r.Errors, r.Lines, w)
			}
			return
		}
		for p, l := range r.Lines {
			if l < 1 {
				t.Fatalf("Lines[%q] = %d", p, l)
			}
		}
		if len(r.Errors) > 0 {
			return
		}
		out, err := yaml.Marshal(&w)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		var back widget
		if r := widgetDecoder.Decode(out, &back); len(r.Errors) > 0 {
			t.Fatalf("Decode(Marshal(w)): %v\n%s", r.Errors, out)
		}
		if diff := cmp.Diff(w, back, cmpWidget...); diff != "" {
			t.Fatalf("round trip (-before +after):\n%s\nYAML:\n%s", diff, out)
		}
		if strings.Contains(string(out), "\t") && !strings.Contains(string(data), "\t") {
			t.Fatalf("tab from nowhere:\n%s", out)
		}
	})
}
