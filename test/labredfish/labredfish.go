// Package labredfish starts the lab's Redfish BMC (test/redfishbmc, the project's own emulator: no
// real BMC can run here, and nobody ships an emulator these machines can install) for one test: one
// BMC process per call, over HTTPS with a certificate of a throwaway CA and HTTP basic auth or
// sessions, on 127.0.0.1 or on a lab segment inside a namespace, with no host (power state only) or
// driving a real QEMU machine (StartMachine). It is a package of its own, not part of labns, because
// it issues certificates with pkg/pki/pkitest, which pkg/pki's own tests (users of labns) cannot
// import.
//
// The BMC process is the test binary itself, started again with RunEnv naming its configuration:
// this package's init runs the emulator instead of the tests then, so every test binary that
// imports it can start BMCs without a build step.
package labredfish

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labns"
	"github.com/airgap-appliance/appliance/test/redfishbmc"
)

// RunEnv is the environment variable that makes the test binary a BMC: its value is the path of the
// BMC's configuration (redfishbmc.Config as JSON).
const RunEnv = "LABREDFISH_BMC_CONFIG"

func init() {
	if p := os.Getenv(RunEnv); p != "" {
		os.Exit(redfishbmc.Main(p))
	}
}

// MockupDir finds DMTF's public-rackmount1 mockup (shared/peers/redfish-mockups, data only):
// $REDFISH_MOCKUP_DIR, else ../shared/peers/redfish-mockups/dmtf-public-rackmount1 beside the
// repository, else /work/shared/peers/… (this workplace's machines; a CI clone may live elsewhere).
// Missing: the test fails in CI and skips loudly elsewhere.
func MockupDir(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	const rel = "shared/peers/redfish-mockups/dmtf-public-rackmount1"
	candidates := []string{os.Getenv("REDFISH_MOCKUP_DIR"), filepath.Join(filepath.Dir(file), "..", "..", "..", rel), "/work/" + rel}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "index.json")); err == nil {
			return p
		}
	}
	if labns.InCI() {
		t.Fatalf("REAL PEER DATA MISSING: DMTF's Redfish mockup in none of %q (set REDFISH_MOCKUP_DIR)", candidates)
	}
	t.Skipf("SKIPPED: DMTF's Redfish mockup in none of %q (set REDFISH_MOCKUP_DIR)", candidates)
	return ""
}

// Options shape a BMC.
type Options struct {
	// Profile is one of redfishbmc.Profiles ("" : "dmtf", sessions and basic auth, virtual media
	// under the System).
	Profile string
	// SystemID is the Redfish System Id ("" : a random UUID).
	SystemID string
}

// BMC is a running emulator: where clients reach it, the CA its certificate chains to (PEM), the
// credentials it accepts and its log (every request, and its host's errors).
type BMC struct {
	// Addr is host:port: 127.0.0.1:PORT, or the lab BMC address and port 443 inside NS.
	Addr string
	// Port is Addr's port.
	Port           int
	CAPEM          []byte
	User, Password string
	// SystemID is the Redfish System Id (/redfish/v1/Systems/SystemID).
	SystemID string
	// Profile is the profile it runs.
	Profile string
	// Log is the path of its log.
	Log string
	// ns is the namespace it listens in (nil: the root namespace).
	ns *labns.NS
}

// Start runs a BMC without a host (power state only) on 127.0.0.1, stopped (by PID) at the end.
func Start(t testing.TB, o Options) BMC {
	t.Helper()
	dir := t.TempDir()
	return start(t, dir, o, netip.MustParseAddr("127.0.0.1"), nil, nil, false)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// start runs one BMC process from dir (its tree, TLS files, configuration, state and log live
// there), listening on ip (port 443 inside ns, an ephemeral one in the root namespace), with host
// q (nil: none), whose firmware is UEFI when uefi is set.
func start(t testing.TB, dir string, o Options, ip netip.Addr, ns *labns.NS, q *redfishbmc.QEMUConfig, uefi bool) BMC {
	t.Helper()
	mockup := MockupDir(t)
	if o.Profile == "" {
		o.Profile = "dmtf"
	}
	if _, ok := redfishbmc.Profiles[o.Profile]; !ok {
		t.Fatalf("labredfish: profile %q is not one of redfishbmc.Profiles", o.Profile)
	}
	if o.SystemID == "" {
		o.SystemID = uuid.NewString()
	}
	tree := filepath.Join(dir, "tree")
	if err := redfishbmc.PrepareTree(mockup, tree, o.SystemID); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, leaf := pkitest.Issue(t, ip)
	certFile, keyFile := pkitest.WritePEM(t, dir, leaf)
	listen := net.JoinHostPort(ip.String(), "0")
	if ns != nil {
		listen = net.JoinHostPort(ip.String(), "443")
	}
	cfg := redfishbmc.Config{Listen: listen, CertFile: certFile, KeyFile: keyFile, User: "admin", Password: "bmc-" + randomHex(8),
		Tree: tree, SystemID: o.SystemID, Profile: o.Profile, StateDir: state, QEMU: q, Firmware: "Legacy"}
	if uefi {
		cfg.Firmware = "UEFI"
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "bmc.json")
	if err := os.WriteFile(confPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "bmc.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	if ns != nil {
		cmd = ns.Command(self) // ip netns exec execs it: cmd's PID is the BMC's
	}
	cmd.Env = append(os.Environ(), RunEnv+"="+confPath)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Pdeathsig: a test process that dies takes its BMC with it. The signal is tied to the thread
	// that started the BMC, not the process (prctl PR_SET_PDEATHSIG): the BMC is started, and waited
	// for, on a thread locked to that goroutine, so no other goroutine can end it. (labns.InNamespace
	// ends the threads it locks; a BMC started from one of them was killed at a namespaced dial.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // handed back only once the BMC has exited
		if err := cmd.Start(); err != nil {
			started <- err
			close(exited)
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- a
			}
		}
	}()
	t.Cleanup(func() {
		// SIGTERM: the BMC powers its host off (QEMU killed by PID) and exits.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close()
	})
	var addr string
	select {
	case addr = <-ready:
	case <-exited:
		b, _ := os.ReadFile(logPath)
		t.Fatalf("the Redfish BMC exited at start:\n%s", b)
	case <-time.After(60 * time.Second):
		b, _ := os.ReadFile(logPath)
		t.Fatalf("the Redfish BMC did not serve in 60 s:\n%s", b)
	}
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	bmc := BMC{Addr: net.JoinHostPort(ip.String(), portText), Port: port, CAPEM: ca, User: cfg.User, Password: cfg.Password,
		SystemID: o.SystemID, Profile: o.Profile, Log: logPath, ns: ns}
	if _, err := bmc.Get("/redfish/v1/"); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("the Redfish BMC serves but its service root fails: %v\n%s", err, b)
	}
	return bmc
}

// Client is an HTTP client that trusts the BMC's CA and, when the BMC is on a lab segment, dials
// from inside its namespace.
func (b BMC) Client() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CAPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	if b.ns != nil {
		tr.DialContext = dialIn(b.ns.Path())
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Get fetches path (e.g. /redfish/v1/Systems/ID) as a lab client would, with the BMC's CA and basic
// auth. Non-2xx answers are errors.
func (b BMC) Get(path string) ([]byte, error) {
	return b.Do(http.MethodGet, path, nil)
}

// Do sends one request with basic auth and a JSON body (nil: none). Non-2xx answers are errors that
// carry the body.
func (b BMC) Do(method, path string, body any) ([]byte, error) {
	c := b.Client()
	defer c.CloseIdleConnections()
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, "https://"+b.Addr+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.SetBasicAuth(b.User, b.Password)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode/100 != 2 {
		err = fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(out))
	}
	return out, err
}

// dialIn returns a dialer whose connections are made inside the network namespace at nsPath.
func dialIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = labns.InNamespace(nsPath, func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// Request is one request the BMC's log holds.
type Request struct {
	At           time.Time
	Method, Path string
	Status       int
}

// Requests reads every request from the BMC's log, in order.
func (b BMC) Requests() ([]Request, error) {
	data, err := os.ReadFile(b.Log)
	if err != nil {
		return nil, err
	}
	var out []Request
	for _, line := range bytes.Split(data, []byte("\n")) {
		var e struct {
			Time   time.Time
			Msg    string
			Method string
			Path   string
			Status int
		}
		if json.Unmarshal(line, &e) == nil && e.Msg == "request" {
			out = append(out, Request{At: e.Time, Method: e.Method, Path: e.Path, Status: e.Status})
		}
	}
	return out, nil
}
