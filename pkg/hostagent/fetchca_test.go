package hostagent

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/pki"
)

// testPKI makes a CA in a temp dir and a serving certificate for 127.0.0.1 issued by it.
func testPKI(t *testing.T) (*pki.CA, tls.Certificate) {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	ca, _, err := pki.EnsureCA(dir, "test appliance CA", now)
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := pki.EnsureServingCert(dir, ca, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, []string{"localhost"}, now)
	if err != nil {
		t.Fatal(err)
	}
	return ca, cert
}

// caServer serves servedPEM at /ca.crt over TLS with cert.
func caServer(t *testing.T, cert tls.Certificate, servedPEM []byte) string {
	t.Helper()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != CAPath {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(servedPEM)
	}))
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestFetchCA(t *testing.T) {
	ca, cert := testPKI(t)
	other, otherCert := testPKI(t)
	good := caServer(t, cert, ca.CertPEM)
	// An impostor serves the real CA (public) but cannot hold a certificate it issued.
	impostor := caServer(t, otherCert, ca.CertPEM)
	// A server of another CA.
	wrong := caServer(t, otherCert, other.CertPEM)
	for _, tc := range []struct {
		name, url, pin string
		err            error
	}{
		{"pin matches", good, agentapi.PinOf(ca.Cert), nil},
		{"pin matches, upper case hex", good, "sha256:" + upper(agentapi.PinOf(ca.Cert)[7:]), nil},
		{"another CA", wrong, agentapi.PinOf(ca.Cert), ErrPinMismatch},
		{"impostor server certificate", impostor, agentapi.PinOf(ca.Cert), ErrPinMismatch},
		{"malformed pin", good, "sha256:abcd", ErrBadPin},
		{"no algorithm", good, agentapi.PinOf(ca.Cert)[7:], ErrBadPin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FetchCA(context.Background(), tc.url, tc.pin)
			if !errors.Is(err, tc.err) {
				t.Fatalf("FetchCA = %v, want %v", err, tc.err)
			}
			if err == nil && string(got) != string(ca.CertPEM) {
				t.Errorf("FetchCA returned\n%s\nwant\n%s", got, ca.CertPEM)
			}
		})
	}
	if _, err := FetchCA(context.Background(), "http://127.0.0.1:1", agentapi.PinOf(ca.Cert)); err == nil {
		t.Error("FetchCA accepted a plain-http URL")
	}
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'f' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
