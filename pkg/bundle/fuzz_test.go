package bundle

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseSums: no panic on any input, and whatever parses survives a FormatSums round trip.
func FuzzParseSums(f *testing.F) {
	h := strings.Repeat("0a", 32)
	f.Add([]byte(h + "  a/b\n" + h + " *c\n"))
	f.Add([]byte(`\` + h + `  a\\b\nc` + "\n"))
	f.Add([]byte(h + "  ../x\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, in []byte) {
		sums, err := ParseSums(bytes.NewReader(in))
		if err != nil {
			return
		}
		again, err := ParseSums(bytes.NewReader(FormatSums(sums)))
		if err != nil {
			t.Fatalf("FormatSums output does not parse: %v", err)
		}
		want := map[string]string{}
		for _, s := range sums {
			want[s.Path] = s.SHA256
		}
		if len(again) != len(sums) {
			t.Fatalf("round trip changed count %d → %d", len(sums), len(again))
		}
		for _, s := range again {
			if want[s.Path] != s.SHA256 {
				t.Fatalf("round trip changed %q", s.Path)
			}
		}
	})
}

// FuzzParseMetadata: no panic, and valid metadata survives a MarshalMetadata round trip.
func FuzzParseMetadata(f *testing.F) {
	f.Add([]byte("apiVersion: appliance.airgap.dev/v1alpha1\nkind: Bundle\nname: x\nkubernetesVersion: v1.37.2\ncreated: 2025-01-01T00:00:00Z\n"))
	f.Add([]byte("name: [a, b]\n"))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseMetadata(in)
		if err != nil {
			return
		}
		out, err := MarshalMetadata(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseMetadata(out)
		if err != nil || !m2.Created.Equal(m.Created) || m2.Name != m.Name || m2.KubernetesVersion != m.KubernetesVersion {
			t.Fatalf("round trip: %+v → %+v, %v", m, m2, err)
		}
	})
}

// FuzzParseRepoIndexes: the Release and Packages parsers never panic on arbitrary deb822 input.
func FuzzParseRepoIndexes(f *testing.F) {
	h := strings.Repeat("ab", 32)
	f.Add([]byte("Suite: stable\nSHA256:\n " + h + " 12 main/binary-amd64/Packages\n"))
	f.Add([]byte("Package: a\nFilename: pool/a.deb\nSize: 1\nSHA256: " + h + "\n\nPackage: b\n"))
	f.Add([]byte("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nSuite: x\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		if got, err := parseReleaseSHA256(bytes.NewReader(in)); err == nil {
			for name, fh := range got {
				if checkRelPath(name) != nil || len(fh.Hash) != 64 || fh.Size < 0 {
					t.Fatalf("accepted bad entry %q %+v", name, fh)
				}
			}
		}
		if got, err := parsePackages(bytes.NewReader(in)); err == nil {
			for _, e := range got {
				if checkRelPath(e.Filename) != nil || e.Size < 0 || len(e.SHA256) != 64 {
					t.Fatalf("accepted bad entry %+v", e)
				}
			}
		}
	})
}
