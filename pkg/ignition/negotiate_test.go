package ignition

import (
	"errors"
	"slices"
	"testing"
)

// Real Accept headers. Ignition sets them in internal/resource/url.go (configHeaders):
//   - ignition/v2 v2.24.0 internal/resource/url.go:64 (read from the pinned module):
//     "application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1"
//   - Debian 12's ignition 2.14.0 (string in /usr/lib/dracut/modules.d/30ignition/ignition, and
//     recorded on the wire by TestRealIgnitionFetchesAndWritesFiles):
//     "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"
const (
	acceptIgnition214 = "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"
	acceptIgnition224 = "application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1"
)

func TestNegotiate(t *testing.T) {
	tests := []struct {
		name, accept, want string
		wantErr            bool
	}{
		{name: "ignition 2.14 (Debian 12)", accept: acceptIgnition214, want: "3.3.0"},
		{name: "ignition 2.24", accept: acceptIgnition224, want: "3.5.0"},
		{name: "ignition speaking 3.4", accept: "application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1", want: "3.4.0"},
		{name: "future ignition 3.6 gets newest we have", accept: "application/vnd.coreos.ignition+json;version=3.6.0, */*;q=0.1", want: "3.5.0"},
		{name: "experimental spec", accept: "application/vnd.coreos.ignition+json;version=3.6.0-experimental, */*;q=0.1", want: "3.5.0"},
		{name: "future ignition without wildcard", accept: "application/vnd.coreos.ignition+json;version=3.6.0", want: "3.5.0"},
		{name: "old ignition 3.2 is refused despite */*", accept: "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1", wantErr: true},
		{name: "no header", accept: "", want: "3.3.0"},
		{name: "blank header", accept: "  ", want: "3.3.0"},
		{name: "curl */*", accept: "*/*", want: "3.3.0"},
		{name: "application/*", accept: "application/*", want: "3.3.0"},
		{name: "media type without version", accept: "application/vnd.coreos.ignition+json", want: "3.3.0"},
		{name: "several versions ranked", accept: "application/vnd.coreos.ignition+json;version=3.5.0, application/vnd.coreos.ignition+json;version=3.4.0;q=0.9, */*;q=0.1", want: "3.5.0"},
		{name: "explicit q prefers older", accept: "application/vnd.coreos.ignition+json;version=3.5.0;q=0.5, application/vnd.coreos.ignition+json;version=3.4.0", want: "3.4.0"},
		{name: "q=0 excludes", accept: "application/vnd.coreos.ignition+json;version=3.3.0;q=0, */*", want: "3.4.0"},
		{name: "case and spaces", accept: "Application/VND.CoreOS.Ignition+JSON ; Version=3.4.0 , */* ; q=0.1", want: "3.4.0"},
		{name: "quoted version", accept: `application/vnd.coreos.ignition+json;version="3.4.0"`, want: "3.4.0"},
		{name: "comma inside quoted parameter", accept: `text/plain;x="a,b", application/vnd.coreos.ignition+json;version=3.4.0`, want: "3.4.0"},
		{name: "malformed element ignored", accept: "garbage, */*", want: "3.3.0"},
		{name: "application/json is not ignition", accept: "application/json", wantErr: true},
		{name: "text/html", accept: "text/html", wantErr: true},
		{name: "only garbage", accept: "garbage", wantErr: true},
		{name: "q out of range", accept: "*/*;q=2", wantErr: true},
		{name: "everything q=0", accept: "*/*;q=0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Negotiate(tt.accept)
			if tt.wantErr {
				if !errors.Is(err, ErrNotAcceptable) {
					t.Fatalf("Negotiate(%q) = %q, %v; want ErrNotAcceptable", tt.accept, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Negotiate(%q) = %q, %v; want %q", tt.accept, got, err, tt.want)
			}
		})
	}
}

func TestNegotiateOldClientMessage(t *testing.T) {
	_, err := Negotiate("application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1")
	if err == nil || !containsAll(err.Error(), "up to 3.2.0", "3.3.0 to 3.5.0") {
		t.Fatalf("error %v does not name the client's and our versions", err)
	}
}

func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{acceptIgnition214, acceptIgnition224, "", "*/*", `a/b;x="\",", */*;q=0.001`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, accept string) {
		v, err := Negotiate(accept)
		if err != nil {
			if !errors.Is(err, ErrNotAcceptable) {
				t.Fatalf("Negotiate(%q) error %v does not wrap ErrNotAcceptable", accept, err)
			}
			return
		}
		if !slices.Contains(SupportedVersions, v) {
			t.Fatalf("Negotiate(%q) = %q, not a supported version", accept, v)
		}
	})
}
