// Package sushy runs OpenStack's Redfish emulator, sushy-tools (kept beside the project in
// shared/peers/sushy-tools), for tests that need a real Redfish BMC. It is a package of its own, not
// part of labns, because it issues certificates with pkg/pki/pkitest, which pkg/pki's own tests (users
// of labns) cannot import.
package sushy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// sushyDir finds OpenStack's Redfish emulator, kept beside the project (shared/peers/sushy-tools,
// see shared/peers/README.md): $SUSHY_TOOLS_DIR, else ../shared/peers/sushy-tools from the repository,
// else /work/shared/peers/sushy-tools (this workplace's machines; a CI clone may live elsewhere).
func sushyDir(t testing.TB) string {
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

// Emulator is a running sushy-emulator: its HTTPS port (on 127.0.0.1, or on a lab BMC address in a
// namespace: StartLibvirt with LabNIC), the CA its certificate chains to
// (PEM), and the HTTP basic-auth credentials it accepts.
type Emulator struct {
	Port           int
	CAPEM          []byte
	User, Password string
	// Log is the path of its log (requests, and the errors of its drivers).
	Log string
}

// Start runs sushy-emulator (the fake driver: one system "fake", powered off) on 127.0.0.1 with
// TLS from a throwaway CA and HTTP basic auth (an htpasswd file with a bcrypt hash), with Debian's
// python and its packages (python3-flask, -requests, -tenacity, -bcrypt, -webob, -pbr). Its service
// root has no SessionService: the case the basic-auth fallback exists for. Stopped (by PID) at the end.
func Start(t testing.TB) Emulator {
	t.Helper()
	return start(t, t.TempDir(), "SUSHY_EMULATOR_FAKE_DRIVER = True\n", nil, nil)
}

// listenIn puts sushy-emulator inside a namespace, listening on an address there.
type listenIn struct {
	ns *labns.NS
	ip netip.Addr
}

// start runs sushy-emulator from dir (its config, TLS files and state live there) with driverConf
// appended to its configuration, as the user cred when not nil (files in dir are then owned by it),
// on 127.0.0.1 in the root namespace, or with in, inside in.ns on in.ip (port 8000; its certificate
// names that address).
func start(t testing.TB, tmp, driverConf string, cred *syscall.Credential, in *listenIn) Emulator {
	t.Helper()
	dir := sushyDir(t)
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import flask, requests, tenacity, bcrypt, webob, pbr").CombinedOutput(); err != nil {
		if labns.InCI() {
			t.Fatalf("REAL PEER MISSING: sushy-tools needs Debian's python3-flask python3-requests python3-tenacity python3-bcrypt python3-webob python3-pbr (`make deps`): %s", out)
		}
		t.Skipf("SKIPPED: sushy-tools' python modules missing (`make deps`): %s", out)
	}
	listen := netip.MustParseAddr("127.0.0.1")
	if in != nil {
		listen = in.ip
	}
	ca, leaf := pkitest.Issue(t, listen)
	certFile, keyFile := pkitest.WritePEM(t, tmp, leaf)
	user, password := "admin", "sushy-"+strconv.FormatInt(time.Now().UnixNano()%100000, 10)
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	port := 8000 // in a namespace of the test's own
	if in == nil {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	if err := os.WriteFile(filepath.Join(tmp, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("SUSHY_EMULATOR_LISTEN_IP = '%s'\nSUSHY_EMULATOR_LISTEN_PORT = %d\nSUSHY_EMULATOR_SSL_CERT = %q\nSUSHY_EMULATOR_SSL_KEY = %q\nSUSHY_EMULATOR_AUTH_FILE = %q\n",
		listen, port, certFile, keyFile, filepath.Join(tmp, "htpasswd")) + driverConf
	if err := os.WriteFile(filepath.Join(tmp, "emulator.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(tmp, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		for _, f := range []string{certFile, keyFile, "htpasswd", "emulator.conf", "state"} {
			if !filepath.IsAbs(f) {
				f = filepath.Join(tmp, f)
			}
			if err := os.Chown(f, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	logf, err := os.Create(filepath.Join(tmp, "sushy.log"))
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{py, "-m", "sushy_tools.emulator.main", "--config", filepath.Join(tmp, "emulator.conf")}
	cmd := exec.Command(argv[0], argv[1:]...)
	if in != nil {
		// ip netns exec execs setpriv, which execs python: cmd's PID is sushy-emulator's.
		cmd = in.ns.Command(append([]string{"setpriv", "--reuid=" + strconv.Itoa(int(cred.Uid)), "--regid=" + strconv.Itoa(int(cred.Gid)), "--clear-groups"}, argv...)...)
	}
	// TMPDIR: its persistent state (memoize.py keeps systems in $TMPDIR/sushy-emulator) starts fresh;
	// virtual media images it downloads land there too.
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "TMPDIR="+state)
	cmd.Stdout, cmd.Stderr = logf, logf
	if cred != nil && in == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
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
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	if in != nil {
		tr.DialContext = dialIn(in.ns.Path())
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: time.Second, Transport: tr}
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(tmp, "sushy.log"))
			t.Fatalf("sushy-emulator exited:\n%s", b)
		default:
		}
		if resp, err := client.Get("https://" + net.JoinHostPort(listen.String(), strconv.Itoa(port)) + "/redfish/v1/"); err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(tmp, "sushy.log"))
			t.Fatalf("sushy-emulator not answering:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return Emulator{Port: port, CAPEM: ca, User: user, Password: password, Log: filepath.Join(tmp, "sushy.log")}
}
