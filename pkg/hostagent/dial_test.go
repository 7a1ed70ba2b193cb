package hostagent

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestWithLocalAddr: a Client's requests and FetchCA's connection leave from the address
// WithLocalAddr sets (127.0.0.0/8 is local on Linux: no setup), and from the kernel's choice
// without it. A real TLS server records each request's source.
func TestWithLocalAddr(t *testing.T) {
	var mu sync.Mutex
	var sources []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		mu.Lock()
		sources = append(sources, host)
		mu.Unlock()
		http.Error(w, "no config here", http.StatusNotFound)
	}))
	defer srv.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(sources) == 0 {
			return ""
		}
		return sources[len(sources)-1]
	}

	for _, tc := range []struct{ name, from, want string }{
		{"default", "", "127.0.0.1"},
		{"127.0.0.7", "127.0.0.7", "127.0.0.7"},
		{"127.0.0.8", "127.0.0.8", "127.0.0.8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.from != "" {
				ctx = WithLocalAddr(ctx, netip.MustParseAddr(tc.from))
			}
			c, err := NewClient(srv.URL, caPEM, "token", "boot")
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.NodeConfig(ctx); err == nil {
				t.Fatal("NodeConfig: want the server's 404 as an error")
			}
			if got := last(); got != tc.want {
				t.Errorf("Client request came from %q, want %q", got, tc.want)
			}
			// FetchCA: this server answers 404 for the CA; the request still went out.
			if _, err := FetchCA(ctx, srv.URL, agentapi.PinOf(srv.Certificate())); err == nil {
				t.Fatal("FetchCA: want the server's 404 as an error")
			}
			if got := last(); got != tc.want {
				t.Errorf("FetchCA request came from %q, want %q", got, tc.want)
			}
		})
	}
}
