package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

const (
	// caValidityYears is the CA lifetime (kubeadm also uses 10 years for its CAs).
	caValidityYears = 10
	// backdate moves NotBefore into the past so nodes whose clock lags the bootstrap host's (no NTP in
	// an air gap, a fresh RTC) still accept new certificates; Kubernetes' certutil backdates by the same
	// hour for its self-signed certificates.
	backdate = time.Hour
)

// CA is the appliance certificate authority. Cert is the parsed CA certificate, Key its private key and
// CertPEM the certificate as PEM, the bytes handed to nodes as their trust anchor.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// EnsureCA makes dir hold a usable CA in ca.crt/ca.key and returns it.
//
//   - Both files missing: creates an ECDSA P-256 CA valid for 10 years from now (NotBefore backdated one
//     hour for clock skew) with subject CN=commonName, path length 0 (it signs only leaf certificates).
//     The key is written (0600) before the certificate (0644).
//   - Both present and valid at now: reuses them unchanged (Outcome.Changed=false). commonName is not
//     compared: an operator-supplied CA with another name is fine.
//   - Anything else returns an error wrapping ErrConflict naming the file: only one of the two files,
//     unreadable PEM, a key that does not match the certificate, a certificate that is not a CA,
//     expired or not yet valid at now. Nothing is overwritten.
//
// Other errors (permissions, disk) are returned wrapped and do not wrap ErrConflict.
func EnsureCA(dir, commonName string, now time.Time) (*CA, Outcome, error) {
	certPath, keyPath := joinPath(dir, CACertFile), joinPath(dir, CAKeyFile)
	certPEM, haveCert, err := readOptional(certPath)
	if err != nil {
		return nil, Outcome{}, err
	}
	keyPEM, haveKey, err := readOptional(keyPath)
	if err != nil {
		return nil, Outcome{}, err
	}
	switch {
	case haveCert && haveKey:
		ca, err := loadCA(certPath, keyPath, certPEM, keyPEM, now)
		if err != nil {
			return nil, Outcome{}, err
		}
		return ca, Outcome{Detail: fmt.Sprintf("reused CA (expires %s)", ca.Cert.NotAfter.UTC().Format(time.DateOnly))}, nil
	case haveKey:
		return nil, Outcome{}, conflict(certPath, "missing while "+keyPath+" exists (a half-written pair or a partial restore)",
			"restore "+CACertFile+" from backup, or move "+keyPath+" away to create a new CA (every node trusting the old CA must then be re-provisioned)")
	case haveCert:
		return nil, Outcome{}, conflict(keyPath, "missing while "+certPath+" exists (a partial restore?)",
			"restore "+CAKeyFile+" from backup, or move "+certPath+" away to create a new CA (every node trusting the old CA must then be re-provisioned)")
	}
	if commonName == "" {
		return nil, Outcome{}, errors.New("create CA: empty common name")
	}
	ca, err := newCA(commonName, now)
	if err != nil {
		return nil, Outcome{}, err
	}
	keyPEM, err = encodeKey(ca.Key)
	if err != nil {
		return nil, Outcome{}, err
	}
	if _, err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return nil, Outcome{}, fmt.Errorf("write CA key: %w", err)
	}
	if _, err := atomicfile.Write(certPath, ca.CertPEM, 0o644); err != nil {
		return nil, Outcome{}, fmt.Errorf("write CA certificate: %w", err)
	}
	return ca, Outcome{Changed: true, Detail: fmt.Sprintf("created CA (expires %s)", ca.Cert.NotAfter.UTC().Format(time.DateOnly))}, nil
}

// loadCA parses and checks an existing CA pair; every problem is an ErrConflict naming the file.
func loadCA(certPath, keyPath string, certPEM, keyPEM []byte, now time.Time) (*CA, error) {
	const fixCert = "move it away together with " + CAKeyFile + " to create a new CA (every node trusting the old CA must then be re-provisioned), or restore the pair from backup"
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, conflict(certPath, err.Error(), fixCert)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, conflict(certPath, "not a CA certificate (basicConstraints CA:FALSE or absent)", fixCert)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, conflict(certPath, "CA certificate lacks the keyCertSign key usage", fixCert)
	}
	if now.After(cert.NotAfter) {
		return nil, conflict(certPath, "CA certificate expired on "+cert.NotAfter.UTC().Format(time.RFC3339), fixCert)
	}
	if now.Before(cert.NotBefore) {
		return nil, conflict(certPath, "CA certificate is not valid before "+cert.NotBefore.UTC().Format(time.RFC3339)+" (is this host's clock wrong?)",
			"fix the clock, or "+fixCert)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, conflict(keyPath, err.Error(), "restore "+CAKeyFile+" from backup, or move both CA files away to create a new CA (every node trusting the old CA must then be re-provisioned)")
	}
	if !keyMatches(cert, key) {
		return nil, conflict(keyPath, "does not match the public key in "+certPath,
			"restore the matching pair from backup, or move both CA files away to create a new CA (every node trusting the old CA must then be re-provisioned)")
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(cert.Raw)}, nil
}

// newCA creates a self-signed CA (in memory only).
func newCA(commonName string, now time.Time) (*CA, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		// SerialNumber nil: crypto/x509 draws a random RFC 5280 §4.1.2.2 serial.
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate).UTC(),
		NotAfter:              now.AddDate(caValidityYears, 0, 0).UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse new CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(der)}, nil
}
