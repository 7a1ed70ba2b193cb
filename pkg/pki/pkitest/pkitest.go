// Package pkitest gives tests a throwaway CA and serving certificate made by the product's own
// pkg/pki (ECDSA P-256, the appliance's CA and serving-certificate profile), so that test servers
// present certificates shaped like the real appliance's.
package pkitest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"os"
	"path/filepath"
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

// WritePEM writes serving's certificate chain and its private key (PKCS#8) as PEM files cert.pem and
// key.pem (0600) in dir, for servers that read their TLS material from files (docker-registry,
// sushy-tools), and returns their paths.
func WritePEM(t testing.TB, dir string, serving tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	var chain bytes.Buffer
	for _, der := range serving.Certificate {
		_ = pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	key, err := x509.MarshalPKCS8PrivateKey(serving.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for p, data := range map[string][]byte{certFile: chain.Bytes(), keyFile: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})} {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}
