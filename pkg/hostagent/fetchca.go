// Package hostagent is the node agent: it fetches the node's configuration from the appliance and
// configures the node in idempotent steps, reporting each to the appliance (pkg/agentapi).
//
// Trust follows kubeadm's token discovery: the node knows only the appliance URL, its bearer token
// and a pin of the CA's public key (agentapi.Configuration.CAPin, agentapi.PinOf format). FetchCA
// downloads the CA without trusting anything and keeps it only if its SubjectPublicKeyInfo hashes
// to the pin; from then on every request trusts that CA and nothing else (not the system roots).
//
// The steps (agentapi.Plan order): config, firewall, containerd, keepalived and api (control
// planes), ready. Each checks the real world first and changes only what differs, so running the
// agent again, or after a reboot, is safe. Reports travel through an ordered queue that retries
// with exponential backoff (github.com/cenkalti/backoff/v5) while the appliance is away; the node
// config is cached 0600 under ROOT/var/lib/hostagent so a restart with the appliance down still
// configures the node.
package hostagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// CAPath is the path of the ca.crt endpoint on the appliance.
const CAPath = "/ca.crt"

// maxCABytes bounds the CA download.
const maxCABytes = 1 << 20

// ErrPinMismatch is wrapped when no certificate served matches the pin.
var ErrPinMismatch = errors.New("appliance CA does not match the pin")

// ErrBadPin is wrapped when a pin is not "sha256:" and 64 hex digits (the contract's agentapi.ErrBadPin).
var ErrBadPin = agentapi.ErrBadPin

// VerifyCA returns the certificate in pemBytes whose SubjectPublicKeyInfo SHA-256 equals pin and that
// is a CA certificate (basic constraints CA:TRUE), as PEM. Errors: ErrBadPin; ErrPinMismatch (with
// the pins seen, so an operator can compare); unparsable PEM.
func VerifyCA(pemBytes []byte, pin string) ([]byte, *x509.Certificate, error) {
	want, err := agentapi.ParsePin(pin)
	if err != nil {
		return nil, nil, err
	}
	var seen []string
	rest := pemBytes
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("parse CA certificate: %w", err)
		}
		got := agentapi.PinOf(c)
		if got == want && c.IsCA {
			return pem.EncodeToMemory(b), c, nil
		}
		seen = append(seen, got)
	}
	if len(seen) == 0 {
		return nil, nil, fmt.Errorf("%w: no PEM certificate in the answer", ErrPinMismatch)
	}
	return nil, nil, fmt.Errorf("%w: want %s, the appliance serves %s (wrong appliance, or a re-keyed CA: fix caPin in the hostagent config)", ErrPinMismatch, want, strings.Join(seen, ", "))
}

// FetchCA downloads the appliance CA from applianceURL (https://host:port; CAPath is appended when
// the URL has no path) WITHOUT verifying the server (it has nothing to verify with yet), accepts it
// only if it matches pin (VerifyCA), and then checks that the server's own certificate chains to
// that CA, so the answer came from a holder of a certificate the pinned CA issued. It returns the CA
// as PEM. A plain-http URL is refused.
//
// Errors: ErrBadPin, ErrPinMismatch, a server certificate not issued by the CA, network errors
// (retryable), non-200 answers.
func FetchCA(ctx context.Context, applianceURL, pin string) ([]byte, error) {
	if _, err := agentapi.ParsePin(pin); err != nil {
		return nil, err
	}
	u, err := url.Parse(applianceURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("appliance URL %q: want https://host:port", applianceURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = CAPath
	}
	tr := &http.Transport{
		// Discovery: the pin, not the TLS handshake, authenticates the CA (kubeadm token discovery).
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // checked against the pin below
		Proxy:           nil,
		DialContext:     dialContext,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch appliance CA: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCABytes))
	if err != nil {
		return nil, fmt.Errorf("fetch appliance CA: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch appliance CA from %s: HTTP %d", u, resp.StatusCode)
	}
	caPEM, ca, err := VerifyCA(body, pin)
	if err != nil {
		return nil, err
	}
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		return nil, errors.New("fetch appliance CA: no TLS peer certificate")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	inter := x509.NewCertPool()
	for _, c := range resp.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := resp.TLS.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: u.Hostname()}); err != nil {
		return nil, fmt.Errorf("%w: the server's certificate is not issued by the pinned CA: %w", ErrPinMismatch, err)
	}
	return caPEM, nil
}
