package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/registry"
)

// ignitionAccept is what Ignition 2.14 (Debian 12) sends.
const ignitionAccept = "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"

// Endpoint names of the figures, in table order.
const (
	epCA       = "ca.crt"
	epIgnition = "ignition"
	epConfig   = "agent config"
	epReport   = "agent report"
	epPing     = "v2 ping"
	epManifest = "v2 manifest"
	epBlob     = "v2 blob"
)

var endpoints = []string{epCA, epIgnition, epConfig, epReport, epPing, epManifest, epBlob}

// cadence is a simulated node's timing.
type cadence struct {
	step, resync, uptime, ramp time.Duration
}

// stats collects latencies (to the complete answer, or to the response headers for /v2/) and
// errors per endpoint. An error is any failed attempt: transport error, or an answer other than the
// endpoint's success status.
type stats struct {
	mu      sync.Mutex
	lat     map[string][]time.Duration
	errs    map[string]int
	lastErr map[string]string
	bytes   int64
}

func newStats() *stats {
	return &stats{lat: map[string][]time.Duration{}, errs: map[string]int{}, lastErr: map[string]string{}}
}

func (s *stats) observe(ep string, d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs[ep]++
		s.lastErr[ep] = err.Error()
		return
	}
	s.lat[ep] = append(s.lat[ep], d)
}

// timed runs f, recording it under ep unless ctx ended meanwhile (the run's end is not an error).
func (s *stats) timed(ctx context.Context, ep string, f func() error) error {
	start := time.Now()
	err := f()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.observe(ep, time.Since(start), err)
	return err
}

// EndpointFigures are one endpoint's figures of a run.
type EndpointFigures struct {
	Count   int     `json:"count"`
	P50ms   float64 `json:"p50ms"`
	P99ms   float64 `json:"p99ms"`
	Errors  int     `json:"errors"`
	LastErr string  `json:"lastError,omitempty"`
}

func (s *stats) figures() map[string]EndpointFigures {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]EndpointFigures{}
	for _, ep := range endpoints {
		l := slices.Clone(s.lat[ep])
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		f := EndpointFigures{Count: len(l), Errors: s.errs[ep], LastErr: s.lastErr[ep]}
		if len(l) > 0 {
			f.P50ms = ms(l[(len(l)-1)*50/100])
			f.P99ms = ms(l[(len(l)-1)*99/100])
		}
		out[ep] = f
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// simNode is one simulated node's identity, from its rendered hostagent.yaml.
type simNode struct {
	cfg agentapi.Configuration
	// addr is the node's control-plane address (simAddrs), which its connections come from: the
	// appliance limits connections per source address, and a real fleet has an address per node.
	// fleet-lab.sh makes simControlPlaneNet local in the bootstrap namespace (AnyIP).
	addr netip.Addr
	// acked are the sequence numbers of the reports the appliance acknowledged (204).
	acked []int
}

// loadNodes reads the rendered hostagent configuration of every node named prefix*.
func loadNodes(state, prefix string) ([]*simNode, error) {
	ents, err := os.ReadDir(statedir.Rendered(state))
	if err != nil {
		return nil, err
	}
	var out []*simNode
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(statedir.RenderedNode(state, e.Name()), statedir.AgentConfigFile))
		if err != nil {
			return nil, err
		}
		c, err := agentapi.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", e.Name(), err)
		}
		i, ok := simIndex(e.Name())
		if !ok {
			return nil, fmt.Errorf("node %s: not a simulated node's name (sim0001...)", e.Name())
		}
		addr, _ := simAddrs(i)
		out = append(out, &simNode{cfg: c, addr: addr})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no rendered node named %s* under %s", prefix, statedir.Rendered(state))
	}
	return out, nil
}

func newBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func jitter(d time.Duration) time.Duration { return d/2 + mrand.N(d+1) }

// retry runs f until it succeeds or ctx ends, waiting 250 ms doubling to 5 s between attempts
// (hostagent's reporter retries the same way, with its own bounds).
func retry(ctx context.Context, f func() error) error {
	wait := 250 * time.Millisecond
	for {
		err := f()
		if err == nil || ctx.Err() != nil || errors.Is(err, hostagent.ErrUnauthorized) {
			return err
		}
		if !sleep(ctx, jitter(wait)) {
			return ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// runNode simulates one node until ctx ends: boots, each running the plan once, then resyncs.
func runNode(ctx context.Context, n *simNode, c cadence, st *stats, reports *counter) {
	if !sleep(ctx, mrand.N(c.ramp+1)) {
		return
	}
	ctx = hostagent.WithLocalAddr(ctx, n.addr)
	dialer := &net.Dialer{Timeout: 30 * time.Second, LocalAddr: &net.TCPAddr{IP: n.addr.AsSlice()}}
	seq := 0
	for ctx.Err() == nil {
		boot := newBootID()
		var caPEM []byte
		if retry(ctx, func() error {
			return st.timed(ctx, epCA, func() (err error) {
				caPEM, err = hostagent.FetchCA(ctx, n.cfg.ApplianceURL, n.cfg.CAPin)
				return err
			})
		}) != nil {
			return
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		ig := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Proxy: nil, DialContext: dialer.DialContext}}
		if retry(ctx, func() error { return st.timed(ctx, epIgnition, func() error { return fetchIgnition(ctx, ig, n.cfg) }) }) != nil {
			return
		}
		ig.CloseIdleConnections()
		client, err := hostagent.NewClient(n.cfg.ApplianceURL, caPEM, n.cfg.Token, boot)
		if err != nil {
			st.observe(epCA, 0, err)
			return
		}
		var nc agentapi.NodeConfig
		if retry(ctx, func() error {
			return st.timed(ctx, epConfig, func() (err error) { nc, _, err = client.NodeConfig(ctx); return err })
		}) != nil {
			return
		}
		if nc.Node != n.cfg.Node {
			st.observe(epConfig, 0, fmt.Errorf("got the config of node %q, want %q", nc.Node, n.cfg.Node))
		}
		bootEnd := time.Now().Add(c.uptime)
		for _, step := range agentapi.Plan(nc) {
			for _, status := range []string{agentapi.StatusRunning, agentapi.StatusDone} {
				seq++
				r := agentapi.Report{BootID: boot, Step: step, Status: status, Detail: fmt.Sprintf("sim seq=%d", seq), Time: time.Now().UTC()}
				if retry(ctx, func() error { return st.timed(ctx, epReport, func() error { return client.Report(ctx, r) }) }) != nil {
					return
				}
				n.acked = append(n.acked, seq)
				reports.add(1)
				if status == agentapi.StatusRunning && !sleep(ctx, jitter(c.step)) {
					return
				}
			}
		}
		for time.Until(bootEnd) > 0 {
			if !sleep(ctx, min(jitter(c.resync), time.Until(bootEnd))) {
				return
			}
			if time.Until(bootEnd) <= 0 {
				break
			}
			_ = retry(ctx, func() error {
				return st.timed(ctx, epConfig, func() error { _, _, err := client.NodeConfig(ctx); return err })
			})
		}
	}
}

// fetchIgnition GETs the node's Ignition config as an enrolled node does (`hostagent enroll
// --ignition-out`: the token in the Authorization header, the only place /ignition/ takes it) and
// checks it is JSON.
func fetchIgnition(ctx context.Context, c *http.Client, cfg agentapi.Configuration) error {
	u := strings.TrimRight(cfg.ApplianceURL, "/") + "/ignition/" + cfg.Node
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", ignitionAccept)
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !json.Valid(b) {
		return fmt.Errorf("GET /ignition/%s: HTTP %d", cfg.Node, resp.StatusCode)
	}
	return nil
}

type counter struct {
	mu sync.Mutex
	n  int64
}

func (c *counter) add(d int64) { c.mu.Lock(); c.n += d; c.mu.Unlock() }
func (c *counter) get() int64  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// imageSet lists the bundle's images as the mirror serves them: repository:tag references on host.
func imageSet(bundleImages, host string) ([]name.Reference, error) {
	idx, err := layout.ImageIndexFromPath(bundleImages)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var refs []name.Reference
	for _, m := range im.Manifests {
		repo, tag, err := registry.RepositoryFor(m.Annotations[ocispec.AnnotationRefName])
		if err != nil {
			return nil, err
		}
		ref, err := name.ParseReference(host + "/" + repo + ":" + tag)
		if err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("%s lists no image", bundleImages)
	}
	return refs, nil
}

// timingTransport records every /v2/ request's time to response headers and the bytes read.
type timingTransport struct {
	base http.RoundTripper
	st   *stats
	ctx  context.Context
}

func (t timingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ep := epPing
	switch {
	case strings.Contains(req.URL.Path, "/manifests/"):
		ep = epManifest
	case strings.Contains(req.URL.Path, "/blobs/"):
		ep = epBlob
	}
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err == nil && resp.StatusCode >= 400 {
		err = fmt.Errorf("%s %s: HTTP %d", req.Method, req.URL.Path, resp.StatusCode)
	}
	// Not server errors, so not counted: a request its caller cancelled (the run ending, t.ctx, or
	// go-containerregistry dropping the ping it no longer needs), and go-containerregistry's plain-HTTP
	// ping, which it sends beside the HTTPS one to every RFC 1918 registry (name.Registry.Scheme) and
	// which Go's TLS server answers 400 (the "GET /v2/: HTTP 400" seen at N = 1000): the appliance
	// serves HTTPS only, and the pull goes on over HTTPS.
	if t.ctx.Err() == nil && req.Context().Err() == nil && req.URL.Scheme == "https" {
		t.st.observe(ep, time.Since(start), err)
	}
	if resp != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, st: t.st}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	st *stats
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.st.mu.Lock()
	b.st.bytes += int64(n)
	b.st.mu.Unlock()
	return n, err
}

// runPuller pulls the image set over and over until ctx ends: every platform's manifest, config and
// layers (go-containerregistry verifies each digest while reading).
func runPuller(ctx context.Context, refs []name.Reference, caPEM []byte, st *stats, pulls *counter) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := timingTransport{base: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Proxy: nil, ForceAttemptHTTP2: true}, st: st, ctx: ctx}
	opts := []remote.Option{remote.WithTransport(tr), remote.WithContext(ctx)}
	for ctx.Err() == nil {
		for _, ref := range refs {
			if err := pullImage(ref, opts); err != nil && ctx.Err() == nil {
				// The request that failed was counted by the transport; a digest mismatch was not.
				if !strings.Contains(err.Error(), "HTTP ") {
					st.observe(epBlob, 0, fmt.Errorf("pull %s: %w", ref, err))
				}
				sleep(ctx, time.Second)
			}
			if ctx.Err() != nil {
				return
			}
			pulls.add(1)
		}
	}
}

func pullImage(ref name.Reference, opts []remote.Option) error {
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return err
	}
	var imgs []v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return err
		}
		for _, m := range im.Manifests {
			img, err := idx.Image(m.Digest)
			if err != nil {
				return err
			}
			imgs = append(imgs, img)
		}
	} else {
		img, err := desc.Image()
		if err != nil {
			return err
		}
		imgs = append(imgs, img)
	}
	for _, img := range imgs {
		if _, err := img.RawConfigFile(); err != nil {
			return err
		}
		layers, err := img.Layers()
		if err != nil {
			return err
		}
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, rc)
			if cerr := rc.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
