package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// speakers returns every VRRP speaker's (VRID, auth, interval) of p: the bootstrap host's instance
// and each control plane's node config, as the speakers will run them.
func speakers(t *testing.T, p *Plan) map[string]VRRP {
	t.Helper()
	out := map[string]VRRP{}
	if p.Keepalived == nil {
		t.Fatal("plan has no keepalived instance for the bootstrap host")
	}
	in := p.Keepalived.Instances[0]
	out["appliance"] = VRRP{VirtualRouterID: in.VirtualRouterID, AuthPass: in.AuthPass, AdvertInterval: in.AdvertInterval}
	for _, n := range p.Nodes {
		if k := n.NodeConfig.Keepalived; k != nil {
			out[n.Name] = VRRP{VirtualRouterID: k.VirtualRouterID, AuthPass: k.AuthPass, AdvertInterval: k.AdvertInterval()}
		}
	}
	if len(out) != 4 {
		t.Fatalf("speakers %v, want the appliance and three control planes", out)
	}
	return out
}

// wantAll fails unless every speaker of p has want, and its rendered instance passes keepalived's own
// rules (Render validates VRRP version against interval and authentication).
func wantAll(t *testing.T, p *Plan, want VRRP) {
	t.Helper()
	for name, got := range speakers(t, p) {
		if got != want {
			t.Errorf("%s speaks %+v, want %+v", name, got, want)
		}
	}
	if _, err := keepalived.Render(*p.Keepalived); err != nil {
		t.Errorf("the bootstrap host's instance does not render: %v", err)
	}
}

// labConfigWith loads the lab's configuration (pkg/config/testdata/lab.yaml) with
// apiServer.keepalived set to keepalivedYAML (a flow mapping; "" leaves it out), defaulted and
// validated as bootstrap loads it.
func labConfigWith(t *testing.T, keepalivedYAML string) *config.BootstrapConfiguration {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "config", "testdata", "lab.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	if keepalivedYAML != "" {
		const vip = "apiServer:\n  vip: 10.100.0.100\n"
		if !strings.Contains(doc, vip) {
			t.Fatalf("lab.yaml lacks %q", vip)
		}
		doc = strings.Replace(doc, vip, vip+"  keepalived: "+keepalivedYAML+"\n", 1)
	}
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := config.Load(path, config.ValidateOptions{})
	if err != nil {
		t.Fatalf("load the lab with keepalived %s: %v", keepalivedYAML, err)
	}
	return c
}

// TestBuildVRRPv3ByDefault: without authPasswordFile every speaker runs VRRPv3 without
// authentication at 250 ms, although the pki phase hands Build a PASS secret (it always made one).
func TestBuildVRRPv3ByDefault(t *testing.T) {
	in := labInputs(t)
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, p, VRRP{VirtualRouterID: config.DefaultVirtualRouterID("lab", in.Config.APIServer.VIP), AdvertInterval: 250 * time.Millisecond})
	if len(p.VRRPNotes) != 0 {
		t.Errorf("first run: notes %q, want none", p.VRRPNotes)
	}
}

// TestBuildVRRPv2WithPASS: authPasswordFile keeps VRRPv2 with PASS authentication at whole seconds.
func TestBuildVRRPv2WithPASS(t *testing.T) {
	in := labInputs(t)
	in.Config = labConfigWith(t, "{authPasswordFile: /etc/appliance/vrrp.pass, advertInterval: 2s}")
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, p, VRRP{VirtualRouterID: in.Config.APIServer.Keepalived.VirtualRouterID, AuthPass: "vrrppass", AdvertInterval: 2 * time.Second})
}

// TestRerunKeepsRecordedVRRP: a cluster bootstrapped by a release that derived the VRID from the
// cluster name alone and always used VRRPv2 + PASS at 1 s (testdata/recorded/keepalived-vrrp2-fnv.json
// is that release's keepalived.json for the lab) keeps VRID, version, secret and interval on a rerun,
// on every speaker at once; what the document writes wins.
func TestRerunKeepsRecordedVRRP(t *testing.T) {
	state := t.TempDir()
	if rec, err := ReadRecorded(state); rec != nil || err != nil {
		t.Fatalf("ReadRecorded(empty state) = %+v, %v; want nil, nil", rec, err)
	}
	old, err := os.ReadFile(filepath.Join("testdata", "recorded", "keepalived-vrrp2-fnv.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(statedir.Appliance(state), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statedir.Appliance(state), statedir.KeepalivedFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	rec, err := ReadRecorded(state)
	if err != nil || rec == nil || rec.VirtualRouterID != 75 || rec.AuthPass != "vrrppass" {
		t.Fatalf("ReadRecorded = %+v, %v; want the recorded VRID 75 and secret", rec, err)
	}
	build := func(keepalivedYAML string) *Plan {
		t.Helper()
		in := labInputs(t)
		in.Config = labConfigWith(t, keepalivedYAML)
		in.VRRPAuth = "newpass" // what a pki phase would hand over: not the recorded secret
		in.RecordedVRRP = rec
		p, err := Build(in)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("defaults keep everything", func(t *testing.T) {
		p := build("")
		if derived := config.DefaultVirtualRouterID("lab", p.Keepalived.Instances[0].VIP.Addr()); derived == 75 {
			t.Fatal("the new derivation gives the lab 75 too: this test proves nothing")
		}
		wantAll(t, p, VRRP{VirtualRouterID: 75, AuthPass: "vrrppass", AdvertInterval: time.Second})
		if len(p.VRRPNotes) != 2 || !strings.Contains(p.VRRPNotes[0], "kept VRRP VRID 75") ||
			!strings.Contains(p.VRRPNotes[1], "write apiServer.keepalived.advertInterval") {
			t.Errorf("notes %q: want one on the VRID and one on VRRPv2", p.VRRPNotes)
		}
		// A second rerun reads back what this one wrote and keeps it again.
		files, err := p.Files()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(statedir.Appliance(state), statedir.KeepalivedFile), files["appliance/keepalived.json"], 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := ReadRecorded(state)
		if err != nil {
			t.Fatal(err)
		}
		in := labInputs(t)
		in.RecordedVRRP = again
		p2, err := Build(in)
		if err != nil {
			t.Fatal(err)
		}
		wantAll(t, p2, VRRP{VirtualRouterID: 75, AuthPass: "vrrppass", AdvertInterval: time.Second})
	})
	t.Run("written VRID wins", func(t *testing.T) {
		p := build("{virtualRouterID: 9}")
		wantAll(t, p, VRRP{VirtualRouterID: 9, AuthPass: "vrrppass", AdvertInterval: time.Second})
	})
	t.Run("written advertInterval moves to VRRPv3", func(t *testing.T) {
		p := build("{advertInterval: 300ms}")
		wantAll(t, p, VRRP{VirtualRouterID: 75, AdvertInterval: 300 * time.Millisecond})
	})
	t.Run("authPasswordFile uses its secret", func(t *testing.T) {
		p := build("{authPasswordFile: /etc/appliance/vrrp.pass}")
		wantAll(t, p, VRRP{VirtualRouterID: 75, AuthPass: "newpass", AdvertInterval: time.Second})
	})

	if err := os.WriteFile(filepath.Join(statedir.Appliance(state), statedir.KeepalivedFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRecorded(state); err == nil || !strings.Contains(err.Error(), statedir.KeepalivedFile) ||
		!strings.Contains(err.Error(), "remove it") {
		t.Errorf("ReadRecorded(malformed) = %v; want an error naming the file and what to do", err)
	}
}
