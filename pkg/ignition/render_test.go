package ignition

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_3"
	"github.com/coreos/ignition/v2/config/v3_4"
	"github.com/coreos/ignition/v2/config/v3_5"
	types35 "github.com/coreos/ignition/v2/config/v3_5/types"
	"github.com/coreos/ignition/v2/config/validate"
	"github.com/vincent-petithory/dataurl"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const hostagentBlob = "#!/bin/sh\necho hostagent\n"

func hostagentDigest() string {
	sum := sha256.Sum256([]byte(hostagentBlob))
	return hex.EncodeToString(sum[:])
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goldenParams is a control-plane node with two mirrors (one with an explicit endpoint) and a
// spec 3.1.0 snippet adding a file.
func goldenParams(t testing.TB) Params {
	return Params{
		Node:         "cp-1",
		ApplianceURL: "https://10.100.0.1:8443",
		CAPEM:        readFile(t, "testdata/ca.pem"),
		Mirrors: []Mirror{
			{Registry: "registry.k8s.io"},
			{Registry: "docker.io", Endpoint: "https://10.100.0.1:8443/v2/docker.io"},
		},
		HostagentURL:    "https://10.100.0.1:8443/files/hostagent",
		HostagentSHA256: hostagentDigest(),
		HostagentConfig: []byte("node: cp-1\ntoken: golden-not-a-secret\n"),
		Snippets: []Snippet{{Name: "snippets/motd.ign", Data: []byte(
			`{"ignition":{"version":"3.1.0"},"storage":{"files":[{"path":"/etc/motd","mode":420,"contents":{"source":"data:,installed%20by%20the%20appliance%0A"}}]}}`)}},
	}
}

func mustRender(t testing.TB, p Params) *Config {
	t.Helper()
	c, err := Render(p)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return c
}

// TestGolden renders every supported version twice (identical bytes), compares it with
// testdata/cp-1_<version>.json, parses it back with Ignition's own parser for that version and
// validates it with Ignition's validator (no errors, no warnings such as unused keys).
func TestGolden(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			first, warns, err := mustRender(t, goldenParams(t)).Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if len(warns) != 0 {
				t.Errorf("unexpected warnings: %q", warns)
			}
			second, _, err := mustRender(t, goldenParams(t)).Marshal(v)
			if err != nil || !bytes.Equal(first, second) {
				t.Fatalf("rendering twice gave different bytes (err %v)", err)
			}
			golden := filepath.Join("testdata", "cp-1_"+v+".json")
			if *update {
				if err := os.WriteFile(golden, first, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if want := readFile(t, golden); !bytes.Equal(first, want) {
				t.Errorf("output differs from %s (run go test -run TestGolden -update and review the diff):\n%s", golden, first)
			}

			var parsed any
			var rpt interface{ String() string }
			switch v {
			case "3.3.0":
				c, r, err := v3_3.Parse(first)
				parsed, rpt = c, r
				if err != nil {
					t.Fatalf("v3_3.Parse: %v %s", err, r)
				}
			case "3.4.0":
				c, r, err := v3_4.Parse(first)
				parsed, rpt = c, r
				if err != nil {
					t.Fatalf("v3_4.Parse: %v %s", err, r)
				}
			case "3.5.0":
				c, r, err := v3_5.ParseCompatibleVersion(first)
				parsed, rpt = c, r
				if err != nil {
					t.Fatalf("v3_5.ParseCompatibleVersion: %v %s", err, r)
				}
			}
			if s := rpt.String(); s != "" {
				t.Errorf("Ignition's parser reported: %s", s)
			}
			if r := validate.ValidateWithContext(parsed, first); len(r.Entries) != 0 {
				t.Errorf("validate.ValidateWithContext: %s", r)
			}
		})
	}
}

// TestContent35 checks the 3.5 output field by field: the parts other components rely on.
func TestContent35(t *testing.T) {
	out, _, err := mustRender(t, goldenParams(t)).Marshal("3.5.0")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := v3_5.ParseCompatibleVersion(out)
	if err != nil {
		t.Fatal(err)
	}
	ca := readFile(t, "testdata/ca.pem")
	files := map[string]types35.File{}
	for _, f := range cfg.Storage.Files {
		files[f.Path] = f
	}
	decode := func(f types35.File) string {
		t.Helper()
		if f.Contents.Source == nil {
			t.Fatalf("%s has no contents", f.Path)
		}
		d, err := dataurl.DecodeString(*f.Contents.Source)
		if err != nil {
			t.Fatalf("%s: %v", f.Path, err)
		}
		return string(d.Data)
	}
	tests := []struct {
		path     string
		mode     int
		contents string // "" = do not compare
	}{
		{CAPathFedora, 0o644, string(ca)},
		{CAPathDebian, 0o644, string(ca)},
		{ContainerdCAPath, 0o644, string(ca)},
		{"/etc/containerd/certs.d/registry.k8s.io/hosts.toml", 0o644, `# Written by the air-gap appliance: pull registry.k8s.io images through the appliance mirror.
server = "https://registry.k8s.io"

[host."https://10.100.0.1:8443/v2/registry.k8s.io"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/appliance-ca.crt"
  override_path = true
`},
		{"/etc/containerd/certs.d/docker.io/hosts.toml", 0o644, ""},
		{HostagentConfigPath, 0o600, "node: cp-1\ntoken: golden-not-a-secret\n"},
		{HostagentBinaryPath, 0o755, ""},
		{"/etc/motd", 0o644, "installed by the appliance\n"},
	}
	for _, tt := range tests {
		f, ok := files[tt.path]
		if !ok {
			t.Errorf("no file %s", tt.path)
			continue
		}
		if f.Mode == nil || *f.Mode != tt.mode {
			t.Errorf("%s: mode %v, want %o", tt.path, f.Mode, tt.mode)
		}
		if tt.contents != "" && decode(f) != tt.contents {
			t.Errorf("%s contents:\n%s\nwant:\n%s", tt.path, decode(f), tt.contents)
		}
	}
	if got := decode(files["/etc/containerd/certs.d/docker.io/hosts.toml"]); !strings.Contains(got, `server = "https://registry-1.docker.io"`) {
		t.Errorf("docker.io hosts.toml does not point at registry-1.docker.io:\n%s", got)
	}
	bin := files[HostagentBinaryPath]
	if *bin.Contents.Source != "https://10.100.0.1:8443/files/hostagent" || *bin.Contents.Verification.Hash != "sha256-"+hostagentDigest() {
		t.Errorf("hostagent binary resource = %s %s", *bin.Contents.Source, *bin.Contents.Verification.Hash)
	}
	cas := cfg.Ignition.Security.TLS.CertificateAuthorities
	if len(cas) != 1 {
		t.Fatalf("ignition.security.tls.certificateAuthorities has %d entries, want 1", len(cas))
	}
	if d, err := dataurl.DecodeString(*cas[0].Source); err != nil || string(d.Data) != string(ca) {
		t.Errorf("certificateAuthorities[0] is not the appliance CA (%v)", err)
	}
	if len(cfg.Systemd.Units) != 1 {
		t.Fatalf("units: %+v", cfg.Systemd.Units)
	}
	u := cfg.Systemd.Units[0]
	if u.Name != HostagentUnit || u.Enabled == nil || !*u.Enabled ||
		!containsAll(*u.Contents, "After=network-online.target", "Restart=always", "Type=notify", "ExecStart="+HostagentBinaryPath+" run --config "+HostagentConfigPath) {
		t.Errorf("hostagent unit: %s enabled=%v\n%s", u.Name, u.Enabled, *u.Contents)
	}
}

func TestRenderParamErrors(t *testing.T) {
	key := []byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF\n-----END PRIVATE KEY-----\n")
	tests := []struct {
		name   string
		mutate func(*Params)
		want   []string // every string must appear in the error
	}{
		{"empty node", func(p *Params) { p.Node = "" }, []string{"node: must not be empty"}},
		{"http appliance", func(p *Params) { p.ApplianceURL = "http://10.100.0.1:8443" }, []string{`applianceURL: "http://10.100.0.1:8443" is not an https URL`}},
		{"no CA", func(p *Params) { p.CAPEM = []byte("not pem") }, []string{"caPEM: no PEM certificate found"}},
		{"CA key shipped", func(p *Params) { p.CAPEM = append(p.CAPEM, key...) }, []string{`caPEM: PEM block 2 is a "PRIVATE KEY"`}},
		{"bad hash", func(p *Params) { p.HostagentSHA256 = "abc" }, []string{`hostagentSHA256: "abc" is not a SHA-256 digest`}},
		{"http hostagent", func(p *Params) { p.HostagentURL = "http://x/hostagent" }, []string{"hostagentURL:"}},
		{"query in hostagent URL", func(p *Params) { p.HostagentURL = "https://x/hostagent?token=1" }, []string{"hostagentURL:", "query"}},
		{"empty hostagent config", func(p *Params) { p.HostagentConfig = nil }, []string{"hostagentConfig: must not be empty"}},
		{"repository instead of host", func(p *Params) { p.Mirrors[0].Registry = "docker.io/library" }, []string{`mirrors[0].registry: "docker.io/library" is not a registry host`}},
		{"bad port", func(p *Params) { p.Mirrors[0].Registry = "reg:99999" }, []string{`mirrors[0].registry: "reg:99999" has a bad port`}},
		{"duplicate mirror", func(p *Params) { p.Mirrors[1].Registry = "Registry.k8s.io" }, []string{`mirrors[1].registry: "Registry.k8s.io" is already mirrored by mirrors[0]`}},
		{"http endpoint", func(p *Params) { p.Mirrors[1].Endpoint = "http://10.100.0.1/v2/docker.io" }, []string{"mirrors[1].endpoint:"}},
		{"all at once", func(p *Params) { p.Node, p.HostagentSHA256 = "", "" }, []string{"node: must not be empty", "hostagentSHA256:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := goldenParams(t)
			tt.mutate(&p)
			_, err := Render(p)
			if !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("Render: %v; want ErrInvalidParams", err)
			}
			if !containsAll(err.Error(), tt.want...) {
				t.Fatalf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestRegistryHostsAccepted(t *testing.T) {
	for _, h := range []string{"registry.k8s.io", "docker.io", "quay.io:443", "localhost:5000", "10.0.0.1:5000", "[fd00::1]:5000", "10.0.0.1", "Reg-1.Example.COM"} {
		if err := checkRegistryHost(h); err != nil {
			t.Errorf("checkRegistryHost(%q): %v", h, err)
		}
	}
	for _, h := range []string{"", "fd00::1", "-a.io", "a..io", "a/b", "a b", "a.io:", "a.io:0"} {
		if err := checkRegistryHost(h); err == nil {
			t.Errorf("checkRegistryHost(%q) accepted", h)
		}
	}
}

func TestTOMLString(t *testing.T) {
	for in, want := range map[string]string{
		"https://a/v2/b": `"https://a/v2/b"`,
		`a"b\c`:          `"a\"b\\c"`,
		"a\nb\x01":       `"a\nb\u0001"`,
	} {
		if got := tomlString(in); got != want {
			t.Errorf("tomlString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestSecretsNotPrinted(t *testing.T) {
	p := goldenParams(t)
	c := mustRender(t, p)
	var buf bytes.Buffer
	for _, s := range []string{c.String(), c.GoString()} {
		buf.WriteString(s)
	}
	buf.WriteString(p.LogValue().String())
	if strings.Contains(buf.String(), "golden-not-a-secret") {
		t.Fatalf("token leaked: %s", buf.String())
	}
}

func TestMarshalConcurrent(t *testing.T) {
	c := mustRender(t, goldenParams(t))
	want, _, err := c.Marshal("3.5.0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			got, _, err := c.Marshal("3.5.0")
			if err == nil && !bytes.Equal(got, want) {
				err = errors.New("different bytes")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// decodeDataURL decodes an RFC 2397 data URL from a served config.
func decodeDataURL(t testing.TB, s string) string {
	t.Helper()
	d, err := dataurl.DecodeString(s)
	if err != nil {
		t.Fatalf("data URL %q: %v", s, err)
	}
	return string(d.Data)
}
