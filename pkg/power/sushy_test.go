package power

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// sushyDir finds OpenStack's Redfish emulator, kept beside the project (shared/peers/sushy-tools,
// see shared/peers/README.md): $SUSHY_TOOLS_DIR, else ../shared/peers/sushy-tools from the repository,
// else /work/shared/peers/sushy-tools (this workplace's machines; a CI clone may live elsewhere).
func sushyDir(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	candidates := []string{os.Getenv("SUSHY_TOOLS_DIR"),
		filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "peers", "sushy-tools"),
		"/work/shared/peers/sushy-tools"}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "sushy_tools", "emulator", "main.py")); err == nil {
			return p
		}
	}
	if labns.InCI() {
		t.Fatalf("REAL PEER MISSING: sushy-tools in none of %q (set SUSHY_TOOLS_DIR)", candidates)
	}
	t.Skipf("SKIPPED: sushy-tools in none of %q (set SUSHY_TOOLS_DIR)", candidates)
	return ""
}

// startSushy runs sushy-emulator (the fake driver: one system "fake", powered off) on 127.0.0.1 with
// TLS from a throwaway CA and HTTP basic auth (an htpasswd file with a bcrypt hash), with Debian's
// python and its packages (python3-flask, -requests, -tenacity, -bcrypt, -webob, -pbr). Its service
// root has no SessionService: the case the basic-auth fallback exists for. Stopped (by PID) at the end.
func startSushy(t *testing.T) (port int, caPEM []byte, user, password string) {
	t.Helper()
	dir := sushyDir(t)
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import flask, requests, tenacity, bcrypt, webob, pbr").CombinedOutput(); err != nil {
		if labns.InCI() {
			t.Fatalf("REAL PEER MISSING: sushy-tools needs Debian's python3-flask python3-requests python3-tenacity python3-bcrypt python3-webob python3-pbr (`make deps`): %s", out)
		}
		t.Skipf("SKIPPED: sushy-tools' python modules missing (`make deps`): %s", out)
	}
	tmp := t.TempDir()
	ca, leaf := pkitest.Issue(t)
	certFile, keyFile := pkitest.WritePEM(t, tmp, leaf)
	user, password = "admin", "sushy-"+strconv.FormatInt(time.Now().UnixNano()%100000, 10)
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	if err := os.WriteFile(filepath.Join(tmp, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = %d\nSUSHY_EMULATOR_SSL_CERT = %q\nSUSHY_EMULATOR_SSL_KEY = %q\nSUSHY_EMULATOR_AUTH_FILE = %q\nSUSHY_EMULATOR_FAKE_DRIVER = True\n",
		port, certFile, keyFile, filepath.Join(tmp, "htpasswd"))
	if err := os.WriteFile(filepath.Join(tmp, "emulator.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(tmp, "sushy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "sushy_tools.emulator.main", "--config", filepath.Join(tmp, "emulator.conf"))
	// TMPDIR: its persistent state (memoize.py keeps systems in $TMPDIR/sushy-emulator) starts fresh.
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "TMPDIR="+tmp)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = logf.Close()
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(tmp, "sushy.log"))
			t.Fatalf("sushy-emulator exited:\n%s", b)
		default:
		}
		if resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/redfish/v1/", port)); err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(tmp, "sushy.log"))
			t.Fatalf("sushy-emulator not answering:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return port, ca, user, password
}

// TestRedfishSushyTools drives sushy-tools, a real Redfish implementation without a SessionService:
// the session login fails, the controller falls back to HTTP basic auth (as OpenStack's client does)
// and reads and sets the power (on, then off); a wrong password is still ErrAuth.
func TestRedfishSushyTools(t *testing.T) {
	port, ca, user, password := startSushy(t)
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
