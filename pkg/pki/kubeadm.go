package pki

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"regexp"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// BootstrapTokenTTL is the lifetime of the kubeadm bootstrap token and of the certificates kubeadm
// uploads for joining control planes (kubeadm deletes the kubeadm-certs Secret after 2 h; its token
// default is 24 h, shortened here so a leaked token is useful for less time). A rerun after it
// renews both (EnsureKubeadmSecrets).
const BootstrapTokenTTL = 2 * time.Hour

// KubeadmSecretsFile is the file (JSON, 0600) in the PKI directory that holds the cluster's kubeadm
// join secrets.
const KubeadmSecretsFile = "kubeadm-secrets.json"

// KubeadmSecrets are the shared secrets of a kubeadm cluster build.
type KubeadmSecrets struct {
	// BootstrapToken is a kubeadm bootstrap token, "[a-z0-9]{6}.[a-z0-9]{16}" (token ID "." secret,
	// Kubernetes bootstrap token format). Secret.
	BootstrapToken string `json:"bootstrapToken"`
	// CertificateKey is the AES-256 key (64 lowercase hex characters) kubeadm encrypts the
	// kubeadm-certs Secret with (`kubeadm init --upload-certs --certificate-key`). Secret.
	CertificateKey string `json:"certificateKey"`
	// Created is when the pair was made; both expire Created+TTL.
	Created time.Time `json:"created"`
}

// Expires is when the secrets stop working for ttl.
func (s KubeadmSecrets) Expires(ttl time.Duration) time.Time { return s.Created.Add(ttl) }

// NodeBootstrapToken is node's own bootstrap token (a worker's: issue 34, item 3), derived from the
// certificate key: HMAC-SHA256 under the key of "appliance node bootstrap token" and the node name,
// read as base-36 digits (rejection sampling, so every character is uniform over [a-z0-9]). It is
// renewed with the pair (a new certificate key gives every node a new token), needs no storage, and
// reveals nothing of the key or of other nodes' tokens to the node that holds it. "" when the
// certificate key is not hex (EnsureKubeadmSecrets refuses such a file).
func (s KubeadmSecrets) NodeBootstrapToken(node string) string {
	key, err := hex.DecodeString(s.CertificateKey)
	if err != nil || len(key) == 0 {
		return ""
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	tok := make([]byte, 0, 23)
	for counter := byte(0); len(tok) < 23; counter++ {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte("appliance node bootstrap token\x00"))
		mac.Write([]byte(node))
		mac.Write([]byte{0, counter})
		for _, b := range mac.Sum(nil) {
			if b >= 252 { // 252 = 7*36: the rest would favour the first characters
				continue
			}
			if len(tok) == 6 {
				tok = append(tok, '.')
			}
			if len(tok) < 23 {
				tok = append(tok, alphabet[b%36])
			}
		}
	}
	return string(tok)
}

var (
	bootstrapTokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
	certificateKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// KubeadmSecretsMargin is how long before expiry EnsureKubeadmSecrets replaces the secrets, so a
// node given them has time to use them.
const KubeadmSecretsMargin = 15 * time.Minute

// EnsureKubeadmSecrets returns the cluster's bootstrap token and certificate key from
// dir/KubeadmSecretsFile, making new ones (crypto/rand) when the file is missing or they expire
// within KubeadmSecretsMargin of now for ttl (kubeadm's token TTL: the token and the uploaded
// certificates stop working then, so a rerun after that hands out fresh ones). Outcome.Changed
// reports a new pair. A file that does not parse, or holds a malformed token or key, is an
// ErrConflict naming the file (move it away to make new secrets).
func EnsureKubeadmSecrets(dir string, ttl time.Duration, now time.Time) (KubeadmSecrets, Outcome, error) {
	path := joinPath(dir, KubeadmSecretsFile)
	data, ok, err := readOptional(path)
	if err != nil {
		return KubeadmSecrets{}, Outcome{}, err
	}
	if ok {
		var s KubeadmSecrets
		if err := json.Unmarshal(data, &s); err != nil {
			return KubeadmSecrets{}, Outcome{}, conflict(path, "does not parse: "+err.Error(), "move it away; the next run makes new join secrets")
		}
		if !bootstrapTokenRE.MatchString(s.BootstrapToken) || !certificateKeyRE.MatchString(s.CertificateKey) || s.Created.IsZero() {
			return KubeadmSecrets{}, Outcome{}, conflict(path, "holds a malformed bootstrap token, certificate key or creation time", "move it away; the next run makes new join secrets")
		}
		if now.Before(s.Expires(ttl).Add(-KubeadmSecretsMargin)) {
			if err := os.Chmod(path, 0o600); err != nil {
				return KubeadmSecrets{}, Outcome{}, err
			}
			return s, Outcome{Detail: "reused kubeadm join secrets (expire " + s.Expires(ttl).UTC().Format(time.RFC3339) + ")"}, nil
		}
	}
	s, err := newKubeadmSecrets(now)
	if err != nil {
		return KubeadmSecrets{}, Outcome{}, err
	}
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return KubeadmSecrets{}, Outcome{}, err
	}
	if _, err := atomicfile.Write(path, append(out, '\n'), 0o600); err != nil {
		return KubeadmSecrets{}, Outcome{}, fmt.Errorf("write %s: %w", path, err)
	}
	verb := "created"
	if ok {
		verb = "renewed expiring"
	}
	return s, Outcome{Changed: true, Detail: verb + " kubeadm join secrets (expire " + s.Expires(ttl).UTC().Format(time.RFC3339) + ")"}, nil
}

func newKubeadmSecrets(now time.Time) (KubeadmSecrets, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	tok := make([]byte, 0, 23)
	for i := range 22 {
		if i == 6 {
			tok = append(tok, '.')
		}
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return KubeadmSecrets{}, err
		}
		tok = append(tok, alphabet[n.Int64()])
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return KubeadmSecrets{}, err
	}
	return KubeadmSecrets{BootstrapToken: string(tok), CertificateKey: hex.EncodeToString(key), Created: now.UTC().Truncate(time.Second)}, nil
}

// ClientCert is a client certificate and its key, PEM.
type ClientCert struct {
	CertPEM, KeyPEM []byte
}

// IssueClientCert signs a TLS client certificate for commonName in organizations (Kubernetes reads
// CN as the user and O as its groups) with ca, valid from now-1h for validity (capped at the CA's
// expiry). kubeadm's admin.conf is CN=kubernetes-admin, O=kubeadm:cluster-admins.
func IssueClientCert(ca *CA, commonName string, organizations []string, validity time.Duration, now time.Time) (ClientCert, error) {
	if commonName == "" {
		return ClientCert{}, errors.New("client certificate: empty common name")
	}
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return ClientCert{}, errors.New("client certificate: no CA")
	}
	key, err := newKey()
	if err != nil {
		return ClientCert{}, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: organizations},
		NotBefore:   now.Add(-backdate).UTC(),
		NotAfter:    notAfter.UTC(),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return ClientCert{}, fmt.Errorf("sign client certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return ClientCert{}, err
	}
	return ClientCert{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// KeyPEM returns the CA's private key as PEM (the encoding EnsureCA writes to ca.key). Secret.
func (ca *CA) KeyPEM() ([]byte, error) { return encodeKey(ca.Key) }
