package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzLoad feeds arbitrary bytes through the whole pipeline (decode, defaults, validate) and checks:
// no panic; errors always carry a message; a document that decodes is defaulted idempotently, and
// marshals to YAML that decodes back to the same configuration.
//
//	go test -run='^$' -fuzz=FuzzLoad -fuzztime=60s ./pkg/config
func FuzzLoad(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seed files in testdata: %v", err)
	}
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"",
		"---\n---\n",
		header + "a: &a [*a]\n",
		header + "nodes: &n [{name: a, roles: [worker]}]\nignition: {all: *n}\n",
		header + "networks: {controlPlane: {cidrs: [10.0.0.0/33, \"::/0\"]}, pods: 1}\napiServer: {port: \"x\", vip: ::1}\n",
		header + "nodes:\n- {name: a, power: {kind: ssh, hostKey: \"ssh-rsa AAAA\"}, mac: \"01:02\"}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _, errs := load(data, ValidateOptions{})
		if len(errs) == 0 && c == nil {
			t.Fatal("load: no errors and no configuration")
		}
		for _, e := range errs {
			if e == nil || e.Msg == "" {
				t.Fatalf("load: empty error in %v", errs)
			}
		}
		c, err := Decode(data)
		if err != nil {
			return
		}
		SetDefaults(c)
		once, err := Marshal(c)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		SetDefaults(c)
		twice, err := Marshal(c)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		if string(once) != string(twice) {
			t.Fatalf("SetDefaults is not idempotent:\n%s\n---\n%s", once, twice)
		}
		Validate(c, ValidateOptions{})
		back, err := Decode(once)
		if err != nil {
			t.Fatalf("Decode(Marshal(c)): %v\n%s", err, once)
		}
		if diff := cmp.Diff(c, back, cmpConfig...); diff != "" {
			t.Fatalf("round trip (-before +after):\n%s\nYAML:\n%s", diff, once)
		}
	})
}
