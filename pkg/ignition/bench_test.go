package ignition

import "testing"

// BenchmarkRender measures Render for the golden node (params checks, base config, validation,
// one snippet parsed).
func BenchmarkRender(b *testing.B) {
	p := goldenParams(b)
	for b.Loop() {
		if _, err := Render(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarshal measures one served response per version: translate, merge one snippet,
// validate, encode.
func BenchmarkMarshal(b *testing.B) {
	c := mustRender(b, goldenParams(b))
	for _, v := range SupportedVersions {
		b.Run(v, func(b *testing.B) {
			for b.Loop() {
				if _, _, err := c.Marshal(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNegotiate measures Negotiate on ignition 2.14's Accept header.
func BenchmarkNegotiate(b *testing.B) {
	for b.Loop() {
		if _, err := Negotiate(acceptIgnition214); err != nil {
			b.Fatal(err)
		}
	}
}
