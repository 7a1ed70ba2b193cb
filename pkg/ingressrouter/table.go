package ingressrouter

import (
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Backend is where a matched request goes: a Service port and the ready endpoints behind it.
type Backend struct {
	// Namespace, Service and Port name the Ingress backend (spec.rules[].http.paths[].backend.service
	// or spec.defaultBackend.service); Port is the service port's number or name as the Ingress
	// gives it.
	Namespace, Service, Port string
	// Endpoints are the ready endpoint addresses ("ip:port", the EndpointSlices' first address of
	// each endpoint whose conditions.ready is true or unset, with the slice port named as the
	// service port), sorted. Empty: the router answers 503.
	Endpoints []string
	// next is the round-robin cursor over Endpoints.
	next atomic.Uint32
}

// start returns the index of the endpoint to try first (round robin).
func (b *Backend) start() int {
	return int(b.next.Add(1)-1) % len(b.Endpoints)
}

// route is one path of one Ingress rule.
type route struct {
	path     string // as written, "" = "/"
	exact    bool   // pathType Exact; Prefix and ImplementationSpecific are both prefixes here
	segments int    // number of non-empty '/' elements of path: the match length
	backend  *Backend
	order    int // rank of the Ingress (oldest first): the tie-breaker between Ingresses
}

// hostRoutes are the routes of one host name (or of the rules without a host) and the
// defaultBackend of the oldest Ingress that has a rule for it.
type hostRoutes struct {
	routes   []route
	fallback *Backend
}

// Table is an immutable routing table built by Build.
type Table struct {
	exact    map[string]*hostRoutes // lower-case host
	wildcard map[string]*hostRoutes // "*.example.com" stored under "example.com"
	anyHost  *hostRoutes            // rules without host
	fallback *Backend               // defaultBackend of the oldest Ingress that has one
}

// Lookup returns the backend of a request for host (the Host header; a port is ignored, case is
// not significant) and path (the URL path), per the Ingress spec (networking.k8s.io/v1): a host
// matches a rule's exact host first, then a wildcard "*.suffix" matching exactly one more label,
// then rules without a host; within the host the longest matching path wins, Exact before Prefix
// at equal length, then the older Ingress. A Prefix path matches element-wise on '/' ("/foo"
// matches "/foo" and "/foo/bar", not "/foobar"); ImplementationSpecific is treated as Prefix. When
// the host matches rules but no path, the defaultBackend of the oldest Ingress holding rules for
// that host answers, then the oldest Ingress's defaultBackend of all. nil: nothing matches (404).
func (t *Table) Lookup(host, path string) *Backend {
	if t == nil {
		return nil
	}
	host = normalizeHost(host)
	var hrs []*hostRoutes
	if hr := t.exact[host]; hr != nil {
		hrs = append(hrs, hr)
	}
	if i := strings.IndexByte(host, '.'); i > 0 {
		if hr := t.wildcard[host[i+1:]]; hr != nil {
			hrs = append(hrs, hr)
		}
	}
	if t.anyHost != nil {
		hrs = append(hrs, t.anyHost)
	}
	for _, hr := range hrs {
		if b := hr.match(path); b != nil {
			return b
		}
	}
	for _, hr := range hrs {
		if hr.fallback != nil {
			return hr.fallback
		}
	}
	return t.fallback
}

// match returns the backend of the best route for path (routes are sorted best first).
func (hr *hostRoutes) match(path string) *Backend {
	if path == "" {
		path = "/"
	}
	for _, r := range hr.routes {
		if r.exact {
			if path == r.path {
				return r.backend
			}
			continue
		}
		if prefixMatch(r.path, path) {
			return r.backend
		}
	}
	return nil
}

// prefixMatch is the Ingress spec's Prefix match: p's '/'-separated elements are a prefix of
// path's, trailing slashes ignored.
func prefixMatch(p, path string) bool {
	p = strings.TrimRight(p, "/")
	if p == "" {
		return true
	}
	if !strings.HasPrefix(path, p) {
		return false
	}
	return len(path) == len(p) || path[len(p)] == '/'
}

func normalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

func segments(p string) int {
	n := 0
	for _, s := range strings.Split(p, "/") {
		if s != "" {
			n++
		}
	}
	return n
}

// Build makes the routing table of the Ingresses (already filtered to the served IngressClasses)
// from the Services and EndpointSlices of their namespaces. Ingresses are ranked oldest first
// (creationTimestamp, then namespace/name), which decides between equal routes. Resource backends
// (spec...backend.resource) are not routed. previous, when not nil, lends its round-robin cursors
// to backends that did not change, so a rebuild does not restart every rotation.
func Build(ingresses []*networkingv1.Ingress, services []*corev1.Service, slices []*discoveryv1.EndpointSlice, previous *Table) *Table {
	ing := append([]*networkingv1.Ingress(nil), ingresses...)
	sortIngresses(ing)
	svcs := map[string]*corev1.Service{}
	for _, s := range services {
		svcs[s.Namespace+"/"+s.Name] = s
	}
	slicesBySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range slices {
		if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
			k := s.Namespace + "/" + name
			slicesBySvc[k] = append(slicesBySvc[k], s)
		}
	}
	old := map[string]*Backend{}
	if previous != nil {
		previous.each(func(b *Backend) { old[b.key()] = b })
	}
	backends := map[string]*Backend{}
	backend := func(ns string, sb *networkingv1.IngressServiceBackend) *Backend {
		if sb == nil {
			return nil
		}
		port := sb.Port.Name
		if port == "" {
			port = strconv.Itoa(int(sb.Port.Number))
		}
		b := &Backend{Namespace: ns, Service: sb.Name, Port: port}
		b.Endpoints = endpoints(svcs[ns+"/"+sb.Name], sb.Port, slicesBySvc[ns+"/"+sb.Name])
		if have := backends[b.key()]; have != nil {
			return have
		}
		if o := old[b.key()]; o != nil {
			b.next.Store(o.next.Load())
		}
		backends[b.key()] = b
		return b
	}
	t := &Table{exact: map[string]*hostRoutes{}, wildcard: map[string]*hostRoutes{}}
	for rank, in := range ing {
		var def *Backend
		if in.Spec.DefaultBackend != nil {
			def = backend(in.Namespace, in.Spec.DefaultBackend.Service)
		}
		if t.fallback == nil {
			t.fallback = def
		}
		for _, rule := range in.Spec.Rules {
			var hr *hostRoutes
			h := strings.ToLower(rule.Host)
			switch {
			case h == "":
				if t.anyHost == nil {
					t.anyHost = &hostRoutes{}
				}
				hr = t.anyHost
			case strings.HasPrefix(h, "*."):
				if hr = t.wildcard[h[2:]]; hr == nil {
					hr = &hostRoutes{}
					t.wildcard[h[2:]] = hr
				}
			default:
				if hr = t.exact[h]; hr == nil {
					hr = &hostRoutes{}
					t.exact[h] = hr
				}
			}
			if hr.fallback == nil {
				hr.fallback = def
			}
			if rule.HTTP == nil {
				continue
			}
			for _, p := range rule.HTTP.Paths {
				b := backend(in.Namespace, p.Backend.Service)
				if b == nil {
					continue
				}
				path := p.Path
				if path == "" {
					path = "/"
				}
				exact := p.PathType != nil && *p.PathType == networkingv1.PathTypeExact
				hr.routes = append(hr.routes, route{path: path, exact: exact, segments: segments(path), backend: b, order: rank})
			}
		}
	}
	sortRoutes := func(hr *hostRoutes) {
		sort.SliceStable(hr.routes, func(i, j int) bool {
			a, b := hr.routes[i], hr.routes[j]
			if a.segments != b.segments {
				return a.segments > b.segments
			}
			if a.exact != b.exact {
				return a.exact
			}
			return a.order < b.order
		})
	}
	for _, hr := range t.exact {
		sortRoutes(hr)
	}
	for _, hr := range t.wildcard {
		sortRoutes(hr)
	}
	if t.anyHost != nil {
		sortRoutes(t.anyHost)
	}
	return t
}

// sortIngresses ranks Ingresses oldest first (creationTimestamp, then namespace/name).
func sortIngresses(ing []*networkingv1.Ingress) {
	sort.SliceStable(ing, func(i, j int) bool {
		a, b := ing[i], ing[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
}

func (b *Backend) key() string {
	return b.Namespace + "/" + b.Service + ":" + b.Port + "=" + strings.Join(b.Endpoints, ",")
}

// each calls f for every backend of the table (a backend may be seen more than once).
func (t *Table) each(f func(*Backend)) {
	visit := func(hr *hostRoutes) {
		if hr == nil {
			return
		}
		for _, r := range hr.routes {
			f(r.backend)
		}
		if hr.fallback != nil {
			f(hr.fallback)
		}
	}
	for _, hr := range t.exact {
		visit(hr)
	}
	for _, hr := range t.wildcard {
		visit(hr)
	}
	visit(t.anyHost)
	if t.fallback != nil {
		f(t.fallback)
	}
}

// endpoints resolves an Ingress service backend port to the service port, and that to the
// EndpointSlices' port of the same name (EndpointSlice ports carry the service port's name), and
// returns the ready addresses with that port. A missing Service, an ExternalName Service or an
// unknown port give none.
func endpoints(svc *corev1.Service, port networkingv1.ServiceBackendPort, slices []*discoveryv1.EndpointSlice) []string {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if (port.Name != "" && p.Name == port.Name) || (port.Name == "" && p.Port == port.Number) {
			sp = p
			break
		}
	}
	if sp == nil || (sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP) {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var num int32 = -1
		for _, p := range s.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == sp.Name && p.Port != nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
				num = *p.Port
				break
			}
		}
		if num < 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 || (e.Conditions.Ready != nil && !*e.Conditions.Ready) {
				continue
			}
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				continue
			}
			ap := netip.AddrPortFrom(a, uint16(num)).String()
			if !seen[ap] {
				seen[ap] = true
				out = append(out, ap)
			}
		}
	}
	sort.Strings(out)
	return out
}
