package bundlespec

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzDecode feeds arbitrary bytes through the whole pipeline and checks: no panic (in Decode,
// SetDefaults, Validate or Marshal); errors always carry a message; a document that decodes is
// defaulted idempotently, validates without crashing, and marshals to YAML that decodes back to the
// same specification, which validates the same way.
//
//	go test -run='^$' -fuzz=FuzzDecode -fuzztime=60s ./pkg/bundlespec
func FuzzDecode(f *testing.F) {
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
		header + "packages: &p [a, b]\nextraPackages: *p\n",
		header + "kubernetes: {version: v1.37.2}\nimages: {extra: [\"busybox:@sha\", \"quay.io/a@sha256:00\", \"[::1]:5/a:1\"]}\n",
		header + "platforms: [all, linux/arm/v7, Linux/x86_64, /]\noutput: {partSize: 4.7GB}\n",
		header + "registries:\n  hosts:\n    \"[fd00::1]:5000\": {mirrors: [\"https://[::1]:0/x\", \"http://m\"]}\n    \"\": {}\n    a]b: {caFile: ~/x}\n",
		header + "apt:\n  sources:\n  - {uri: \"https://pkgs.k8s.io/core:/stable:/v1.37/deb/\", suite: /, components: [main], signedBy: /k}\n",
		header + "output: {partSize: 99999999999999999999999}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, errs := load(data, ValidateOptions{})
		if len(errs) == 0 && s == nil {
			t.Fatal("load: no errors and no specification")
		}
		for _, e := range errs {
			if e == nil || e.Msg == "" {
				t.Fatalf("load: empty error in %v", errs)
			}
		}
		s, err := Decode(data)
		if err != nil {
			return
		}
		SetDefaults(s)
		once, err := Marshal(s)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		SetDefaults(s)
		twice, err := Marshal(s)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		if string(once) != string(twice) {
			t.Fatalf("SetDefaults is not idempotent:\n%s\n---\n%s", once, twice)
		}
		verrs := Validate(s, ValidateOptions{})
		back, err := Decode(once)
		if err != nil {
			t.Fatalf("Decode(Marshal(s)): %v\n%s", err, once)
		}
		if diff := cmp.Diff(s, back, cmpSpec...); diff != "" {
			t.Fatalf("round trip (-before +after):\n%s\nYAML:\n%s", diff, once)
		}
		// The re-read document is judged the same: same paths, same messages (lines may differ).
		berrs := Validate(back, ValidateOptions{})
		if len(berrs) != len(verrs) {
			t.Fatalf("Validate after round trip: %d errors, before %d:\n%v\n---\n%v", len(berrs), len(verrs), berrs, verrs)
		}
		for i := range verrs {
			if verrs[i].Path != berrs[i].Path || verrs[i].Msg != berrs[i].Msg {
				t.Fatalf("Validate after round trip differs: %v vs %v", berrs[i], verrs[i])
			}
		}
	})
}
