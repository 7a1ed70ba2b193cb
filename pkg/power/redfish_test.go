package power

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"
)

// fakeRedfish is a minimal DMTF Redfish service (DSP0266) with one ComputerSystem: service root,
// SessionService login/logout (X-Auth-Token), Systems collection, PowerState, the
// ComputerSystem.Reset action and a Boot override PATCH. No real Redfish BMC runs here (LAB.md).
type fakeRedfish struct {
	user, pass string

	mu        sync.Mutex
	power     string // "On" / "Off"
	boot      map[string]any
	stuckBoot bool
	resets    []string
	tokens    map[string]bool
}

func newFakeRedfish(user, pass string) *fakeRedfish {
	return &fakeRedfish{user: user, pass: pass, power: "Off", tokens: map[string]bool{},
		boot: map[string]any{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None", "BootSourceOverrideMode": "UEFI"}}
}

func rfError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": "Base.1.0.GeneralError", "message": msg}})
}

func (f *fakeRedfish) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	const sys = "/redfish/v1/Systems/1"
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
	case r.URL.Path == "/redfish/v1/" || r.URL.Path == "/redfish/v1":
		reply(map[string]any{
			"@odata.id": "/redfish/v1/", "Id": "RootService", "RedfishVersion": "1.11.0",
			"Systems":        map[string]string{"@odata.id": "/redfish/v1/Systems"},
			"SessionService": map[string]string{"@odata.id": "/redfish/v1/SessionService"},
			"Links":          map[string]any{"Sessions": map[string]string{"@odata.id": "/redfish/v1/SessionService/Sessions"}},
		})
		return
	case r.URL.Path == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost:
		var cred struct{ UserName, Password string }
		if err := json.NewDecoder(r.Body).Decode(&cred); err != nil || cred.UserName != f.user || cred.Password != f.pass {
			rfError(w, http.StatusUnauthorized, "Invalid username or password")
			return
		}
		tok := strconv.Itoa(len(f.tokens) + 1)
		f.tokens["tok"+tok] = true
		w.Header().Set("X-Auth-Token", "tok"+tok)
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/"+tok)
		w.WriteHeader(http.StatusCreated)
		reply(map[string]string{"@odata.id": "/redfish/v1/SessionService/Sessions/" + tok, "Id": tok})
		return
	}
	if !f.tokens[r.Header.Get("X-Auth-Token")] {
		rfError(w, http.StatusUnauthorized, "no valid session")
		return
	}
	switch {
	case r.Method == http.MethodDelete:
		delete(f.tokens, r.Header.Get("X-Auth-Token"))
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == "/redfish/v1/Systems" && r.Method == http.MethodGet:
		reply(map[string]any{"@odata.id": "/redfish/v1/Systems", "Members@odata.count": 1,
			"Members": []map[string]string{{"@odata.id": sys}}})
	case r.URL.Path == sys && r.Method == http.MethodGet:
		reply(map[string]any{"@odata.id": sys, "Id": "1", "Name": "fake", "PowerState": f.power, "Boot": f.boot,
			"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
				"target":                            sys + "/Actions/ComputerSystem.Reset",
				"ResetType@Redfish.AllowableValues": []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"},
			}}})
	case r.URL.Path == sys+"/Actions/ComputerSystem.Reset" && r.Method == http.MethodPost:
		var body struct{ ResetType string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.resets = append(f.resets, body.ResetType)
		switch body.ResetType {
		case "On", "ForceRestart", "PowerCycle":
			f.power = "On"
		case "ForceOff", "GracefulShutdown":
			f.power = "Off"
		default:
			rfError(w, http.StatusBadRequest, "unsupported ResetType")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == sys && r.Method == http.MethodPatch:
		var body struct{ Boot map[string]any }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			rfError(w, http.StatusBadRequest, err.Error())
			return
		}
		if !f.stuckBoot {
			for k, v := range body.Boot {
				if v != nil && v != "" {
					f.boot[k] = v
				}
			}
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		rfError(w, http.StatusNotFound, "no such resource")
	}
}

// testCA makes a CA and a serving certificate for 127.0.0.1 signed by it.
func testCA(t *testing.T) (caPEM []byte, serving tls.Certificate) {
	t.Helper()
	return pkitest.Issue(t)
}

func startFakeRedfish(t *testing.T, f *fakeRedfish) (host string, port int, caPEM []byte) {
	t.Helper()
	caPEM, cert := testCA(t)
	srv := httptest.NewUnstartedServer(f)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ = strconv.Atoi(u.Port())
	return u.Hostname(), port, caPEM
}

func TestRedfishFake(t *testing.T) {
	f := newFakeRedfish("root", "calvin-s3cret")
	host, port, caPEM := startFakeRedfish(t, f)
	otherCA, _ := testCA(t)
	ctx := context.Background()
	opts := BMCOptions{Kind: KindRedfish, Host: host, Port: port, Username: "root", Password: "calvin-s3cret", CAPEM: caPEM, Timeout: 10 * time.Second}

	t.Run("TLS verification", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			mod     func(*BMCOptions)
			wantErr error
		}{
			{"configured CA verifies", func(*BMCOptions) {}, nil},
			{"system roots refuse", func(o *BMCOptions) { o.CAPEM = nil }, ErrCertificate},
			{"another CA refuses", func(o *BMCOptions) { o.CAPEM = otherCA }, ErrCertificate},
			{"insecure skips verification", func(o *BMCOptions) { o.CAPEM = nil; o.InsecureSkipVerify = true }, nil},
			{"wrong password", func(o *BMCOptions) { o.Password = "wrong" }, ErrAuth},
		} {
			t.Run(tc.name, func(t *testing.T) {
				o := opts
				tc.mod(&o)
				c, err := NewBMC(ctx, o)
				must(t, err)
				defer c.Close()
				_, err = c.PowerState(ctx)
				if tc.wantErr == nil && err != nil {
					t.Fatalf("PowerState: %v", err)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("PowerState = %v, want %v", err, tc.wantErr)
				}
				if err != nil && containsSecret(err.Error(), o.Password) {
					t.Fatalf("error leaks the password: %v", err)
				}
			})
		}
	})

	c, err := NewBMC(ctx, opts)
	must(t, err)
	defer c.Close()

	t.Run("power", func(t *testing.T) {
		for _, st := range []struct {
			name string
			do   func(context.Context) error
			want State
		}{
			{"initially off", nil, StateOff},
			{"on", c.PowerOn, StateOn},
			{"off", c.PowerOff, StateOff},
			{"cycle from off", c.PowerCycle, StateOn},
			{"cycle from on", c.PowerCycle, StateOn},
		} {
			if st.do != nil {
				if err := st.do(ctx); err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
			}
			if got, err := c.PowerState(ctx); err != nil || got != st.want {
				t.Fatalf("%s: PowerState = %q, %v; want %q", st.name, got, err, st.want)
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		want := []string{"On", "ForceOff", "On", "ForceRestart"}
		if len(f.resets) != len(want) {
			t.Fatalf("BMC saw resets %v, want %v", f.resets, want)
		}
		for i := range want {
			if f.resets[i] != want[i] {
				t.Fatalf("BMC saw resets %v, want %v", f.resets, want)
			}
		}
	})

	t.Run("boot override read back", func(t *testing.T) {
		for _, tc := range []struct {
			dev        BootDevice
			persistent bool
			target     string
			enabled    string
		}{
			{BootPXE, false, "Pxe", "Once"},
			{BootDisk, true, "Hdd", "Continuous"},
			{BootCDROM, false, "Cd", "Once"},
		} {
			if err := c.SetBootDevice(ctx, tc.dev, tc.persistent); err != nil {
				t.Fatalf("SetBootDevice(%s): %v", tc.dev, err)
			}
			f.mu.Lock()
			got, gotEn := f.boot["BootSourceOverrideTarget"], f.boot["BootSourceOverrideEnabled"]
			f.mu.Unlock()
			if got != tc.target || gotEn != tc.enabled {
				t.Fatalf("SetBootDevice(%s, %t): BMC holds %v/%v, want %s/%s", tc.dev, tc.persistent, got, gotEn, tc.target, tc.enabled)
			}
		}
		f.mu.Lock()
		f.stuckBoot = true
		f.mu.Unlock()
		if err := c.SetBootDevice(ctx, BootPXE, false); !errors.Is(err, ErrBootDeviceNotApplied) {
			t.Fatalf("SetBootDevice on a BMC that ignores the PATCH = %v, want ErrBootDeviceNotApplied", err)
		}
	})

	t.Run("dead Redfish BMC is unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		must(t, err)
		deadPort := l.Addr().(*net.TCPAddr).Port
		l.Close()
		o := opts
		o.Port = deadPort
		d, err := NewBMC(ctx, o)
		must(t, err)
		if _, err := d.PowerState(ctx); !errors.Is(err, ErrUnreachable) {
			t.Fatalf("PowerState of a closed port = %v, want ErrUnreachable", err)
		}
	})
}
