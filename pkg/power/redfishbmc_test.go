package power

import (
	"errors"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labredfish"
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
