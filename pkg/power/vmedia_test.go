package power

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

// isoServer serves a small stand-in ISO over HTTPS with a certificate from its own CA, counting the
// requests that got past the TLS handshake.
func isoServer(t *testing.T) (url string, caPEM []byte, gets *atomic.Int32) {
	t.Helper()
	ca, leaf := pkitest.Issue(t)
	gets = new(atomic.Int32)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		_, _ = w.Write([]byte("CD001 stand-in image"))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL + "/node.iso", ca, gets
}

// TestVirtualMediaFinishLabBMC: after the install, the CD leaves the boot, against the lab's Redfish
// BMC (the project's emulator: its Systems PATCH and VirtualMedia EjectMedia):
// ClearVirtualMediaBoot replaces the CD boot override with the disk while the CD stays inserted (the
// live system still runs from it), EjectVirtualMedia then takes the CD out, and an eject with a CD
// override but nothing inserted (the next power action after a half-finished install) clears the
// override too. Nothing left to do is no error and no change.
func TestVirtualMediaFinishLabBMC(t *testing.T) {
	bmc := labredfish.Start(t, labredfish.Options{})
	image, ca, _ := isoServer(t)
	ctx := t.Context()
	c := labBMCController(t, bmc)
	vb := c.(VirtualMediaBooter)
	r, err := vb.BootVirtualMedia(ctx, VirtualMediaOptions{Image: image, CAPEM: ca})
	if err != nil {
		b, _ := os.ReadFile(bmc.Log)
		t.Fatalf("BootVirtualMedia: %v\n%s", err, b)
	}
	get := func(path string) map[string]any {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(bmc.CAPEM)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:"+strconv.Itoa(bmc.Port)+path, nil)
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
	system := strings.TrimSuffix(r.Slot, "/VirtualMedia/CD1")
	target := func() any { return get(system)["Boot"].(map[string]any)["BootSourceOverrideTarget"] }
	if got := target(); got != "Cd" {
		t.Fatalf("boot override after BootVirtualMedia: %v, want Cd", got)
	}

	changed, err := vb.ClearVirtualMediaBoot(ctx)
	if err != nil || !changed {
		t.Fatalf("ClearVirtualMediaBoot = %v, %v; want changed", changed, err)
	}
	if got := target(); got != "Hdd" {
		t.Errorf("boot override after ClearVirtualMediaBoot: %v, want Hdd", got)
	}
	if s := get(r.Slot); s["Inserted"] != true {
		t.Errorf("ClearVirtualMediaBoot ejected the CD (the live system runs from it): %v", s)
	}
	if changed, err := vb.ClearVirtualMediaBoot(ctx); err != nil || changed {
		t.Errorf("second ClearVirtualMediaBoot = %v, %v; want no change", changed, err)
	}
	if err := vb.EjectVirtualMedia(ctx); err != nil {
		t.Fatalf("EjectVirtualMedia: %v", err)
	}
	if s := get(r.Slot); s["Inserted"] != false || s["Image"] != "" {
		t.Errorf("slot after the eject: Inserted %v, Image %v", s["Inserted"], s["Image"])
	}

	// A CD override left with nothing inserted: the eject clears it.
	if err := c.SetBootDevice(ctx, BootCDROM, true); err != nil {
		t.Fatal(err)
	}
	if err := vb.EjectVirtualMedia(ctx); err != nil {
		t.Fatalf("EjectVirtualMedia with nothing inserted: %v", err)
	}
	if got := target(); got != "Hdd" {
		t.Errorf("boot override after an eject with nothing inserted: %v, want Hdd", got)
	}
}

// vendorBMC replays Redfish resources recorded from vendors' BMCs, because no Dell iDRAC or
// Supermicro BMC runs here (LAB.md): a fake, limited to the paths virtual media uses. Basic auth, no
// SessionService (as older BMCs); power and the boot override are kept in memory.
type vendorBMC struct {
	user, pass string
	res        map[string]map[string]any // @odata.id → resource, mutated by PATCH and actions

	sessions bool            // the service has a SessionService (iDRAC does): X-Auth-Token logins
	tokens   map[string]bool // live session tokens
	logins   int             // sessions created

	mu       sync.Mutex
	requests []string // "METHOD path" of every authenticated request that changes something
	refuse   string   // non-empty: InsertMedia answers 400 with this message (a BMC that cannot fetch)
}

func collection(ids ...string) map[string]any {
	m := []map[string]string{}
	for _, id := range ids {
		m = append(m, map[string]string{"@odata.id": id})
	}
	return map[string]any{"Members": m, "Members@odata.count": len(m)}
}

func link(id string) map[string]string { return map[string]string{"@odata.id": id} }

// newVendorBMC builds a service of one vendor's shape:
//   - "dell": an iDRAC 9 with firmware ≥ 6, with a SessionService (X-Auth-Token) besides basic auth:
//     the Manager's VirtualMedia collection is empty, the
//     slots are under /Systems/System.Embedded.1/VirtualMedia (1: CD/DVD, 2: USBStick), without
//     Certificates (iDRAC fetches without verifying TLS);
//   - "supermicro-legacy": an X11 on firmware before standard VirtualMedia: neither the Manager nor
//     the System has VirtualMedia; /Managers/1/VM1/CfgCD is an IsoConfig with IsoConfig.Mount;
//   - "none": no virtual media anywhere (no licence).
func newVendorBMC(vendor string) *vendorBMC {
	b := &vendorBMC{user: "root", pass: "calvin", res: map[string]map[string]any{}, tokens: map[string]bool{}}
	sys, mgr := "/redfish/v1/Systems/1", "/redfish/v1/Managers/1"
	if vendor == "dell" {
		sys, mgr = "/redfish/v1/Systems/System.Embedded.1", "/redfish/v1/Managers/iDRAC.Embedded.1"
		b.sessions = true
	}
	b.res["/redfish/v1"] = map[string]any{"@odata.id": "/redfish/v1", "Id": "RootService", "RedfishVersion": "1.11.0",
		"Systems": link("/redfish/v1/Systems"), "Managers": link("/redfish/v1/Managers")}
	if b.sessions {
		b.res["/redfish/v1"]["SessionService"] = link("/redfish/v1/SessionService")
		b.res["/redfish/v1"]["Links"] = map[string]any{"Sessions": link("/redfish/v1/SessionService/Sessions")}
	}
	b.res["/redfish/v1/Systems"] = collection(sys)
	b.res["/redfish/v1/Managers"] = collection(mgr)
	b.res[sys] = map[string]any{"@odata.id": sys, "Id": "1", "PowerState": "Off",
		"Boot": map[string]any{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None", "BootSourceOverrideMode": "UEFI",
			"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Cd", "Hdd"}},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{"target": sys + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": []string{"On", "ForceOff", "ForceRestart"}}}}
	b.res[mgr] = map[string]any{"@odata.id": mgr, "Id": "1", "ManagerType": "BMC",
		"Links": map[string]any{"ManagerForServers": []map[string]string{link(sys)}}}
	switch vendor {
	case "dell":
		b.res[mgr]["VirtualMedia"] = link(mgr + "/VirtualMedia")
		b.res[mgr+"/VirtualMedia"] = collection()
		b.res[sys]["VirtualMedia"] = link(sys + "/VirtualMedia")
		b.res[sys+"/VirtualMedia"] = collection(sys+"/VirtualMedia/1", sys+"/VirtualMedia/2")
		for id, types := range map[string][]string{"1": {"CD", "DVD"}, "2": {"USBStick"}} {
			p := sys + "/VirtualMedia/" + id
			b.res[p] = map[string]any{"@odata.id": p, "Id": id, "MediaTypes": types, "Image": nil, "Inserted": false,
				"ConnectedVia": "NotConnected", "TransferProtocolType": nil,
				"Actions": map[string]any{"#VirtualMedia.InsertMedia": map[string]string{"target": p + "/Actions/VirtualMedia.InsertMedia"},
					"#VirtualMedia.EjectMedia": map[string]string{"target": p + "/Actions/VirtualMedia.EjectMedia"}}}
		}
	case "supermicro-legacy":
		p := mgr + "/VM1/CfgCD"
		b.res[p] = map[string]any{"@odata.context": "/redfish/v1/$metadata#IsoConfig.IsoConfig", "@odata.type": "#IsoConfig.IsoConfig",
			"@odata.id": p, "Id": "1", "Name": "VM1", "Host": "", "Path": "", "Username": "", "Password": "********",
			"Actions": map[string]any{"#IsoConfig.Mount": map[string]string{"target": p + "/Actions/IsoConfig.Mount"},
				"#IsoConfig.UnMount": map[string]string{"target": p + "/Actions/IsoConfig.UnMount"}}}
	}
	return b
}

func (b *vendorBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	path := strings.TrimSuffix(r.URL.Path, "/")
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	if path == "/redfish/v1" && r.Method == http.MethodGet {
		reply(200, b.res[path]) // the service root answers without credentials
		return
	}
	if b.sessions && path == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost {
		var cred struct{ UserName, Password string }
		if err := json.NewDecoder(r.Body).Decode(&cred); err != nil || cred.UserName != b.user || cred.Password != b.pass {
			rfError(w, http.StatusUnauthorized, "Invalid username or password")
			return
		}
		b.logins++
		tok := "tok" + strconv.Itoa(b.logins)
		b.tokens[tok] = true
		w.Header().Set("X-Auth-Token", tok)
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/"+tok)
		reply(http.StatusCreated, map[string]string{"@odata.id": "/redfish/v1/SessionService/Sessions/" + tok, "Id": tok})
		return
	}
	if u, p, ok := r.BasicAuth(); (!ok || u != b.user || p != b.pass) && !b.tokens[r.Header.Get("X-Auth-Token")] {
		rfError(w, http.StatusUnauthorized, "Invalid username or password")
		return
	}
	if strings.HasPrefix(path, "/redfish/v1/SessionService/Sessions/") && r.Method == http.MethodDelete {
		delete(b.tokens, strings.TrimPrefix(path, "/redfish/v1/SessionService/Sessions/"))
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var in map[string]any
	_ = json.Unmarshal(body, &in)
	if r.Method != http.MethodGet {
		b.requests = append(b.requests, r.Method+" "+path)
	}
	act, action, isAction := strings.Cut(path, "/Actions/")
	switch {
	case r.Method == http.MethodGet && b.res[path] != nil:
		reply(200, b.res[path])
	case r.Method == http.MethodPatch && b.res[path] != nil:
		for k, v := range in {
			if cur, ok := b.res[path][k].(map[string]any); ok {
				for kk, vv := range v.(map[string]any) {
					cur[kk] = vv
				}
			} else {
				b.res[path][k] = v
			}
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && isAction && b.res[act] != nil:
		res := b.res[act]
		switch action {
		case "ComputerSystem.Reset":
			if in["ResetType"] == "ForceOff" {
				res["PowerState"] = "Off"
			} else {
				res["PowerState"] = "On"
			}
		case "VirtualMedia.InsertMedia":
			if b.refuse != "" {
				rfError(w, http.StatusBadRequest, b.refuse)
				return
			}
			res["Image"], res["Inserted"] = in["Image"], true
		case "VirtualMedia.EjectMedia":
			res["Image"], res["Inserted"] = nil, false
		case "IsoConfig.Mount", "IsoConfig.UnMount":
		default:
			rfError(w, http.StatusBadRequest, "unknown action "+action)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		rfError(w, http.StatusNotFound, "no resource "+path)
	}
}

func startVendorBMC(t *testing.T, b *vendorBMC) Controller {
	t.Helper()
	ca, leaf := pkitest.Issue(t)
	srv := httptest.NewUnstartedServer(b)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	c, err := NewBMC(t.Context(), BMCOptions{Kind: KindRedfish, Host: "127.0.0.1", Port: port, Username: b.user, Password: b.pass, CAPEM: ca, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestVirtualMediaVendorQuirks replays recorded vendor resources (vendorBMC: a fake, no such BMC runs
// here): Dell's slots under the System are used and read back there (no Certificates: the report
// says TLS is not verified); Supermicro's legacy VM1/CfgCD is configured (Host and Path split from the
// URL) and mounted where bmclib finds no slot; a BMC without virtual media and one that refuses the
// insert end with errors that say what to check, and nothing is powered on.
func TestVirtualMediaVendorQuirks(t *testing.T) {
	const image = "https://10.0.0.2:8443/boot/node.iso"
	t.Run("dell idrac VirtualMedia under Systems", func(t *testing.T) {
		b := newVendorBMC("dell")
		r, err := startVendorBMC(t, b).(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image, CAPEM: []byte("unused")})
		if err != nil {
			t.Fatal(err)
		}
		const slot = "/redfish/v1/Systems/System.Embedded.1/VirtualMedia/1"
		if r.Slot != slot || r.Verified || r.Legacy || r.Powered != "on" {
			t.Fatalf("report %+v: want slot %s, not verified, powered on", r, slot)
		}
		sys := b.res["/redfish/v1/Systems/System.Embedded.1"]
		if boot := sys["Boot"].(map[string]any); boot["BootSourceOverrideTarget"] != "Cd" || boot["BootSourceOverrideEnabled"] != "Once" || sys["PowerState"] != "On" {
			t.Fatalf("system after: boot %v, power %v", boot, sys["PowerState"])
		}
		if b.res[slot]["Image"] != image {
			t.Fatalf("slot image %v", b.res[slot]["Image"])
		}
		// The iDRAC has sessions: bmclib's and the one for the slots were both opened; the
		// latter is closed at once (a BMC allows few).
		if opened := len(b.tokens); opened != 1 || b.logins < 2 {
			t.Errorf("%d sessions created, %d open after the boot: want bmclib's and the slots' one, only the controller's own left open", b.logins, opened)
		}
	})
	t.Run("node already on is restarted into the CD", func(t *testing.T) {
		b := newVendorBMC("dell")
		b.res["/redfish/v1/Systems/System.Embedded.1"]["PowerState"] = "On"
		r, err := startVendorBMC(t, b).(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image})
		if err != nil || r.Powered != "cycle" {
			t.Fatalf("report %+v, %v: want powered cycle", r, err)
		}
		last := b.requests[len(b.requests)-1]
		if last != "POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset" {
			t.Fatalf("last request %q: want a reset", last)
		}
	})
	t.Run("supermicro legacy VM1 CfgCD", func(t *testing.T) {
		b := newVendorBMC("supermicro-legacy")
		r, err := startVendorBMC(t, b).(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image + "?v=1"})
		if err != nil {
			t.Fatal(err)
		}
		cfg := b.res["/redfish/v1/Managers/1/VM1/CfgCD"]
		if !r.Legacy || r.Slot != "/redfish/v1/Managers/1/VM1/CfgCD" || cfg["Host"] != "https://10.0.0.2:8443" || cfg["Path"] != "/boot/node.iso?v=1" {
			t.Fatalf("report %+v, CfgCD %v", r, cfg)
		}
		mounted := false
		for _, req := range b.requests {
			mounted = mounted || req == "POST /redfish/v1/Managers/1/VM1/CfgCD/Actions/IsoConfig.Mount"
		}
		if !mounted || b.res["/redfish/v1/Systems/1"]["PowerState"] != "On" {
			t.Fatalf("requests %v: want the IsoConfig.Mount action, then power on", b.requests)
		}
		n := len(b.requests)
		if err := startVendorBMC(t, b).(VirtualMediaBooter).EjectVirtualMedia(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(b.requests[n:], "POST /redfish/v1/Managers/1/VM1/CfgCD/Actions/IsoConfig.UnMount") {
			t.Fatalf("eject: requests %v, want IsoConfig.UnMount", b.requests[n:])
		}
		if boot := b.res["/redfish/v1/Systems/1"]["Boot"].(map[string]any); boot["BootSourceOverrideTarget"] != "Hdd" {
			t.Fatalf("after the eject the boot override is %v, want Hdd (the CD override cleared)", boot)
		}
	})
	t.Run("dell idrac eject under Systems clears the CD boot", func(t *testing.T) {
		b := newVendorBMC("dell")
		c := startVendorBMC(t, b).(VirtualMediaBooter)
		if _, err := c.BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image}); err != nil {
			t.Fatal(err)
		}
		const slot = "/redfish/v1/Systems/System.Embedded.1/VirtualMedia/1"
		if err := c.EjectVirtualMedia(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(b.requests, "POST "+slot+"/Actions/VirtualMedia.EjectMedia") || b.res[slot]["Inserted"] == true {
			t.Fatalf("the Dell slot under Systems was not ejected: %v, slot %v", b.requests, b.res[slot])
		}
		if boot := b.res["/redfish/v1/Systems/System.Embedded.1"]["Boot"].(map[string]any); boot["BootSourceOverrideTarget"] != "Hdd" || boot["BootSourceOverrideEnabled"] != "Once" {
			t.Fatalf("after the eject the boot override is %v, want Hdd once", boot)
		}
	})
	t.Run("no virtual media", func(t *testing.T) {
		b := newVendorBMC("none")
		_, err := startVendorBMC(t, b).(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image})
		if !errors.Is(err, ErrVirtualMediaUnsupported) || !permanent(err) || !strings.Contains(err.Error(), "licensed") || !strings.Contains(err.Error(), "power.bootDevice: pxe") {
			t.Fatalf("got %v: want ErrVirtualMediaUnsupported (permanent) saying to check the licence or boot from the network", err)
		}
		if b.res["/redfish/v1/Systems/1"]["PowerState"] != "Off" {
			t.Fatal("a node whose BMC has no virtual media was powered on")
		}
	})
	t.Run("insert refused", func(t *testing.T) {
		b := newVendorBMC("dell")
		b.refuse = "RAC0720: Unable to locate the ISO or IMG image file or folder in the network share location."
		_, err := startVendorBMC(t, b).(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image})
		if !errors.Is(err, ErrVirtualMediaNotInserted) || !strings.Contains(err.Error(), "RAC0720") || !strings.Contains(err.Error(), "BMC reaches that URL") {
			t.Fatalf("got %v: want ErrVirtualMediaNotInserted with the BMC's words and what to check", err)
		}
		if b.res["/redfish/v1/Systems/System.Embedded.1"]["PowerState"] != "Off" {
			t.Fatal("a node whose insert was refused was powered on")
		}
	})
	t.Run("ipmi has no virtual media", func(t *testing.T) {
		c, err := NewBMC(t.Context(), BMCOptions{Kind: KindIPMI, Host: "127.0.0.1", Port: 1, Username: "admin", Password: "x"})
		if err != nil {
			t.Skipf("SKIPPED: no IPMI controller without ipmitool (`make deps`): %v", err)
		}
		_, err = c.(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: image})
		if !errors.Is(err, ErrUnsupported) || !permanent(err) || !strings.Contains(err.Error(), "use power.kind redfish") {
			t.Fatalf("got %v: want ErrUnsupported saying to use redfish", err)
		}
	})
	t.Run("bad image URL", func(t *testing.T) {
		c := startVendorBMC(t, newVendorBMC("dell"))
		for _, img := range []string{"", "ftp://10.0.0.2/node.iso", "https://user:pw@10.0.0.2/node.iso", "https:///node.iso"} {
			if _, err := c.(VirtualMediaBooter).BootVirtualMedia(t.Context(), VirtualMediaOptions{Image: img}); !errors.Is(err, ErrUnsupported) || strings.Contains(err.Error(), "pw@") {
				t.Errorf("image %q: %v, want ErrUnsupported without the credentials", img, err)
			}
		}
	})
}
