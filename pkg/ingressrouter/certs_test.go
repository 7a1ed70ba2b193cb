package ingressrouter

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airgap-appliance/appliance/pkg/pki"
)

// testCA is a CA for the tests' Ingress certificates (pkg/pki's, as the appliance issues them).
func testCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, _, err := pki.EnsureCA(filepath.Join(t.TempDir(), "ca"), "ingress test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// tlsSecret issues a certificate for names from ca and returns it as a kubernetes.io/tls Secret.
func tlsSecret(t testing.TB, ca *pki.CA, ns, name string, names ...string) *corev1.Secret {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if _, _, err := pki.EnsureServingCert(dir, ca, nil, names, time.Now()); err != nil {
		t.Fatal(err)
	}
	crt, err := os.ReadFile(filepath.Join(dir, pki.ServingCertFile))
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(dir, pki.ServingKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}
}

func withTLS(in *networkingv1.Ingress, secret string, hosts ...string) *networkingv1.Ingress {
	in.Spec.TLS = append(in.Spec.TLS, networkingv1.IngressTLS{Hosts: hosts, SecretName: secret})
	return in
}

func leafNames(t *testing.T, c *tls.Certificate) []string {
	t.Helper()
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.DNSNames
}

// TestCertificates checks the SNI map: exact names, a wildcard of one label, the older Ingress for
// a name claimed twice, a Secret of another namespace not used, and each skipped entry reported
// with the Ingress, the field and the Secret.
func TestCertificates(t *testing.T) {
	ca := testCA(t)
	t0 := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	secrets := []*corev1.Secret{
		tlsSecret(t, ca, "ns", "shop", "shop.apps.test"),
		tlsSecret(t, ca, "ns", "wild", "*.apps.test"),
		tlsSecret(t, ca, "ns", "newer", "shop.apps.test", "newer.test"),
		tlsSecret(t, ca, "other", "elsewhere", "elsewhere.test"),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "opaque"}, Type: corev1.SecretTypeOpaque},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "broken"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: []byte("not PEM"), corev1.TLSPrivateKeyKey: []byte("x")}},
	}
	ings := []*networkingv1.Ingress{
		withTLS(withTLS(ingressObj("ns", "older", t0, nil, "web", nil), "shop", "Shop.Apps.Test"), "wild", "*.apps.test"),
		withTLS(ingressObj("ns", "newer", t0.Add(time.Hour), nil, "web", nil), "newer", "shop.apps.test", "newer.test"),
		withTLS(ingressObj("ns", "bad", t0.Add(2*time.Hour), nil, "web", nil), "elsewhere", "elsewhere.test"),
		withTLS(withTLS(ingressObj("ns", "worse", t0.Add(3*time.Hour), nil, "web", nil), "opaque", "o.test"), "broken", "b.test"),
	}
	c, problems := BuildCertificates(ings, secrets)
	if got, want := c.Hosts(), []string{"*.apps.test", "newer.test", "shop.apps.test"}; !slices.Equal(got, want) {
		t.Errorf("Hosts = %v, want %v", got, want)
	}
	for _, tc := range []struct{ sni, want string }{
		{"shop.apps.test", "shop.apps.test"}, // the older Ingress's Secret
		{"SHOP.apps.test.", "shop.apps.test"},
		{"other.apps.test", "*.apps.test"},
		{"newer.test", "shop.apps.test"}, // the newer Secret names both
	} {
		cert, err := c.Get(tc.sni)
		if err != nil {
			t.Errorf("Get(%q): %v", tc.sni, err)
			continue
		}
		if names := leafNames(t, cert); !slices.Contains(names, tc.want) {
			t.Errorf("Get(%q) = certificate for %v, want one for %s", tc.sni, names, tc.want)
		}
	}
	for _, sni := range []string{"", "a.b.apps.test", "elsewhere.test", "o.test", "b.test"} {
		if _, err := c.Get(sni); !errors.Is(err, ErrNoCertificate) {
			t.Errorf("Get(%q) = %v, want ErrNoCertificate", sni, err)
		}
	}
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.Error())
	}
	for _, want := range []string{
		`ingress ns/bad spec.tls[0].secretName "elsewhere": no such Secret`,
		`ingress ns/worse spec.tls[0].secretName "opaque": Secret of type "Opaque", want "kubernetes.io/tls"`,
		`ingress ns/worse spec.tls[1].secretName "broken": tls.crt and tls.key: `,
	} {
		if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, want) }) {
			t.Errorf("problems %q lack %q", msgs, want)
		}
	}
	if len(problems) != 3 {
		t.Errorf("%d problems, want 3: %q", len(problems), msgs)
	}
}
