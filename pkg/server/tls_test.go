package server

import (
	"context"
	"crypto/tls"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

// serveTLSFront serves s on a real TLS listener on 127.0.0.1 (Server.ServeListener, the production
// path) until the test ends, and returns its address.
func serveTLSFront(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() { done <- s.ServeListener(ctx, ln, ready) }()
	<-ready
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// handshake12 tries a TLS 1.2 handshake offering only suite.
func handshake12(addr string, suite uint16) error {
	conn, err := tls.Dial("tcp", addr, &tls.Config{
		InsecureSkipVerify: true, //nolint:gosec // only the negotiated suite matters here
		MinVersion:         tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{suite},
	})
	if err != nil {
		return err
	}
	return conn.Close()
}

// TestTLSOffersAEADOnly: over TLS 1.2 the front negotiates no suite that Go implements but Mozilla's
// "intermediate" profile leaves out (every CBC suite: SHA-1 and SHA-256 MACs alike, RSA key
// exchange, 3DES, RC4), and every ECDHE AEAD suite for its key type (ECDSA: AES-GCM and
// ChaCha20-Poly1305) works. TLS 1.3 suites are not configurable and stay as Go has them.
func TestTLSOffersAEADOnly(t *testing.T) {
	s, _ := newTestServer(t)
	addr := serveTLSFront(t, s)
	aead := []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	}
	tried := 0
	for _, cs := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		if !slices.Contains(cs.SupportedVersions, tls.VersionTLS12) {
			continue // TLS 1.3 only
		}
		tried++
		err := handshake12(addr, cs.ID)
		switch {
		case slices.Contains(aead, cs.ID) && err != nil:
			t.Errorf("%s (AEAD, Mozilla intermediate) refused: %v", cs.Name, err)
		case !slices.Contains(aead, cs.ID) && err == nil:
			t.Errorf("%s was negotiated; only the ECDHE AEAD suites may be", cs.Name)
		}
	}
	var cbc int
	for _, cs := range tls.CipherSuites() {
		if strings.Contains(cs.Name, "_CBC_") {
			cbc++
		}
	}
	if tried < 10 || cbc == 0 {
		t.Fatalf("enumerated %d TLS 1.2 suites, %d CBC ones among the secure list: the probe did not run", tried, cbc)
	}
	// TLS 1.3 is unchanged.
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // probing
	if err != nil {
		t.Fatalf("TLS 1.3: %v", err)
	}
	if v := conn.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("negotiated %x, want TLS 1.3", v)
	}
	_ = conn.Close()
}

// TestTLSOpenSSLClient: Debian's openssl s_client, a real client outside Go's TLS stack, gets no CBC
// suite over TLS 1.2 and does get an AEAD one (the serving key is ECDSA P-256, pkg/pki's profile).
func TestTLSOpenSSLClient(t *testing.T) {
	openssl := labns.RequireTool(t, "openssl")
	s, _ := newTestServer(t)
	addr := serveTLSFront(t, s)
	run := func(cipher string) (string, error) {
		cmd := exec.Command(openssl, "s_client", "-connect", addr, "-tls1_2", "-cipher", cipher, "-brief")
		cmd.Stdin = strings.NewReader("")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, cbc := range []string{"ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA", "ECDHE-ECDSA-AES128-SHA256"} {
		if out, err := run(cbc); err == nil {
			t.Errorf("openssl -tls1_2 -cipher %s connected; want a handshake failure:\n%s", cbc, out)
		}
	}
	for _, ok := range []string{"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305"} {
		out, err := run(ok)
		if err != nil || !strings.Contains(out, "Ciphersuite: "+ok) {
			t.Errorf("openssl -tls1_2 -cipher %s: %v; want it negotiated:\n%s", ok, err, out)
		}
	}
}
