package power

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// TestIPMISim drives OpenIPMI's ipmi_sim through bmclib's ipmitool provider: power, boot override
// set + read back, wrong password, dead BMC, and PowerOnAll with one dead BMC among live ones.
func TestIPMISim(t *testing.T) {
	if p, ok := childParams(t); ok {
		ipmiChild(t, p)
		return
	}
	labns.RequireTool(t, "ipmitool")
	ns := labns.New(t, "pwipmi")
	params := map[string]string{}
	for i := range 3 {
		s := startIPMISim(t, ns, fmt.Sprintf("bmc%d", i), fmt.Sprintf("127.0.1.%d", i+1), 623)
		for k, v := range s.params(fmt.Sprintf("s%d.", i)) {
			params[k] = v
		}
	}
	runInNS(t, ns, params, false)
}

func ipmiChild(t *testing.T, p map[string]string) {
	sims := []simBMC{simFromParams(p, "s0."), simFromParams(p, "s1."), simFromParams(p, "s2.")}
	for _, s := range sims {
		waitRMCP(t, s.Addr, s.Port)
	}
	s := sims[0]
	ctx := context.Background()

	// The main controller comes from a node's Target, as the appliance builds it.
	target := Target{
		Name: "node-0", Kind: KindIPMI, Address: fmt.Sprintf("%s:%d", s.Addr, s.Port), Username: s.User, Password: s.Password,
	}
	c, err := New(ctx, target, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()

	t.Run("power", func(t *testing.T) {
		steps := []struct {
			name      string
			do        func(context.Context) error
			want      State
			wantPower string
		}{
			{"initially off", nil, StateOff, "0"},
			{"on", c.PowerOn, StateOn, "1"},
			{"on again is a no-op", c.PowerOn, StateOn, "1"},
			{"off", c.PowerOff, StateOff, "0"},
			{"cycle from off turns on", c.PowerCycle, StateOn, "1"},
		}
		for _, st := range steps {
			if st.do != nil {
				if err := st.do(ctx); err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
			}
			got, err := c.PowerState(ctx)
			if err != nil || got != st.want {
				t.Fatalf("%s: PowerState = %q, %v; want %q", st.name, got, err, st.want)
			}
			if f := readTrim(t, filepath.Join(s.Dir, "power")); f != st.wantPower {
				t.Fatalf("%s: simulated chassis power = %q, want %q", st.name, f, st.wantPower)
			}
		}
		// Cycle from on: the BMC cuts power, then restores it after its own interval (ipmi_sim: 1 s).
		must(t, os.WriteFile(filepath.Join(s.Dir, "log"), nil, 0o600))
		if err := c.PowerCycle(ctx); err != nil {
			t.Fatalf("cycle from on: %v", err)
		}
		waitFor(t, "power back on after cycle", func() bool { st, err := c.PowerState(ctx); return err == nil && st == StateOn })
		if log := readTrim(t, filepath.Join(s.Dir, "log")); log != "power 0\npower 1" {
			t.Fatalf("chassis saw %q during a cycle from on, want power 0 then power 1", log)
		}
	})

	t.Run("boot device set and read back", func(t *testing.T) {
		for _, tc := range []struct {
			dev        BootDevice
			persistent bool
			simValue   string // what ipmi_sim's chassis_control received
		}{
			{BootPXE, false, "pxe"},
			{BootCDROM, true, "cdrom"},
			{BootDisk, false, "default"},
			{BootPXE, true, "pxe"},
		} {
			if err := c.SetBootDevice(ctx, tc.dev, tc.persistent); err != nil {
				t.Fatalf("SetBootDevice(%s, %t): %v", tc.dev, tc.persistent, err)
			}
			if got := readTrim(t, filepath.Join(s.Dir, "boot")); got != tc.simValue {
				t.Fatalf("SetBootDevice(%s): chassis got boot %q, want %q", tc.dev, got, tc.simValue)
			}
		}
		if err := c.SetBootDevice(ctx, "floppy", false); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("SetBootDevice(floppy) = %v, want ErrUnsupported", err)
		}
	})

	t.Run("boot override not applied is detected", func(t *testing.T) {
		must(t, os.WriteFile(filepath.Join(s.Dir, "boot-stuck"), nil, 0o600))
		defer os.Remove(filepath.Join(s.Dir, "boot-stuck"))
		// the chassis still holds pxe from the previous subtest
		err := c.SetBootDevice(ctx, BootCDROM, false)
		if !errors.Is(err, ErrBootDeviceNotApplied) {
			t.Fatalf("SetBootDevice on a BMC that ignores it = %v, want ErrBootDeviceNotApplied", err)
		}
	})

	t.Run("a refused chassis command is a command failure, not an auth error", func(t *testing.T) {
		// Issue 8: with the suite left to negotiation, the failed chassis command used to be retried
		// with suite 17, which ipmi_sim refuses, and was reported as a wrong password.
		auto, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: s.Addr, Port: s.Port, Username: s.User, Password: s.Password, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer auto.Close()
		must(t, auto.PowerOff(ctx))
		must(t, os.WriteFile(filepath.Join(s.Dir, "power-fail"), nil, 0o600))
		defer os.Remove(filepath.Join(s.Dir, "power-fail"))
		err = auto.PowerOn(ctx)
		if !errors.Is(err, ErrCommandFailed) || errors.Is(err, ErrAuth) || errors.Is(err, ErrUnreachable) {
			t.Fatalf("PowerOn on a BMC whose chassis fails = %v, want ErrCommandFailed only", err)
		}
		if !strings.Contains(err.Error(), "Chassis Power Control") {
			t.Errorf("error does not carry the BMC's answer: %v", err)
		}
		if st, err := auto.PowerState(ctx); err != nil || st != StateOff {
			t.Errorf("PowerState after the refused power on = %v, %v; want off, nil", st, err)
		}
	})

	t.Run("wrong password is an auth error", func(t *testing.T) {
		bad, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: s.Addr, Port: s.Port, Username: s.User, Password: "wrong", CipherSuite: "3", Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = bad.PowerState(ctx)
		if !errors.Is(err, ErrAuth) || errors.Is(err, ErrUnreachable) {
			t.Fatalf("PowerState with a wrong password = %v, want ErrAuth", err)
		}
		if err != nil && containsSecret(err.Error(), "wrong", s.Password) {
			t.Fatalf("error leaks a password: %v", err)
		}
	})

	t.Run("dead BMC is unreachable", func(t *testing.T) {
		dead, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: "127.0.1.250", Username: "admin", Password: "x", CipherSuite: "3", Timeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = dead.PowerState(ctx)
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("PowerState of a dead BMC = %v, want ErrUnreachable", err)
		}
	})

	t.Run("PowerOnAll with one dead BMC", func(t *testing.T) {
		ctrls := map[string]Controller{}
		for i, sm := range sims {
			must(t, os.WriteFile(filepath.Join(sm.Dir, "power"), []byte("0\n"), 0o600))
			bc, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: sm.Addr, Port: sm.Port, Username: sm.User, Password: sm.Password, CipherSuite: "3"})
			if err != nil {
				t.Fatal(err)
			}
			ctrls[fmt.Sprintf("node-%d", i)] = bc
		}
		dead, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: "127.0.1.250", Username: "admin", Password: "x", CipherSuite: "3", Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctrls["node-dead"] = dead
		res := PowerOnAll(ctx, ctrls, 2, RetryPolicy{MaxAttempts: 2, InitialInterval: 100 * time.Millisecond, NodeTimeout: 10 * time.Second})
		if len(res) != 4 {
			t.Fatalf("got %d results, want 4", len(res))
		}
		for _, r := range res {
			if r.Node == "node-dead" {
				if !errors.Is(r.Err, ErrUnreachable) || r.Attempts != 2 {
					t.Errorf("dead node: err=%v attempts=%d, want ErrUnreachable after 2 attempts", r.Err, r.Attempts)
				}
				continue
			}
			if r.Err != nil || r.Attempts != 1 {
				t.Errorf("%s: err=%v attempts=%d, want success at the first attempt", r.Node, r.Err, r.Attempts)
			}
		}
		for _, sm := range sims {
			if got := readTrim(t, filepath.Join(sm.Dir, "power")); got != "1" {
				t.Errorf("%s: chassis power %q after PowerOnAll, want 1", sm.Addr, got)
			}
		}
	})
}
