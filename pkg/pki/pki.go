// Package pki keeps the appliance's certificate authority, the HTTPS serving certificate the appliance
// presents to nodes, and the per-node bearer tokens nodes authenticate with.
//
// It follows kubeadm's rule for certificates (cmd/kubeadm/app/phases/certs): reuse what is on disk when
// it is valid, refuse when it conflicts, create only what is missing. The CA is never regenerated
// silently: every node trusts it (by file or by its pin, agentapi.PinOf), so a new CA would strand every node already
// provisioned. The serving certificate is a leaf signed by that pinned CA, so re-issuing it is safe and
// happens whenever it no longer fits (SANs changed, near expiry, unreadable).
//
// Layout of the directory passed to every function:
//
//	ca.crt       0644  the CA certificate (PEM), handed to nodes
//	ca.key       0600  the CA private key (PEM, PKCS #8)
//	serving.crt  0644  the HTTPS serving certificate (PEM)
//	serving.key  0600  its private key (PEM, PKCS #8)
//	tokens/NODE  0600  one bearer token per node
//
// Every file is written with pkg/atomicfile, key before certificate, so a crash leaves either nothing
// new, a key without its certificate (reported as a conflict for the CA, re-issued for the serving
// certificate) or a complete pair — never a certificate whose key is missing.
//
// Keys are ECDSA P-256. It is the one algorithm every TLS client on the node path accepts: Go's
// crypto/tls (containerd, skopeo, Ignition), OpenSSL and curl in initramfs and package managers, and
// firmware HTTP boot stacks, several of which do not accept Ed25519 certificates (RFC 8410) and do not
// need RSA's larger keys and slower signatures.
//
// Callers serialise calls for one directory (the bootstrap runs one phase at a time); two processes
// running EnsureCA concurrently on an empty directory could each create a CA.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// File names inside the PKI directory.
const (
	CACertFile      = "ca.crt"
	CAKeyFile       = "ca.key"
	ServingCertFile = "serving.crt"
	ServingKeyFile  = "serving.key"
	TokensDir       = "tokens"
)

// ErrConflict reports key material on disk that cannot be reused and must not be overwritten: a key that
// does not match its certificate, a CA certificate that is not a CA or has expired, unreadable PEM, or
// only one half of a pair. The wrapping error names the file and says what to do.
var ErrConflict = errors.New("conflicting PKI material")

// Outcome says what an Ensure function did. Changed is true when any file was written. Detail is a short
// sentence for people, e.g. "reused CA (expires 2036-11-20)" or "issued serving cert (4 SANs)"; it
// never contains key material or tokens.
type Outcome struct {
	Changed bool
	Detail  string
}

// conflict builds an ErrConflict naming path, the problem and the fix.
func conflict(path, problem, fix string) error {
	return fmt.Errorf("%w: %s: %s; %s", ErrConflict, path, problem, fix)
}

// newKey generates an ECDSA P-256 key (see the package comment for why P-256).
func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ECDSA P-256 key: %w", err)
	}
	return k, nil
}

// encodeKey returns key as a PKCS #8 "PRIVATE KEY" PEM block.
func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// encodeCert returns der as a "CERTIFICATE" PEM block.
func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// readOptional reads path; a missing file returns (nil, false, nil).
func readOptional(path string) ([]byte, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	return b, true, nil
}

// parseCertPEM parses data holding exactly one PEM "CERTIFICATE" block (text around it, such as
// OpenSSL's "Bag Attributes", is ignored). The error is a plain description for conflict messages.
func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	if block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("PEM block is %q, want CERTIFICATE", block.Type)
	}
	if next, _ := pem.Decode(rest); next != nil {
		return nil, errors.New("more than one PEM block (a bundle); this file must hold one certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return cert, nil
}

// parseKeyPEM parses a private key in PKCS #8 ("PRIVATE KEY"), SEC 1 ("EC PRIVATE KEY") or PKCS #1
// ("RSA PRIVATE KEY") PEM, so a CA restored from another tool (kubeadm, OpenSSL, cfssl) is accepted.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "ENCRYPTED PRIVATE KEY":
		return nil, errors.New("the key is encrypted; store it decrypted (the file is 0600)")
	default:
		return nil, fmt.Errorf("PEM block is %q, want PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key type %T", key)
	}
	return signer, nil
}

// keyMatches reports whether signer is the private half of cert's public key.
func keyMatches(cert *x509.Certificate, signer crypto.Signer) bool {
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(signer.Public())
}

// joinPath is filepath.Join, named for readability at call sites.
func joinPath(dir, name string) string { return filepath.Join(dir, name) }

// plural returns "n word" with an "s" unless n == 1.
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// joinNonEmpty joins the non-empty parts with sep.
func joinNonEmpty(sep string, parts ...string) string {
	out := parts[:0:0]
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, sep)
}
