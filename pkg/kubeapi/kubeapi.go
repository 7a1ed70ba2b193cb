// Package kubeapi is a small Kubernetes API client over plain REST (net/http and encoding/json):
// a kubeconfig loader (the cluster's server and CA, a client certificate or bearer token) and
// request helpers that turn a metav1.Status answer into an error wrapping ErrConflict (409),
// ErrNotFound (404), ErrGone (410) or ErrTooManyRequests (429).
//
// Not client-go: linked into `appliance`, k8s.io/client-go (clientset, informers, clientcmd) took
// the binary from 55.7 MB to 118.7 MB for a handful of calls. Callers (pkg/csrapprove,
// pkg/noderemove) decode the few fields they read themselves.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Sentinel errors of API calls, by HTTP status: 409, 404, 410 (a watch whose resourceVersion is
// too old) and 429 (an eviction a PodDisruptionBudget refuses for now, or throttling).
var (
	ErrConflict        = errors.New("conflict")
	ErrNotFound        = errors.New("not found")
	ErrGone            = errors.New("resource version too old")
	ErrTooManyRequests = errors.New("too many requests")
)

// kubeconfig is the subset of a kubeconfig file (clientcmd/api/v1) that names an API server and a
// client certificate or bearer token: what kubeadm's and the appliance's admin.conf hold.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			TLSServerName            string `yaml:"tls-server-name"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
			Token                 string `yaml:"token"`
			TokenFile             string `yaml:"tokenFile"`
			Exec                  any    `yaml:"exec"`
			AuthProvider          any    `yaml:"auth-provider"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// Client talks to one API server. It is safe for concurrent use.
type Client struct {
	server string // https://host:port, no trailing slash
	http   *http.Client
	token  string // bearer token, when the kubeconfig user has one
}

// Load reads a kubeconfig file and builds a client for its current context: the cluster's
// server and CA (data or file) and the user's client certificate and key (data or files, as PEM) or
// bearer token. File paths are relative to the kubeconfig's directory, as in clientcmd. Errors name
// the kubeconfig field at fault; exec and auth-provider users and insecure-skip-tls-verify are
// refused. Key material never appears in errors.
func Load(path string) (*Client, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s does not parse: %w", path, err)
	}
	dir := filepath.Dir(path)
	fail := func(field, format string, a ...any) error {
		return fmt.Errorf("kubeconfig %s: %s: %s", path, field, fmt.Sprintf(format, a...))
	}
	if kc.CurrentContext == "" {
		return nil, fail("current-context", "is empty: set it to one of contexts[].name")
	}
	ci := -1
	for i, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			ci = i
		}
	}
	if ci < 0 {
		return nil, fail("current-context", "%q is not one of contexts[].name", kc.CurrentContext)
	}
	ctxPath := fmt.Sprintf("contexts[%d].context", ci)
	want := kc.Contexts[ci].Context
	// read returns inline base64 data, else a file's bytes, else nil.
	read := func(field, data, file string) ([]byte, error) {
		switch {
		case data != "":
			out, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				return nil, fail(field+"-data", "is not base64")
			}
			return out, nil
		case file != "":
			if !filepath.IsAbs(file) {
				file = filepath.Join(dir, file)
			}
			out, err := os.ReadFile(file)
			if err != nil {
				return nil, fail(field, "%v", err)
			}
			return out, nil
		}
		return nil, nil
	}
	c := &Client{}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	found := false
	for i, cl := range kc.Clusters {
		if cl.Name != want.Cluster {
			continue
		}
		found = true
		p := fmt.Sprintf("clusters[%d].cluster", i)
		u, err := url.Parse(cl.Cluster.Server)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fail(p+".server", "%q is not an https:// URL", cl.Cluster.Server)
		}
		c.server = strings.TrimSuffix(cl.Cluster.Server, "/")
		if cl.Cluster.InsecureSkipTLSVerify {
			return nil, fail(p+".insecure-skip-tls-verify", "is not supported: give the cluster CA (certificate-authority-data)")
		}
		ca, err := read(p+".certificate-authority", cl.Cluster.CertificateAuthorityData, cl.Cluster.CertificateAuthority)
		if err != nil {
			return nil, err
		}
		if ca != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, fail(p+".certificate-authority-data", "holds no PEM certificate")
			}
			tlsConfig.RootCAs = pool
		}
		tlsConfig.ServerName = cl.Cluster.TLSServerName
	}
	if !found {
		return nil, fail(ctxPath+".cluster", "%q is not one of clusters[].name", want.Cluster)
	}
	found = false
	for i, us := range kc.Users {
		if us.Name != want.User {
			continue
		}
		found = true
		p := fmt.Sprintf("users[%d].user", i)
		if us.User.Exec != nil || us.User.AuthProvider != nil {
			return nil, fail(p, "exec and auth-provider credentials are not supported: use a client certificate or a token")
		}
		crt, err := read(p+".client-certificate", us.User.ClientCertificateData, us.User.ClientCertificate)
		if err != nil {
			return nil, err
		}
		key, err := read(p+".client-key", us.User.ClientKeyData, us.User.ClientKey)
		if err != nil {
			return nil, err
		}
		if crt != nil || key != nil {
			pair, err := tls.X509KeyPair(crt, key)
			if err != nil {
				return nil, fail(p+".client-certificate-data", "and client-key-data are not a PEM certificate and its key")
			}
			tlsConfig.Certificates = []tls.Certificate{pair}
		}
		tok, err := read(p+".tokenFile", "", us.User.TokenFile)
		if err != nil {
			return nil, err
		}
		c.token = us.User.Token
		if tok != nil {
			c.token = strings.TrimSpace(string(tok))
		}
		if len(tlsConfig.Certificates) == 0 && c.token == "" {
			return nil, fail(p, "has no client certificate or token")
		}
	}
	if !found {
		return nil, fail(ctxPath+".user", "%q is not one of users[].name", want.User)
	}
	c.http = &http.Client{Transport: &http.Transport{
		TLSClientConfig:     tlsConfig,
		Proxy:               nil, // the API server is on the nodes' network, never behind a proxy
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}}
	return c, nil
}

// Server is the API server's URL (https://host:port).
func (c *Client) Server() string { return c.server }

// Do sends one request (path with its query, body JSON or nil) and returns the body of a 2xx answer
// (at most 64 MiB); other answers become an error with the API's Status message, wrapping
// ErrConflict, ErrNotFound, ErrGone or ErrTooManyRequests.
func (c *Client) Do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	return c.DoContentType(ctx, method, path, "application/json", body)
}

// DoContentType is Do with the body's media type, e.g. "application/merge-patch+json" for a PATCH
// (RFC 7396).
func (c *Client) DoContentType(ctx context.Context, method, path, contentType string, body []byte) ([]byte, error) {
	resp, err := c.send(ctx, method, path, contentType, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, 64<<20))
}

// Send is Do for a streamed answer (a watch): the caller reads and closes the 2xx response's body.
func (c *Client) Send(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	return c.send(ctx, method, path, "application/json", body)
}

func (c *Client) send(ctx context.Context, method, path, contentType string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "appliance")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return nil, StatusError(method, path, resp.StatusCode, b)
}

// StatusError turns a metav1.Status answer (HTTP code and body) into an error naming the request,
// wrapping the sentinel error of the code.
func StatusError(method, path string, code int, body []byte) error {
	var st struct {
		Message string `json:"message"`
		Reason  string `json:"reason"`
	}
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		msg = st.Message
	}
	err := fmt.Errorf("%s %s: HTTP %d: %s", method, path, code, msg)
	switch code {
	case http.StatusConflict:
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case http.StatusNotFound:
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case http.StatusGone:
		return fmt.Errorf("%w: %w", ErrGone, err)
	case http.StatusTooManyRequests:
		return fmt.Errorf("%w: %w", ErrTooManyRequests, err)
	}
	return err
}
