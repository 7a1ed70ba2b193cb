package hostagent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"
)

// CheckAPI GETs url (an https /readyz of this node's kube-apiserver, open to anonymous clients by
// kubeadm's default RBAC) and succeeds when it answers 200 "ok" within 2 s. It does not verify the certificate: it is a liveness probe of the local API (the
// keepalived track script, like kubeadm's keepalived guides' `curl -k`), not a trust decision.
func CheckAPI(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Proxy: nil} //nolint:gosec // liveness probe only
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "ok" {
		return fmt.Errorf("%s: HTTP %d %q", url, resp.StatusCode, b)
	}
	return nil
}

// checkInNS runs CheckAPI from the agent's namespace (127.0.0.1 there).
func (a *Agent) checkInNS(ctx context.Context, url string) error {
	if a.nsPath() == "" {
		return CheckAPI(ctx, url)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := setNS(a.nsPath()); err != nil {
			errc <- err
			return
		}
		errc <- CheckAPI(ctx, url)
	}()
	return <-errc
}

func setNS(nsPath string) error {
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", nsPath, err)
	}
	return nil
}
