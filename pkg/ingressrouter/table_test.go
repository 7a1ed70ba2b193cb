package ingressrouter

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Object builders shared by the tests.

func pathType(t networkingv1.PathType) *networkingv1.PathType { return &t }

func svcBackend(name string) networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name, Port: networkingv1.ServiceBackendPort{Number: 80}}}
}

type pathSpec struct {
	path, typ, svc string
}

func ingressObj(ns, name string, created time.Time, class *string, def string, rules map[string][]pathSpec) *networkingv1.Ingress {
	in := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       networkingv1.IngressSpec{IngressClassName: class},
	}
	if def != "" {
		b := svcBackend(def)
		in.Spec.DefaultBackend = &b
	}
	hosts := make([]string, 0, len(rules))
	for h := range rules {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	for _, h := range hosts {
		r := networkingv1.IngressRule{Host: h, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
		for _, p := range rules[h] {
			r.HTTP.Paths = append(r.HTTP.Paths, networkingv1.HTTPIngressPath{Path: p.path, PathType: pathType(networkingv1.PathType(p.typ)), Backend: svcBackend(p.svc)})
		}
		in.Spec.Rules = append(in.Spec.Rules, r)
	}
	return in
}

func serviceObj(ns, name string, portName string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: portName, Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

type endpointSpec struct {
	addr  string
	ready *bool
}

func sliceObj(ns, name, svc, portName string, port int32, eps ...endpointSpec) *discoveryv1.EndpointSlice {
	tcp := corev1.ProtocolTCP
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &tcp}},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}})
	}
	return s
}

// TestLookup checks the Ingress spec's matching rules on one table: exact host before wildcard
// before no host, a wildcard covering exactly one label, longest path, Exact before Prefix,
// element-wise prefixes, the older Ingress on a tie, and both levels of defaultBackend.
func TestLookup(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	ings := []*networkingv1.Ingress{
		ingressObj("ns", "newer", t0.Add(time.Hour), nil, "", map[string][]pathSpec{
			"a.example.com": {{"/", "Prefix", "newer-root"}, {"/tie", "Prefix", "newer-tie"}},
		}),
		ingressObj("ns", "older", t0, nil, "older-default", map[string][]pathSpec{
			"a.example.com": {
				{"/", "Prefix", "a-root"}, {"/foo", "Prefix", "a-foo"}, {"/foo/bar", "ImplementationSpecific", "a-foobar"},
				{"/foo", "Exact", "a-foo-exact"}, {"/tie", "Prefix", "older-tie"}, {"/x/", "Prefix", "a-x"},
			},
			"*.example.com": {{"/", "Prefix", "wild"}},
			"":              {{"/any", "Prefix", "any-host"}},
		}),
		ingressObj("other", "hostonly", t0.Add(2*time.Hour), nil, "h-default", map[string][]pathSpec{
			"h.example.org": {{"/only", "Exact", "h-only"}},
		}),
	}
	tab := Build(ings, nil, nil, nil)
	for _, c := range []struct{ host, path, want string }{
		{"a.example.com", "/", "a-root"},
		{"A.Example.COM:80", "/", "a-root"}, // case and port do not matter
		{"a.example.com.", "/", "a-root"},   // nor a trailing dot
		{"a.example.com", "/foo", "a-foo-exact"},
		{"a.example.com", "/foo/", "a-foo"},
		{"a.example.com", "/foo/baz", "a-foo"},
		{"a.example.com", "/foobar", "a-root"}, // element-wise: /foo is no prefix of /foobar
		{"a.example.com", "/foo/bar", "a-foobar"},
		{"a.example.com", "/foo/bar/baz", "a-foobar"},
		{"a.example.com", "/tie", "older-tie"}, // same path in two Ingresses: the older wins
		{"a.example.com", "/x", "a-x"},         // trailing slash of the rule ignored
		{"a.example.com", "", "a-root"},
		{"b.example.com", "/anything", "wild"},
		{"c.b.example.com", "/", "older-default"}, // a wildcard covers one label only
		{"example.com", "/", "older-default"},
		{"unknown.test", "/any/thing", "any-host"},
		{"h.example.org", "/only", "h-only"},
		{"h.example.org", "/other", "h-default"}, // the host's own Ingress's defaultBackend
		{"unknown.test", "/", "older-default"},   // the oldest defaultBackend
	} {
		b := tab.Lookup(c.host, c.path)
		if b == nil || b.Service != c.want {
			got := "<nil>"
			if b != nil {
				got = b.Service
			}
			t.Errorf("Lookup(%q, %q) = %s, want %s", c.host, c.path, got, c.want)
		}
	}
	// Without any defaultBackend, what matches nothing is nil (404).
	tab = Build(ings[:1], nil, nil, nil)
	if b := tab.Lookup("nothing.test", "/"); b != nil {
		t.Errorf("Lookup of an unknown host = %s, want nil", b.Service)
	}
	if b := (*Table)(nil).Lookup("a", "/"); b != nil {
		t.Error("nil table matched")
	}
}

// TestEndpoints checks the resolution of a backend to ready addresses: service port by number or
// name, the slices' port of the same name, ready true or unset, several slices, and nothing for a
// missing Service, an ExternalName Service or an unknown port.
func TestEndpoints(t *testing.T) {
	yes, no := true, false
	svc := serviceObj("ns", "web", "http")
	sl := []*discoveryv1.EndpointSlice{
		sliceObj("ns", "web-1", "web", "http", 8080, endpointSpec{"10.0.0.2", &yes}, endpointSpec{"10.0.0.1", nil}, endpointSpec{"10.0.0.3", &no}),
		sliceObj("ns", "web-2", "web", "http", 8081, endpointSpec{"10.0.0.4", &yes}),
		sliceObj("ns", "web-3", "web", "metrics", 9090, endpointSpec{"10.0.0.5", &yes}),
		sliceObj("ns", "other", "other", "http", 8080, endpointSpec{"10.0.0.6", &yes}),
	}
	want := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.4:8081"}
	for _, c := range []struct {
		name string
		svc  *corev1.Service
		port networkingv1.ServiceBackendPort
		want []string
	}{
		{"by number", svc, networkingv1.ServiceBackendPort{Number: 80}, want},
		{"by name", svc, networkingv1.ServiceBackendPort{Name: "http"}, want},
		{"unknown number", svc, networkingv1.ServiceBackendPort{Number: 81}, nil},
		{"unknown name", svc, networkingv1.ServiceBackendPort{Name: "https"}, nil},
		{"no service", nil, networkingv1.ServiceBackendPort{Number: 80}, nil},
		{"external name", &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, Ports: svc.Spec.Ports}}, networkingv1.ServiceBackendPort{Number: 80}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := endpoints(c.svc, c.port, sl[:3]); !slices.Equal(got, c.want) {
				t.Errorf("endpoints = %v, want %v", got, c.want)
			}
		})
	}
	// Through Build, slices are matched to their Service by the kubernetes.io/service-name label.
	in := ingressObj("ns", "i", time.Time{}, nil, "web", nil)
	b := Build([]*networkingv1.Ingress{in}, []*corev1.Service{svc}, sl, nil).Lookup("x", "/")
	if b == nil || !slices.Equal(b.Endpoints, want) {
		t.Errorf("Build: backend %+v, want endpoints %v", b, want)
	}
}

// TestRoundRobinSurvivesRebuild checks that an unchanged backend keeps its rotation across a
// rebuild (every rebuild would otherwise send the next request to the first endpoint).
func TestRoundRobinSurvivesRebuild(t *testing.T) {
	svc := serviceObj("ns", "web", "http")
	sl := []*discoveryv1.EndpointSlice{sliceObj("ns", "web-1", "web", "http", 80, endpointSpec{"10.0.0.1", nil}, endpointSpec{"10.0.0.2", nil})}
	in := []*networkingv1.Ingress{ingressObj("ns", "i", time.Time{}, nil, "web", nil)}
	t1 := Build(in, []*corev1.Service{svc}, sl, nil)
	b1 := t1.Lookup("x", "/")
	first := b1.Endpoints[b1.start()]
	b2 := Build(in, []*corev1.Service{svc}, sl, t1).Lookup("x", "/")
	if second := b2.Endpoints[b2.start()]; second == first {
		t.Errorf("after a rebuild the rotation restarted: %s twice", first)
	}
}

// FuzzLookup feeds client-controlled Host headers and paths to a table with every kind of rule:
// no panic, and a backend only from the table (exact host "a.example.com" answers its own).
func FuzzLookup(f *testing.F) {
	for _, s := range [][2]string{{"a.example.com", "/foo/bar"}, {"x.example.com:8080", "//"}, {"[::1]:80", ""}, {".", "/%2F"}, {"*.example.com", "/foo/"}} {
		f.Add(s[0], s[1])
	}
	tab := Build([]*networkingv1.Ingress{ingressObj("ns", "i", time.Time{}, nil, "def", map[string][]pathSpec{
		"a.example.com": {{"/foo", "Exact", "exact"}, {"/foo/", "Prefix", "prefix"}, {"/", "ImplementationSpecific", "root"}},
		"*.example.com": {{"/", "Prefix", "wild"}},
		"":              {{"/any", "Prefix", "any"}},
	})}, nil, nil, nil)
	f.Fuzz(func(t *testing.T, host, path string) {
		b := tab.Lookup(host, path)
		if b == nil {
			t.Fatalf("Lookup(%q, %q) = nil despite a defaultBackend", host, path)
		}
		if normalizeHost(host) == "a.example.com" && b.Service != "exact" && b.Service != "prefix" && b.Service != "root" {
			t.Errorf("Lookup(%q, %q) = %s, want a route of a.example.com", host, path, b.Service)
		}
	})
}
