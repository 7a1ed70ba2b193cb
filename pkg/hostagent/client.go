package hostagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// ErrUnauthorized is wrapped when the appliance refuses the node's token (HTTP 401): retrying will
// not help. The error carries the appliance's words: a wrong token, or one that was replaced (the
// node was reinstalled or enrolled again) or revoked (`appliance node revoke`). A node cannot get a
// new token by itself; only the appliance gives one (an enrolment after a power-on it made, or an
// install over SSH), so the agent stops and says so.
var ErrUnauthorized = errors.New("the appliance refused this node's token")

// maxRefusalText bounds the appliance's 401 text quoted in an error.
const maxRefusalText = 1024

// maxNodeConfigBytes bounds a node config download.
const maxNodeConfigBytes = 4 << 20

// Client talks to the appliance's agent API over HTTPS, trusting only the appliance CA.
type Client struct {
	base   string
	token  string
	bootID string
	hc     *http.Client

	mu   sync.Mutex
	etag string // of the last node config fetched (ETag header), for WaitConfig
}

// NewClient returns a client for applianceURL (https://host:port) that trusts only caPEM and sends
// token as its bearer token and bootID in agentapi.BootIDHeader. Errors: caPEM holds no
// certificate.
func NewClient(applianceURL string, caPEM []byte, token, bootID string) (*Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("appliance CA: no PEM certificate")
	}
	return &Client{base: strings.TrimRight(applianceURL, "/"), token: token, bootID: bootID, hc: pinnedClient(pool)}, nil
}

func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	data, _, err := c.doHeader(ctx, method, path, body)
	return data, err
}

// doHeader is do that also returns the response's header.
func (c *Client) doHeader(ctx context.Context, method, path string, body []byte) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if c.bootID != "" {
		req.Header.Set(agentapi.BootIDHeader, c.bootID)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeConfigBytes))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		words := strings.TrimSpace(string(data))
		if len(words) > maxRefusalText {
			words = words[:maxRefusalText] + "…"
		}
		return nil, nil, fmt.Errorf("%s %s: %w: %s", method, path, ErrUnauthorized, words)
	case resp.StatusCode >= 300:
		return nil, nil, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, resp.Header, nil
}

// NodeConfig fetches the node's configuration (GET agentapi.ConfigPathV1) and returns it with its
// raw JSON. Errors: ErrUnauthorized; HTTP and network errors; bad JSON.
func (c *Client) NodeConfig(ctx context.Context) (agentapi.NodeConfig, []byte, error) {
	data, h, err := c.doHeader(ctx, http.MethodGet, agentapi.ConfigPathV1, nil)
	if err != nil {
		return agentapi.NodeConfig{}, nil, err
	}
	nc, err := parseNodeConfig(data)
	if err == nil {
		c.mu.Lock()
		c.etag = h.Get("ETag")
		c.mu.Unlock()
	}
	return nc, data, err
}

// ErrNoWatch is returned by WaitConfig when there is nothing to watch: no config fetched yet, or the
// appliance sent no ETag with it (an appliance that predates the watch).
var ErrNoWatch = errors.New("no node config ETag to watch")

// WaitConfig watches the node's config (GET agentapi.ConfigPathV1?wait=ETAG, agentapi.ConfigWaitParam)
// from the last one NodeConfig fetched: it returns true as soon as the appliance serves another
// config, false when the appliance answered with the same one (after agentapi.ConfigWaitMax, or at
// once from an appliance that does not hold watches). It does not apply or cache what it received:
// the caller fetches with NodeConfig. Errors: ErrNoWatch; ErrUnauthorized; HTTP and network errors.
func (c *Client) WaitConfig(ctx context.Context) (changed bool, err error) {
	c.mu.Lock()
	etag := c.etag
	c.mu.Unlock()
	if etag == "" {
		return false, ErrNoWatch
	}
	_, h, err := c.doHeader(ctx, http.MethodGet, agentapi.ConfigPathV1+"?"+url.Values{agentapi.ConfigWaitParam: {etag}}.Encode(), nil)
	if err != nil {
		return false, err
	}
	return h.Get("ETag") != etag, nil
}

// maxAgentExecutableBytes bounds a hostagent executable download (today's is about 40 MB).
const maxAgentExecutableBytes = 512 << 20

// Download fetches path from the appliance front (GET, the same pinned TLS, no token: artifacts are
// public) into w and returns the hex SHA-256 of what it wrote. It allows up to 10 minutes (a
// download of tens of megabytes over a slow management network). Errors: HTTP status ≥ 300; more
// than 512 MiB; network and write errors.
func (c *Client) Download(ctx context.Context, path string, w io.Writer) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return "", err
	}
	hc := *c.hc
	hc.Timeout = 0 // bounded by ctx
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(resp.Body, maxAgentExecutableBytes+1))
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", path, err)
	}
	if n > maxAgentExecutableBytes {
		return "", fmt.Errorf("GET %s: larger than %d bytes", path, maxAgentExecutableBytes)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func parseNodeConfig(data []byte) (agentapi.NodeConfig, error) {
	var nc agentapi.NodeConfig
	if err := json.Unmarshal(data, &nc); err != nil {
		return nc, fmt.Errorf("node config: %w", err)
	}
	return nc, nil
}

// Report sends one report (POST agentapi.ReportPathV1). Errors: ErrUnauthorized; HTTP and network
// errors.
func (c *Client) Report(ctx context.Context, r agentapi.Report) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPost, agentapi.ReportPathV1, b)
	return err
}
