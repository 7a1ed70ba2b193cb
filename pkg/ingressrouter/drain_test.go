package ingressrouter

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/rest"
)

// TestDrain: once Serve's context ends, the health endpoint answers 503 "draining" while requests
// are still proxied to a real backend, until the drain ends (here: the test closes the proxy's
// listener, so nothing waits on the hour-long DrainDelay); Serve then returns nil. The API server
// is a refused port on purpose: the controller never syncs, the table is set by the test.
func TestDrain(t *testing.T) {
	be := startBackend(t, "one")
	cfg := &rest.Config{Host: fmt.Sprintf("http://127.0.0.1:%d", refusedPort(t))}
	c, err := NewController(cfg, Options{DrainDelay: time.Hour, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c.Proxy().SetTable(Build(
		[]*networkingv1.Ingress{ingressObj("ns", "i", time.Time{}, nil, "web", nil)},
		[]*corev1.Service{serviceObj("ns", "web", "http")},
		[]*discoveryv1.EndpointSlice{sliceObj("ns", "web-1", "web", "http", int32(be.addrPort().Port()), endpointSpec{"127.0.0.1", nil})}, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- c.Serve(ctx, ln, hln, nil) }()
	health := func() string {
		resp, err := http.Get("http://" + hln.Addr().String() + HealthPath)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if got := health(); got != "503 not synced with the API server yet" {
		t.Errorf("health before sync: %q", got)
	}
	cancel()
	eventually(t, "health says draining", func() error {
		if got := health(); got != "503 draining: the router is stopping" {
			return fmt.Errorf("health %q", got)
		}
		return nil
	})
	if code, got := get(t, "http://"+ln.Addr().String(), "any.test", "/", ""); code != http.StatusOK || !strings.HasPrefix(got, "one ") {
		t.Errorf("request while draining: %d %q, want 200 from the backend", code, got)
	}
	ln.Close()
	if err := <-served; err != nil {
		t.Errorf("Serve after the drain: %v", err)
	}
}
