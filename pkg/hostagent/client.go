package hostagent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// ErrUnauthorized is wrapped when the appliance refuses the node's token (HTTP 401): retrying will
// not help; fix token in the hostagent config.
var ErrUnauthorized = errors.New("the appliance refused this node's token")

// maxNodeConfigBytes bounds a node config download.
const maxNodeConfigBytes = 4 << 20

// Client talks to the appliance's agent API over HTTPS, trusting only the appliance CA.
type Client struct {
	base   string
	token  string
	bootID string
	hc     *http.Client
}

// NewClient returns a client for applianceURL (https://host:port) that trusts only caPEM and sends
// token as its bearer token and bootID in agentapi.BootIDHeader. Errors: caPEM holds no
// certificate.
func NewClient(applianceURL string, caPEM []byte, token, bootID string) (*Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("appliance CA: no PEM certificate")
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		Proxy:               nil, // air-gapped: the appliance is reached directly
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{
		base: strings.TrimRight(applianceURL, "/"), token: token, bootID: bootID,
		hc: &http.Client{Transport: tr, Timeout: 30 * time.Second},
	}, nil
}

func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeConfigBytes))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, fmt.Errorf("%s %s: %w (check token in the hostagent config)", method, path, ErrUnauthorized)
	case resp.StatusCode >= 300:
		return nil, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// NodeConfig fetches the node's configuration (GET agentapi.ConfigPathV1) and returns it with its
// raw JSON. Errors: ErrUnauthorized; HTTP and network errors; bad JSON.
func (c *Client) NodeConfig(ctx context.Context) (agentapi.NodeConfig, []byte, error) {
	data, err := c.do(ctx, http.MethodGet, agentapi.ConfigPathV1, nil)
	if err != nil {
		return agentapi.NodeConfig{}, nil, err
	}
	nc, err := parseNodeConfig(data)
	return nc, data, err
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
