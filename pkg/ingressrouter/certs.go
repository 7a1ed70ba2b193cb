package ingressrouter

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// ErrNoCertificate is GetCertificate's error for a server name (SNI) no served Ingress has a
// certificate for: the TLS handshake fails with an alert (there is no default certificate).
var ErrNoCertificate = errors.New("no certificate for this server name")

// Certificates maps TLS server names to the certificates of the served Ingresses' spec.tls: each
// entry's hosts (exact, or "*." wildcards of one label) to the kubernetes.io/tls Secret secretName
// of the Ingress's namespace (tls.crt: PEM chain, tls.key: PEM key). Immutable once built.
type Certificates struct {
	byHost map[string]*tls.Certificate // lower-case host or "*.suffix"
}

// BuildCertificates makes the server-name map of ingresses (oldest first decides a host claimed
// twice, as in Build) from secrets. It returns the problems it skipped, one per Ingress TLS entry
// (a missing Secret, a Secret of another type, a key pair that does not parse), each naming the
// Ingress and the Secret.
func BuildCertificates(ingresses []*networkingv1.Ingress, secrets []*corev1.Secret) (*Certificates, []error) {
	ing := append([]*networkingv1.Ingress(nil), ingresses...)
	sortIngresses(ing)
	byName := map[string]*corev1.Secret{}
	for _, s := range secrets {
		byName[s.Namespace+"/"+s.Name] = s
	}
	parsed := map[string]*tls.Certificate{}
	c := &Certificates{byHost: map[string]*tls.Certificate{}}
	var problems []error
	for _, in := range ing {
		for i, t := range in.Spec.TLS {
			if t.SecretName == "" || len(t.Hosts) == 0 {
				continue // a TLS entry without a Secret or without hosts: nothing to serve
			}
			key := in.Namespace + "/" + t.SecretName
			cert, ok := parsed[key]
			if !ok {
				var err error
				cert, err = keyPair(byName[key])
				if err != nil {
					problems = append(problems, fmt.Errorf("ingress %s/%s spec.tls[%d].secretName %q: %w", in.Namespace, in.Name, i, t.SecretName, err))
				}
				parsed[key] = cert
			}
			if cert == nil {
				continue
			}
			for _, h := range t.Hosts {
				h = strings.ToLower(h)
				if _, taken := c.byHost[h]; !taken {
					c.byHost[h] = cert
				}
			}
		}
	}
	return c, problems
}

func keyPair(s *corev1.Secret) (*tls.Certificate, error) {
	switch {
	case s == nil:
		return nil, errors.New("no such Secret")
	case s.Type != corev1.SecretTypeTLS:
		return nil, fmt.Errorf("Secret of type %q, want %q", s.Type, corev1.SecretTypeTLS)
	}
	cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("tls.crt and tls.key: %w", err)
	}
	return &cert, nil
}

// Hosts returns the server names that have a certificate, sorted.
func (c *Certificates) Hosts() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.byHost))
	for h := range c.byHost {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// Get returns the certificate of a TLS server name: the exact host, else the "*." wildcard of its
// parent domain; ErrNoCertificate for none (or an empty server name: clients that send no SNI).
func (c *Certificates) Get(serverName string) (*tls.Certificate, error) {
	name := strings.ToLower(strings.TrimSuffix(serverName, "."))
	if c != nil && name != "" {
		if cert := c.byHost[name]; cert != nil {
			return cert, nil
		}
		if i := strings.IndexByte(name, '.'); i > 0 {
			if cert := c.byHost["*"+name[i:]]; cert != nil {
				return cert, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNoCertificate, serverName)
}
