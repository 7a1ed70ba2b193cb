package ingressrouter

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// BenchmarkProxy measures a GET through the router (Proxy, keep-alive to two real HTTP backends on
// 127.0.0.1, round robin) against the same GET sent directly to a backend, alternating the two in
// each iteration so both see the same machine load. It reports direct-ns/op, proxied-ns/op and
// ratio = proxied/direct (the router's cost as a multiple of a direct request).
func BenchmarkProxy(b *testing.B) {
	one, two := startBackend(b, "one"), startBackend(b, "two")
	slices := []*discoveryv1.EndpointSlice{
		sliceObj("ns", "web-1", "web", "http", int32(one.addrPort().Port()), endpointSpec{"127.0.0.1", nil}),
		sliceObj("ns", "web-2", "web", "http", int32(two.addrPort().Port()), endpointSpec{"127.0.0.1", nil}),
	}
	ings := []*networkingv1.Ingress{ingressObj("ns", "i", time.Time{}, nil, "", map[string][]pathSpec{
		"web.apps.test": {{"/", "Prefix", "web"}},
	})}
	p := NewProxy(nil)
	p.SetTable(Build(ings, []*corev1.Service{serviceObj("ns", "web", "http")}, slices, nil))
	front := httptest.NewServer(p)
	b.Cleanup(front.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	do := func(url string) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Host = "web.apps.test"
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
	}
	do(one.srv.URL + "/")
	do(front.URL + "/")
	var direct, proxied time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		do(one.srv.URL + "/")
		t1 := time.Now()
		do(front.URL + "/")
		direct += t1.Sub(t0)
		proxied += time.Since(t1)
	}
	b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/op")
	b.ReportMetric(float64(proxied.Nanoseconds())/float64(b.N), "proxied-ns/op")
	b.ReportMetric(float64(proxied)/float64(direct), "ratio")
}
