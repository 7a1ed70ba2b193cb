package pki

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

const (
	// servingValidityYears is the serving certificate's lifetime (capped at the CA's expiry).
	servingValidityYears = 1
	// renewBefore is how long before expiry a reused serving certificate is re-issued.
	renewBefore = 30 * 24 * time.Hour
	// servingCommonName is informational only: clients match the SANs (RFC 6125; Go ignores the CN).
	servingCommonName = "appliance serving certificate"
)

// EnsureServingCert makes dir hold a TLS serving certificate (serving.crt/serving.key) signed by ca whose
// subjectAltNames are exactly ips and dnsNames, and returns it ready for tls.Config.Certificates (Leaf
// set; the chain holds the leaf only, since nodes hold the CA as their trust anchor).
//
// The existing certificate is reused (Outcome.Changed=false, files untouched) when its key matches, it
// chains to ca with extKeyUsage serverAuth, it is valid at now with more than 30 days left, and its SAN
// set equals the requested set (order and duplicates ignored, DNS names compared case-insensitively).
// Otherwise a new ECDSA P-256 key and certificate are issued: valid one year (never past the CA's
// expiry), keyUsage digitalSignature, extKeyUsage serverAuth. Re-issuing is safe because nodes trust the
// CA, not this leaf; Outcome.Detail says why, e.g. "re-issued serving cert: SANs changed (+10.0.0.5)".
// The key is written (0600) before the certificate (0644); after a crash between the two the next call
// sees the mismatch and re-issues.
//
// It returns an error when ca is incomplete, when no SAN is requested, or an IP is invalid or zoned or a
// DNS name is empty.
func EnsureServingCert(dir string, ca *CA, ips []netip.Addr, dnsNames []string, now time.Time) (tls.Certificate, Outcome, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return tls.Certificate{}, Outcome{}, errors.New("issue serving certificate: no CA (call EnsureCA first)")
	}
	want, err := newSANSet(ips, dnsNames)
	if err != nil {
		return tls.Certificate{}, Outcome{}, fmt.Errorf("issue serving certificate: %w", err)
	}
	certPath, keyPath := joinPath(dir, ServingCertFile), joinPath(dir, ServingKeyFile)

	reason, cert, err := checkServing(certPath, keyPath, ca, want, now)
	if err != nil {
		return tls.Certificate{}, Outcome{}, err
	}
	if reason == "" {
		return cert, Outcome{Detail: fmt.Sprintf("reused serving cert (%s, expires %s)",
			plural(want.len(), "SAN"), cert.Leaf.NotAfter.UTC().Format(time.DateOnly))}, nil
	}

	cert, keyPEM, certPEM, err := issueServing(ca, want, now)
	if err != nil {
		return tls.Certificate{}, Outcome{}, err
	}
	if _, err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, Outcome{}, fmt.Errorf("write serving key: %w", err)
	}
	if _, err := atomicfile.Write(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, Outcome{}, fmt.Errorf("write serving certificate: %w", err)
	}
	detail := fmt.Sprintf("issued serving cert (%s)", plural(want.len(), "SAN"))
	if reason != reasonMissing {
		detail = "re-issued serving cert: " + reason
	}
	return cert, Outcome{Changed: true, Detail: detail}, nil
}

const reasonMissing = "missing"

// checkServing returns "" and the certificate when the files on disk can be reused, or the reason they
// cannot (reasonMissing when neither file exists). Only I/O failures other than "not found" are errors.
func checkServing(certPath, keyPath string, ca *CA, want sanSet, now time.Time) (string, tls.Certificate, error) {
	certPEM, haveCert, err := readOptional(certPath)
	if err != nil {
		return "", tls.Certificate{}, err
	}
	keyPEM, haveKey, err := readOptional(keyPath)
	if err != nil {
		return "", tls.Certificate{}, err
	}
	switch {
	case !haveCert && !haveKey:
		return reasonMissing, tls.Certificate{}, nil
	case !haveCert:
		return ServingCertFile + " missing", tls.Certificate{}, nil
	case !haveKey:
		return ServingKeyFile + " missing", tls.Certificate{}, nil
	}
	leaf, err := parseCertPEM(certPEM)
	if err != nil {
		return ServingCertFile + " unreadable (" + err.Error() + ")", tls.Certificate{}, nil
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return ServingKeyFile + " unreadable (" + err.Error() + ")", tls.Certificate{}, nil
	}
	if !keyMatches(leaf, key) {
		return ServingKeyFile + " does not match " + ServingCertFile, tls.Certificate{}, nil
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return "outside its validity period (" + leaf.NotBefore.UTC().Format(time.DateOnly) + " to " +
				leaf.NotAfter.UTC().Format(time.DateOnly) + ")", tls.Certificate{}, nil
		}
		return "does not verify against the CA (" + err.Error() + ")", tls.Certificate{}, nil
	}
	if left := leaf.NotAfter.Sub(now); left <= renewBefore {
		return fmt.Sprintf("expires in %d days (%s)", int(left.Hours()/24), leaf.NotAfter.UTC().Format(time.DateOnly)), tls.Certificate{}, nil
	}
	have, err := sanSetOf(leaf)
	if err != nil {
		return "SANs unusable (" + err.Error() + ")", tls.Certificate{}, nil
	}
	if diff := have.diff(want); diff != "" {
		return "SANs changed (" + diff + ")", tls.Certificate{}, nil
	}
	return "", tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// issueServing creates a new key and serving certificate in memory.
func issueServing(ca *CA, sans sanSet, now time.Time) (tls.Certificate, []byte, []byte, error) {
	key, err := newKey()
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	notAfter := now.AddDate(servingValidityYears, 0, 0)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		// SerialNumber nil: crypto/x509 draws a random RFC 5280 §4.1.2.2 serial.
		Subject:               pkix.Name{CommonName: servingCommonName},
		NotBefore:             now.Add(-backdate).UTC(),
		NotAfter:              notAfter.UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              sans.dns,
	}
	for _, ip := range sans.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("parse new serving certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, keyPEM, encodeCert(der), nil
}

// sanSet is a normalised, sorted, duplicate-free set of subjectAltNames.
type sanSet struct {
	ips []netip.Addr // unmapped, sorted
	dns []string     // lowercase, sorted
}

func (s sanSet) len() int { return len(s.ips) + len(s.dns) }

// strings returns every SAN as text (IPs first), for diffs.
func (s sanSet) strings() []string {
	out := make([]string, 0, s.len())
	for _, ip := range s.ips {
		out = append(out, ip.String())
	}
	return append(out, s.dns...)
}

// diff describes how want differs from s: "+added, -removed", or "" when equal.
func (s sanSet) diff(want sanSet) string {
	have, next := s.strings(), want.strings()
	var parts []string
	for _, n := range next {
		if !slices.Contains(have, n) {
			parts = append(parts, "+"+n)
		}
	}
	for _, h := range have {
		if !slices.Contains(next, h) {
			parts = append(parts, "-"+h)
		}
	}
	return strings.Join(parts, ", ")
}

// newSANSet validates and normalises requested SANs.
func newSANSet(ips []netip.Addr, dnsNames []string) (sanSet, error) {
	var s sanSet
	for _, ip := range ips {
		if !ip.IsValid() {
			return sanSet{}, errors.New("invalid (zero) IP address in SANs")
		}
		if ip.Zone() != "" {
			return sanSet{}, fmt.Errorf("IP SAN %s has a zone; certificates cannot name zoned addresses", ip)
		}
		s.ips = append(s.ips, ip.Unmap())
	}
	for _, n := range dnsNames {
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if n == "" || strings.ContainsAny(n, " \t\r\n/") {
			return sanSet{}, fmt.Errorf("invalid DNS SAN %q", n)
		}
		s.dns = append(s.dns, n)
	}
	if s.len() == 0 {
		return sanSet{}, errors.New("no SANs requested: give at least one IP address or DNS name")
	}
	s.normalise()
	return s, nil
}

// sanSetOf returns the SANs in cert; URI or e-mail SANs (never issued here) are an error.
func sanSetOf(cert *x509.Certificate) (sanSet, error) {
	if len(cert.URIs) > 0 || len(cert.EmailAddresses) > 0 {
		return sanSet{}, errors.New("has URI or e-mail SANs")
	}
	var s sanSet
	for _, ip := range cert.IPAddresses {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			return sanSet{}, fmt.Errorf("malformed IP SAN %v", ip)
		}
		s.ips = append(s.ips, a.Unmap())
	}
	for _, n := range cert.DNSNames {
		s.dns = append(s.dns, strings.ToLower(n))
	}
	s.normalise()
	return s, nil
}

func (s *sanSet) normalise() {
	slices.SortFunc(s.ips, netip.Addr.Compare)
	s.ips = slices.Compact(s.ips)
	slices.Sort(s.dns)
	s.dns = slices.Compact(s.dns)
}
