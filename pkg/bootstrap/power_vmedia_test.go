package bootstrap

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

// TestPowerBootsVirtualMedia: a redfish node with power.virtualMediaImage is booted through its BMC's
// virtual media (the lab's Redfish BMC, test/redfishbmc: the project's own emulator, because no real
// BMC can run here; no host behind it): the image on the
// appliance's own URL is fetched by the BMC over TLS verified with the appliance CA, the node record
// becomes booting, and the phase's line says so. An image the BMC cannot fetch fails that node with
// what to check, and the node is not powered on.
func TestPowerBootsVirtualMedia(t *testing.T) {
	bmc := labredfish.Start(t, labredfish.Options{})
	dir := t.TempDir()
	pass, caFile := filepath.Join(dir, "bmc.password"), filepath.Join(dir, "bmc-ca.pem")
	if err := os.WriteFile(pass, []byte(bmc.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, bmc.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	applianceCA, leaf := pkitest.Issue(t)
	var gets atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		_, _ = w.Write([]byte("CD001 stand-in node image"))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	node := func(image string) config.Node {
		return config.Node{Name: "w2", MAC: "52:54:00:00:00:22", Power: config.Power{Kind: config.PowerRedfish,
			Address: "https://127.0.0.1:" + strconv.Itoa(bmc.Port), Username: bmc.User, PasswordFile: pass, CAFile: caFile,
			BootDevice: config.BootCDROM, VirtualMediaImage: image}}
	}
	st := &State{ApplianceURL: srv.URL, CA: &pki.CA{CertPEM: applianceCA}}

	bad := node("https://127.0.0.1:1/boot/node.iso")
	st.Config = &config.BootstrapConfiguration{Nodes: []config.Node{bad}}
	store := nodestate.Open(t.TempDir())
	_, _, err := powerBMC(t.Context(), st, store, bad)
	if !errors.Is(err, power.ErrVirtualMediaNotInserted) || !strings.Contains(err.Error(), "check that the BMC reaches that URL") {
		t.Fatalf("an image the BMC cannot fetch: %v", err)
	}
	if s, err := store.Get("w2"); err != nil || s.State != agentapi.StatePowering {
		t.Errorf("record after a refused insert: %+v, %v (want powering: the phase's note marks it failed)", s, err)
	}

	good := node(srv.URL + "/boot/node.iso")
	st.Config.Nodes[0] = good
	what, changed, err := powerBMC(t.Context(), st, store, good)
	if err != nil {
		t.Fatal(err)
	}
	if !changed || !strings.Contains(what, "powered on from virtual media") || !strings.Contains(what, "TLS verified with the appliance CA") || gets.Load() == 0 {
		t.Fatalf("powerBMC: %q, changed %v, image fetched %d times", what, changed, gets.Load())
	}
	if s, err := store.Get("w2"); err != nil || s.State != agentapi.StateBooting {
		t.Errorf("record: %+v, %v (want booting)", s, err)
	}
	t.Log(what)
}
