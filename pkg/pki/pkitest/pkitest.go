// Package pkitest gives tests a throwaway CA and serving certificate made by the product's own
// pkg/pki (ECDSA P-256, the appliance's CA and serving-certificate profile), so that test servers
// present certificates shaped like the real appliance's.
package pkitest

import (
	"crypto/tls"
	"net/netip"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/pki"
)

// Issue creates a CA in a fresh temporary directory and a serving certificate it signs for ips
// (127.0.0.1 when none is given). It returns the CA certificate (PEM) and the serving certificate.
func Issue(t testing.TB, ips ...netip.Addr) (caPEM []byte, serving tls.Certificate) {
	t.Helper()
	if len(ips) == 0 {
		ips = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	dir := t.TempDir()
	now := time.Now()
	ca, _, err := pki.EnsureCA(dir, "test CA", now)
	if err != nil {
		t.Fatalf("test CA: %v", err)
	}
	cert, _, err := pki.EnsureServingCert(dir, ca, ips, nil, now)
	if err != nil {
		t.Fatalf("test serving certificate: %v", err)
	}
	return ca.CertPEM, cert
}
