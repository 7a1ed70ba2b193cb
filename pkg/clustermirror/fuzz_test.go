package clustermirror

import (
	"net/url"
	"strings"
	"testing"
)

// TestNextLink: the rel="next" link of a catalog or tags page (RFC 8288), relative or absolute, is
// followed only to the same host and scheme; anything else ends the listing or is refused.
func TestNextLink(t *testing.T) {
	base, _ := url.Parse("https://10.0.0.1:8443/v2/_catalog?n=1000")
	for _, tt := range []struct {
		links []string
		want  string
		err   bool
	}{
		{nil, "", false},
		{[]string{`</v2/_catalog?last=b&n=1000>; rel="next"`}, "https://10.0.0.1:8443/v2/_catalog?last=b&n=1000", false},
		{[]string{`<https://10.0.0.1:8443/v2/_catalog?last=b>; rel=next`}, "https://10.0.0.1:8443/v2/_catalog?last=b", false},
		{[]string{`</a>; rel="prev", </v2/x/tags/list?last=1>; rel="next"`}, "https://10.0.0.1:8443/v2/x/tags/list?last=1", false},
		{[]string{`</v2/_catalog?last=b>; rel="prev"`}, "", false},
		{[]string{`<https://evil.example/v2/_catalog>; rel="next"`}, "", true},
		{[]string{`<http://10.0.0.1:8443/v2/_catalog>; rel="next"`}, "", true},
		{[]string{`garbage`}, "", false},
	} {
		got, err := nextLink(base, tt.links)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("nextLink(%q) = %q, %v; want %q, error %v", tt.links, got, err, tt.want, tt.err)
		}
	}
}

// FuzzNextLink: no Link header, however malformed, panics nextLink or leads it off the upstream.
func FuzzNextLink(f *testing.F) {
	f.Add(`</v2/_catalog?last=b&n=1000>; rel="next"`)
	f.Add(`<https://evil.example/x>; rel=next, <//evil.example/y>; rel="next"`)
	f.Add(`<%zz>; rel="next"`)
	base, _ := url.Parse("https://10.0.0.1:8443/v2/_catalog")
	f.Fuzz(func(t *testing.T, link string) {
		got, err := nextLink(base, []string{link})
		if err == nil && got != "" && !strings.HasPrefix(got, "https://10.0.0.1:8443/") {
			t.Fatalf("nextLink(%q) = %q: left the upstream", link, got)
		}
	})
}
