package applianced

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

// TestInstallNoticeVirtualMedia: a virtual-media node's install notice, against the lab's Redfish BMC
// (test/redfishbmc: the project's own emulator, because no real BMC can run here; no host behind it), with the node's power section as bootstrap.yaml
// gives it (password and CA files): the notice replaces the CD boot override with the disk at once
// and leaves the CD in (the live system still runs from it); a report from the installing boot does
// not eject it; the installed system's first report (another boot ID) does. Notices the appliance
// has nothing to do for are ErrInstallNoticeNotServed (404).
func TestInstallNoticeVirtualMedia(t *testing.T) {
	bmc := labredfish.Start(t, labredfish.Options{})
	isoCA, leaf := pkitest.Issue(t)
	iso := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("CD001 stand-in image"))
	}))
	iso.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	iso.StartTLS()
	t.Cleanup(iso.Close)
	dir := t.TempDir()
	pw, ca := filepath.Join(dir, "bmc.password"), filepath.Join(dir, "bmc-ca.pem")
	if err := os.WriteFile(pw, []byte(bmc.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, bmc.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	v1 := config.Node{Name: "v1", Roles: []config.Role{config.RoleWorker}, MAC: "52:54:00:00:00:31",
		Power: config.Power{Kind: config.PowerRedfish, Address: "https://127.0.0.1:" + strconv.Itoa(bmc.Port), Username: bmc.User,
			PasswordFile: pw, CAFile: ca, BootDevice: config.BootCDROM, VirtualMediaImage: iso.URL + "/node.iso"}}
	cfg := &config.BootstrapConfiguration{Nodes: []config.Node{v1, {Name: "s1", Power: config.Power{Kind: config.PowerSSH}}}}
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	h := newInstallNotices(t.Context(), cfg, nil, store, slog.New(slog.NewTextHandler(os.Stderr, nil)))

	// What the power phase did: insert, boot once from the CD, power on.
	vb, closeVB, err := openVirtualMedia(t.Context(), v1, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeVB()
	r, err := vb.BootVirtualMedia(t.Context(), power.VirtualMediaOptions{Image: v1.Power.VirtualMediaImage, CAPEM: isoCA})
	if err != nil {
		t.Fatalf("BootVirtualMedia: %v", err)
	}
	get := func(path string) map[string]any {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(bmc.CAPEM)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://127.0.0.1:"+strconv.Itoa(bmc.Port)+path, nil)
		req.SetBasicAuth(bmc.User, bmc.Password)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	system := "/redfish/v1/Systems/" + filepath.Base(filepath.Dir(filepath.Dir(r.Slot)))
	target := func() any { return get(system)["Boot"].(map[string]any)["BootSourceOverrideTarget"] }
	inserted := func() any { return get(r.Slot)["Inserted"] }
	if target() != "Cd" || inserted() != true {
		t.Fatalf("after BootVirtualMedia: boot %v, inserted %v", target(), inserted())
	}

	if err := h.note(t.Context(), "v1", agentapi.InstallNotice{BootID: "live-boot"}, "10.0.0.50:4000"); err != nil {
		t.Fatalf("v1's install notice: %v", err)
	}
	if target() != "Hdd" || inserted() != true {
		t.Fatalf("after the notice: boot %v (want Hdd), inserted %v (want true: the live system runs from the CD)", target(), inserted())
	}
	report := func(boot string) {
		if _, _, err := store.Record("v1", nil, agentapi.Report{BootID: boot, Step: agentapi.StepConfig, Status: "running", Time: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	report("live-boot")
	time.Sleep(2*ejectPoll + time.Second) // the watch reads the record twice: it must not eject
	if inserted() != true {
		t.Fatal("a report from the installing boot ejected the CD the live system runs from")
	}
	report("disk-boot")
	for deadline := time.Now().Add(time.Minute); inserted() != false; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(bmc.Log)
			t.Fatalf("the CD is still inserted after the installed system's report\n%s", b)
		}
	}
	if target() != "Hdd" {
		t.Errorf("after the eject: boot %v, want Hdd", target())
	}

	for _, node := range []string{"s1", "nobody"} {
		if err := h.note(t.Context(), node, agentapi.InstallNotice{MAC: "52:54:00:00:00:41"}, "10.0.0.51:4000"); !errors.Is(err, agentapi.ErrInstallNoticeNotServed) {
			t.Errorf("notice of %s without network boot or virtual media: %v, want ErrInstallNoticeNotServed", node, err)
		}
	}
}
