package k8sversion

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestTableShape: minors strictly ascending, each Source a release of its minor, every version
// field set, and the minors the three the Kubernetes project maintains.
func TestTableShape(t *testing.T) {
	prev := ""
	for _, r := range Releases() {
		if m, err := Minor(r.Minor + ".0"); err != nil || m != r.Minor {
			t.Errorf("Minor %q is not v1.N", r.Minor)
		}
		if m, err := Minor(r.Source); err != nil || m != r.Minor || strings.ContainsAny(r.Source, "-+") {
			t.Errorf("%s: Source %q is not a release of the minor", r.Minor, r.Source)
		}
		if r.Etcd == "" || r.CoreDNS == "" || r.Pause == "" {
			t.Errorf("%s: empty version in %+v", r.Minor, r)
		}
		if prev != "" && minorNumber(t, r.Minor) <= minorNumber(t, prev) {
			t.Errorf("%s follows %s: the table is oldest first", r.Minor, prev)
		}
		prev = r.Minor
	}
	if got := Minors(); !slices.Equal(got, []string{"v1.35", "v1.36", "v1.37"}) {
		t.Errorf("Minors() = %q", got)
	}
	if n := Newest(); n.Minor != "v1.37" || n.Source != "v1.37.2" {
		t.Errorf("Newest() = %+v", n)
	}
	// Releases is a copy.
	Releases()[0].Pause = "changed"
	if releases[0].Pause == "changed" {
		t.Error("Releases() returned the table itself")
	}
}

func minorNumber(t *testing.T, minor string) int {
	t.Helper()
	var major, n int
	if _, err := fmt.Sscanf(minor, "v%d.%d", &major, &n); err != nil {
		t.Fatalf("%q: %v", minor, err)
	}
	return major*1000 + n
}

// TestLookup: the minor decides; any other minor is refused with the supported list, v1.34 (past
// its end of life) like v1.33 and v1.38; malformed versions are refused as such.
func TestLookup(t *testing.T) {
	for _, tt := range []struct{ version, minor, pause string }{
		{"v1.35.0", "v1.35", "3.10.1"},
		{"v1.36.3", "v1.36", "3.10.2"},
		{"v1.37.2", "v1.37", "3.10.2"},
		{"v1.37.99", "v1.37", "3.10.2"},
		{"v1.37.0-rc.1", "v1.37", "3.10.2"},
	} {
		r, err := Lookup(tt.version)
		if err != nil || r.Minor != tt.minor || r.Pause != tt.pause {
			t.Errorf("Lookup(%s) = %+v, %v", tt.version, r, err)
		}
	}
	const list = "the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2"
	if got := SupportedText(); got != list {
		t.Errorf("SupportedText() = %q, want %q", got, list)
	}
	for _, v := range []string{"v1.34.4", "v1.33.5", "v1.38.0", "v2.35.0", "v0.35.1"} {
		_, err := Lookup(v)
		want := "unsupported Kubernetes minor " + v[:strings.LastIndexByte(v, '.')] + ": " + list
		if !errors.Is(err, ErrUnsupported) || err.Error() != want {
			t.Errorf("Lookup(%s) = %v, want %q", v, err, want)
		}
	}
	for _, v := range []string{"", "1.35.0", "v1.35", "stable", "v1.35.0.1", "v01.35.0", "v1.35.0 "} {
		if _, err := Lookup(v); !errors.Is(err, ErrNotAVersion) || !strings.Contains(err.Error(), "e.g. v1.37.2") {
			t.Errorf("Lookup(%q) = %v, want ErrNotAVersion", v, err)
		}
	}
}

// TestImages: kubeadm's image names for the default and a private repository.
func TestImages(t *testing.T) {
	r, err := Lookup("v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ got, want string }{
		{r.EtcdImage(DefaultImageRepository), "registry.k8s.io/etcd:3.7.0-0"},
		{r.PauseImage(DefaultImageRepository), "registry.k8s.io/pause:3.10.2"},
		{r.CoreDNSImage(DefaultImageRepository), "registry.k8s.io/coredns/coredns:v1.14.6"},
		{r.CoreDNSImage("10.100.0.2:8443/k8s"), "10.100.0.2:8443/k8s/coredns:v1.14.6"},
		{r.AptRepository(), "https://pkgs.k8s.io/core:/stable:/v1.37/deb/"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestAptRepositoryMinor(t *testing.T) {
	for _, tt := range []struct {
		uri, minor string
		ok         bool
	}{
		{"https://pkgs.k8s.io/core:/stable:/v1.36/deb/", "v1.36", true},
		{"https://pkgs.k8s.io/core:/stable:/v1.36/deb", "v1.36", true},
		{"http://pkgs.k8s.io/core:/stable:/v1.30/deb/", "v1.30", true},
		{"https://pkgs.k8s.io/addons:/cri-o:/stable:/v1.36/deb/", "", false},
		{"https://mirror.corp/pkgs.k8s.io/core:/stable:/v1.36/deb/", "", false},
		{"https://deb.debian.org/debian", "", false},
	} {
		if m, ok := AptRepositoryMinor(tt.uri); m != tt.minor || ok != tt.ok {
			t.Errorf("AptRepositoryMinor(%q) = %q, %v", tt.uri, m, ok)
		}
	}
	for _, r := range Releases() {
		if m, ok := AptRepositoryMinor(r.AptRepository()); !ok || m != r.Minor {
			t.Errorf("%s: AptRepository %q reads back as %q", r.Minor, r.AptRepository(), m)
		}
	}
}
