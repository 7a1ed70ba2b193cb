package power

import (
	"errors"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/sushy"
)

// TestRedfishSushyTools drives sushy-tools, a real Redfish implementation without a SessionService:
// the session login fails, the controller falls back to HTTP basic auth (as OpenStack's client does)
// and reads and sets the power (on, then off); a wrong password is still ErrAuth.
func TestRedfishSushyTools(t *testing.T) {
	bmc := sushy.Start(t)
	port, ca, user, password := bmc.Port, bmc.CAPEM, bmc.User, bmc.Password
	ctx := t.Context()
	c, err := NewBMC(ctx, BMCOptions{Kind: KindRedfish, Host: "127.0.0.1", Port: port, Username: user, Password: password, CAPEM: ca, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.PowerState(ctx)
	if err != nil || st != StateOff {
		t.Fatalf("power status through sushy-tools: %v, %v (want off)", st, err)
	}
	if err := c.PowerOn(ctx); err != nil {
		t.Fatalf("power on: %v", err)
	}
	// The fake driver applies a power change 1–11 s later, like real hardware (fakedriver.py).
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
