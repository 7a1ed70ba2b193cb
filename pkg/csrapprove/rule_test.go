package csrapprove

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// testKey is one ECDSA key for every request of the table (key generation is the slow part).
var testKey = func() crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}()

// csrPEM makes a PEM CERTIFICATE REQUEST like a kubelet's (k8s.io/client-go/util/certificate:
// CN=system:node:<name>, O=system:nodes, DNS and IP SANs from the Node's addresses).
func csrPEM(t testing.TB, key crypto.Signer, mutate func(*x509.CertificateRequest)) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:cp1", Organization: []string{"system:nodes"}},
		DNSNames:    []string{"cp1"},
		IPAddresses: []net.IP{net.ParseIP("10.100.0.11")},
	}
	if mutate != nil {
		mutate(tmpl)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func labInventory() Inventory {
	return Inventory{
		"cp1": {Name: "cp1", Provisioned: true, Hostnames: []string{"cp1.lab.example"},
			Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.11"), netip.MustParseAddr("10.200.0.11")}},
		"w1":    {Name: "w1", Provisioned: true, Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.21")}},
		"spare": {Name: "spare", Provisioned: false, Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.31")}},
	}
}

func TestDecide(t *testing.T) {
	serving := []string{UsageDigitalSignature, UsageKeyEncipherment, UsageServerAuth}
	node := func(name string) (string, []string) {
		return "system:node:" + name, []string{"system:nodes", "system:authenticated"}
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	good := csrPEM(t, testKey, nil)
	// The same request with one bit of its signature flipped: it parses, its signature fails.
	block, _ := pem.Decode(good)
	der := append([]byte{}, block.Bytes...)
	der[len(der)-1] ^= 1
	tampered := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	cases := []struct {
		name    string
		req     func() Request
		verdict Verdict
		// want are substrings of the message (each mismatch must be named).
		want []string
	}{
		{"approve: name and control-plane address", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, good}
		}, Approve, []string{"inventory node cp1 approved", "cp1, 10.100.0.11"}},
		{"approve: ECDSA usages without key encipherment, both addresses, configured hostname", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, []string{UsageServerAuth, UsageDigitalSignature}, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.DNSNames = []string{"cp1", "cp1.lab.example"}
				c.IPAddresses = []net.IP{net.ParseIP("10.100.0.11"), net.ParseIP("10.200.0.11")}
			})}
		}, Approve, nil},
		{"approve: RSA key, IP SAN only", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, rsaKey, func(c *x509.CertificateRequest) { c.DNSNames = nil })}
		}, Approve, nil},
		{"approve: worker", func() Request {
			u, g := node("w1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.Subject.CommonName, c.DNSNames, c.IPAddresses = "system:node:w1", []string{"w1"}, []net.IP{net.ParseIP("10.100.0.21")}
			})}
		}, Approve, nil},
		{"ignore: client signer", func() Request {
			u, g := node("cp1")
			return Request{"kubernetes.io/kube-apiserver-client-kubelet", u, g, []string{UsageDigitalSignature, "client auth"}, good}
		}, Ignore, []string{"not kubernetes.io/kubelet-serving"}},
		{"ignore: custom signer", func() Request {
			return Request{"example.com/anything", "alice", nil, nil, nil}
		}, Ignore, nil},
		{"deny: foreign IP SAN", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.IPAddresses = append(c.IPAddresses, net.ParseIP("10.100.0.21"))
			})}
		}, Deny, []string{"IP SAN 10.100.0.21 is not an address of node cp1"}},
		{"deny: foreign DNS SAN", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.DNSNames = []string{"cp1", "kubernetes.default.svc"}
			})}
		}, Deny, []string{`DNS SAN "kubernetes.default.svc" is not node cp1's name`}},
		{"deny: IPv6 SAN not in the inventory", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.IPAddresses = []net.IP{net.ParseIP("fd00::11")}
			})}
		}, Deny, []string{"IP SAN fd00::11 is not an address of node cp1"}},
		{"deny: unknown node", func() Request {
			u, g := node("intruder")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.Subject.CommonName, c.DNSNames = "system:node:intruder", []string{"intruder"}
			})}
		}, Deny, []string{`node "intruder" is not in the inventory (nodes[])`}},
		{"deny: inventory node the appliance did not provision", func() Request {
			u, g := node("spare")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.Subject.CommonName, c.DNSNames, c.IPAddresses = "system:node:spare", []string{"spare"}, []net.IP{net.ParseIP("10.100.0.31")}
			})}
		}, Deny, []string{`node "spare" was not provisioned by this appliance`}},
		{"deny: node asks for another node's certificate", func() Request {
			u, g := node("w1")
			return Request{SignerKubeletServing, u, g, serving, good}
		}, Deny, []string{`subject CN "system:node:cp1" is not system:node:w1`, `DNS SAN "cp1" is not node w1's name`, "IP SAN 10.100.0.11 is not an address of node w1"}},
		{"deny: requestor is not a node", func() Request {
			return Request{SignerKubeletServing, "kubernetes-admin", []string{"system:masters", "system:authenticated"}, serving, good}
		}, Deny, []string{`requestor "kubernetes-admin" is not a node`, "lack system:nodes"}},
		{"deny: node user without the nodes group", func() Request {
			return Request{SignerKubeletServing, "system:node:cp1", []string{"system:authenticated"}, serving, good}
		}, Deny, []string{"lack system:nodes"}},
		{"deny: wrong organization", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.Subject.Organization = []string{"system:nodes", "system:masters"}
			})}
		}, Deny, []string{`subject O ["system:nodes" "system:masters"] is not [system:nodes]`}},
		{"deny: extra subject attribute", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.Subject.ExtraNames = []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{2, 5, 4, 11}, Value: "ops"}}
			})}
		}, Deny, []string{"has attributes besides CN and O"}},
		{"deny: client auth usage", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, append(serving, "client auth"), good}
		}, Deny, []string{`extra ["client auth"]`}},
		{"deny: missing server auth", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, []string{UsageDigitalSignature, UsageKeyEncipherment}, good}
		}, Deny, []string{`missing ["server auth"]`}},
		{"deny: no SANs", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) { c.DNSNames, c.IPAddresses = nil, nil })}
		}, Deny, []string{"no DNS or IP subject alternative name"}},
		{"deny: e-mail and URI SANs", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, csrPEM(t, testKey, func(c *x509.CertificateRequest) {
				c.EmailAddresses = []string{"root@cp1"}
				c.URIs = []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/x"}}
			})}
		}, Deny, []string{`e-mail SANs ["root@cp1"]`, `URI SANs ["spiffe://cluster.local/ns/x"]`}},
		{"deny: not PEM", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, []byte("hello")}
		}, Deny, []string{"not a PEM CERTIFICATE REQUEST block"}},
		{"deny: a certificate instead of a request", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, []byte(strings.ReplaceAll(string(good), "CERTIFICATE REQUEST", "CERTIFICATE"))}
		}, Deny, []string{"not a PEM CERTIFICATE REQUEST block"}},
		{"deny: two blocks", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, append(append([]byte{}, good...), good...)}
		}, Deny, []string{"data after its CERTIFICATE REQUEST block"}},
		{"deny: bad signature", func() Request {
			u, g := node("cp1")
			return Request{SignerKubeletServing, u, g, serving, tampered}
		}, Deny, []string{"spec.request signature does not verify"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(labInventory(), tc.req())
			if d.Verdict != tc.verdict {
				t.Fatalf("verdict %v, want %v (message %q)", d.Verdict, tc.verdict, d.Message)
			}
			for _, w := range tc.want {
				if !strings.Contains(d.Message, w) {
					t.Errorf("message %q lacks %q", d.Message, w)
				}
			}
			wantReason := map[Verdict]string{Approve: "AutoApproved", Deny: "AutoDenied", Ignore: ""}[tc.verdict]
			if d.Reason() != wantReason {
				t.Errorf("reason %q, want %q", d.Reason(), wantReason)
			}
		})
	}
}

// FuzzDecide: the rule never panics on a request body, and approves nothing it did not parse.
func FuzzDecide(f *testing.F) {
	f.Add(csrPEM(f, testKey, nil))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d := Decide(labInventory(), Request{SignerKubeletServing, "system:node:cp1", []string{"system:nodes"},
			[]string{UsageDigitalSignature, UsageServerAuth}, b})
		if d.Verdict == Approve {
			if _, err := parse(b); err != nil {
				t.Fatalf("approved a request that does not parse: %v", err)
			}
		}
	})
}
