package power

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labredfish"
	"github.com/airgap-appliance/appliance/test/redfishbmc"
)

// TestRedfishLabBMCNoSessions drives the lab's Redfish BMC (test/redfishbmc: the project's own
// emulator, because no real BMC runs here) in its "no-sessions" profile, a service without a
// SessionService as sushy-tools and older BMCs are: the session login fails, the controller falls
// back to HTTP basic auth (as OpenStack's client does) and reads and sets the power (on, then off);
// a wrong password is still ErrAuth.
func TestRedfishLabBMCNoSessions(t *testing.T) {
	bmc := labredfish.Start(t, labredfish.Options{Profile: "no-sessions"})
	port, ca, user, password := bmc.Port, bmc.CAPEM, bmc.User, bmc.Password
	ctx := t.Context()
	c, err := NewBMC(ctx, BMCOptions{Kind: KindRedfish, Host: "127.0.0.1", Port: port, Username: user, Password: password, CAPEM: ca, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.PowerState(ctx)
	if err != nil || st != StateOff {
		t.Fatalf("power status through the lab BMC: %v, %v (want off)", st, err)
	}
	if err := c.PowerOn(ctx); err != nil {
		t.Fatalf("power on: %v", err)
	}
	// Real BMCs apply a power change some seconds later: poll, as the product's callers do.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		st, err := c.PowerState(ctx)
		if err == nil && st == StateOn {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after power on: %v, %v", st, err)
		}
	}

	if err := c.PowerOff(ctx); err != nil {
		t.Fatalf("power off: %v", err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		st, err := c.PowerState(ctx)
		if err == nil && st == StateOff {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after power off: %v, %v", st, err)
		}
	}

	bad, err := NewBMC(ctx, BMCOptions{Kind: KindRedfish, Host: "127.0.0.1", Port: port, Username: user, Password: "wrong", CAPEM: ca, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.PowerState(ctx); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong password: %v, want ErrAuth", err)
	}
}

// TestVirtualMediaLabBMCProfiles runs the product's whole virtual-media path against the lab BMC in
// every profile it has (test/redfishbmc.Profiles), so that each vendor quirk the replayed fakes of
// TestVirtualMediaVendorQuirks cover also runs against a service that really fetches the image:
// sessions or basic auth only, virtual media under the System or under the Manager, InsertMedia
// refusing Inserted/WriteProtected (Supermicro), other ResetTypes (HPE iLO: no PowerCycle), and
// InsertMedia run as a Task (202 and a task monitor, which bmclib does not follow: the read-back
// waits for the task). In each: an image server signed by another CA is refused (and never fetched
// over TLS; the slot then still holds that CA, and the second call adds the right one), the right CA
// boots the CD once with TLS verified (the slot reads back Inserted, the Image and VerifyCertificate),
// a power cycle and a power off go through the profile's ResetTypes, the eject leaves the slot empty,
// and a second eject with nothing inserted is no error.
func TestVirtualMediaLabBMCProfiles(t *testing.T) {
	var names []string
	for n := range redfishbmc.Profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			prof := redfishbmc.Profiles[name]
			bmc := labredfish.Start(t, labredfish.Options{Profile: name})
			image, ca, gets := isoServer(t)
			ctx := t.Context()
			c := labBMCController(t, bmc)
			vb := c.(VirtualMediaBooter)
			otherCA, _ := pkitest.Issue(t)
			if _, err := vb.BootVirtualMedia(ctx, VirtualMediaOptions{Image: image, CAPEM: otherCA}); !errors.Is(err, ErrVirtualMediaNotInserted) || !strings.Contains(err.Error(), "trusts the appliance CA") {
				t.Fatalf("image server signed by another CA: %v, want ErrVirtualMediaNotInserted naming the CA", err)
			}
			if n := gets.Load(); n != 0 {
				t.Fatalf("the BMC fetched the image %d times over TLS it should not trust", n)
			}
			r, err := vb.BootVirtualMedia(ctx, VirtualMediaOptions{Image: image, CAPEM: ca})
			if err != nil {
				b, _ := os.ReadFile(bmc.Log)
				t.Fatalf("BootVirtualMedia: %v\n%s", err, b)
			}
			under := "/redfish/v1/Systems/" + bmc.SystemID + "/VirtualMedia/"
			if prof.VirtualMediaUnder[0] == "Manager" {
				under = "/redfish/v1/Managers/BMC/VirtualMedia/"
			}
			if !r.Verified || r.Powered != "on" || !strings.HasPrefix(r.Slot, under) || gets.Load() == 0 {
				t.Fatalf("report %+v (image fetched %d times): want a slot under %s, verified, powered on", r, gets.Load(), under)
			}
			if st, err := c.PowerState(ctx); err != nil || st != StateOn {
				t.Fatalf("after the boot: %v, %v", st, err)
			}
			if err := c.PowerCycle(ctx); err != nil {
				t.Fatalf("power cycle with ResetTypes %v: %v", prof.ResetTypes, err)
			}
			if err := c.PowerOff(ctx); err != nil {
				t.Fatalf("power off: %v", err)
			}
			if st, err := c.PowerState(ctx); err != nil || st != StateOff {
				t.Fatalf("after power off: %v, %v", st, err)
			}
			slot := func() map[string]any {
				b, err := bmc.Get(r.Slot)
				var v map[string]any
				if err == nil {
					err = json.Unmarshal(b, &v)
				}
				if err != nil {
					t.Fatalf("read %s: %v", r.Slot, err)
				}
				return v
			}
			if s := slot(); s["Inserted"] != true || s["Image"] != image || s["VerifyCertificate"] != true {
				t.Fatalf("slot before the eject: %v", s)
			}
			if err := vb.EjectVirtualMedia(ctx); err != nil {
				t.Fatalf("EjectVirtualMedia: %v", err)
			}
			if s := slot(); s["Inserted"] != false || s["Image"] != "" {
				t.Fatalf("slot after the eject: Inserted %v, Image %v", s["Inserted"], s["Image"])
			}
			if err := vb.EjectVirtualMedia(ctx); err != nil {
				t.Fatalf("EjectVirtualMedia with nothing inserted: %v", err)
			}
			reqs, err := bmc.Requests()
			if err != nil {
				t.Fatal(err)
			}
			var resets, logins int
			for _, q := range reqs {
				resets += btoi(q.Method == "POST" && strings.HasSuffix(q.Path, "/Actions/ComputerSystem.Reset") && q.Status == 204)
				logins += btoi(q.Method == "POST" && q.Path == "/redfish/v1/SessionService/Sessions" && q.Status == 201)
			}
			if resets < 3 || (logins == 0) == prof.Sessions {
				t.Fatalf("the BMC saw %d resets (want ≥ 3: on, cycle, off) and %d session logins (profile has sessions: %v)", resets, logins, prof.Sessions)
			}
			t.Logf("%s: %s; %d resets, %d session logins", name, r, resets, logins)
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// labBMCController is the product's Redfish controller for a lab BMC on 127.0.0.1 (its CA pinned,
// 20 s per operation), closed at the end of the test.
func labBMCController(t *testing.T, bmc labredfish.BMC) Controller {
	t.Helper()
	c, err := NewBMC(t.Context(), BMCOptions{Kind: KindRedfish, Host: "127.0.0.1", Port: bmc.Port, Username: bmc.User, Password: bmc.Password, CAPEM: bmc.CAPEM, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
