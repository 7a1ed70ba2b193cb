package csrapprove

// The few Kubernetes API calls the approver makes, as plain REST over net/http (certificates.k8s.io/v1,
// https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/certificate-signing-request-v1/).
// Not client-go: linked into `appliance`, k8s.io/client-go (clientset, informers, clientcmd) took the
// binary from 55.7 MB to 118.7 MB for four calls.

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
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

const csrPath = "/apis/certificates.k8s.io/v1/certificatesigningrequests"

// Sentinel errors of API calls (HTTP 409 and 404, and 410 for a watch whose resourceVersion is too old).
var (
	errConflict = errors.New("conflict")
	errNotFound = errors.New("not found")
	errGone     = errors.New("resource version too old")
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

// apiClient talks to one API server.
type apiClient struct {
	server string // https://host:port, no trailing slash
	http   *http.Client
	token  string // bearer token, when the kubeconfig user has one
}

// loadKubeconfig reads a kubeconfig file and builds a client for its current context: the cluster's
// server and CA (data or file) and the user's client certificate and key (data or files, as PEM) or
// bearer token. File paths are relative to the kubeconfig's directory, as in clientcmd. Errors name
// the kubeconfig field at fault; exec and auth-provider users and insecure-skip-tls-verify are
// refused. Key material never appears in errors.
func loadKubeconfig(path string) (*apiClient, error) {
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
	c := &apiClient{}
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

// csrObject is a certificates.k8s.io/v1 CertificateSigningRequest: the fields the rule reads, and the
// whole object as the API server sent it (raw), so an approval sends every field back unchanged.
type csrObject struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		Request    []byte   `json:"request"` // base64 in JSON, PEM once decoded
		SignerName string   `json:"signerName"`
		Usages     []string `json:"usages"`
		Username   string   `json:"username"`
		Groups     []string `json:"groups"`
	} `json:"spec"`
	Status struct {
		Conditions []condition `json:"conditions"`
	} `json:"status"`
	raw json.RawMessage
}

// condition is a CertificateSigningRequestCondition.
type condition struct {
	Type           string `json:"type"`
	Status         string `json:"status"`
	Reason         string `json:"reason,omitempty"`
	Message        string `json:"message,omitempty"`
	LastUpdateTime string `json:"lastUpdateTime,omitempty"`
}

func decodeCSR(raw json.RawMessage) (*csrObject, error) {
	var o csrObject
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("decode certificate signing request: %w", err)
	}
	o.raw = raw
	return &o, nil
}

// do sends one request and returns the body of a 2xx answer; other answers become an error with the
// API's Status message, wrapping errConflict (409), errNotFound (404) or errGone (410).
func (c *apiClient) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, 64<<20))
}

func (c *apiClient) send(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "appliance-csrapprove")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
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
	return nil, statusError(method, path, resp.StatusCode, b)
}

// statusError turns a metav1.Status answer into an error.
func statusError(method, path string, code int, body []byte) error {
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
		return fmt.Errorf("%w: %w", errConflict, err)
	case http.StatusNotFound:
		return fmt.Errorf("%w: %w", errNotFound, err)
	case http.StatusGone:
		return fmt.Errorf("%w: %w", errGone, err)
	}
	return err
}

// list returns every CSR and the list's resourceVersion (where a watch starts).
func (c *apiClient) list(ctx context.Context) ([]*csrObject, string, error) {
	b, err := c.do(ctx, http.MethodGet, csrPath, nil)
	if err != nil {
		return nil, "", err
	}
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, "", fmt.Errorf("decode certificate signing request list: %w", err)
	}
	out := make([]*csrObject, 0, len(l.Items))
	for _, raw := range l.Items {
		o, err := decodeCSR(raw)
		if err != nil {
			return nil, "", err
		}
		out = append(out, o)
	}
	return out, l.Metadata.ResourceVersion, nil
}

func (c *apiClient) get(ctx context.Context, name string) (*csrObject, error) {
	b, err := c.do(ctx, http.MethodGet, csrPath+"/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, err
	}
	return decodeCSR(b)
}

// updateApproval sends o back through the approval subresource (PUT .../NAME/approval) with cond
// appended to status.conditions; o's resourceVersion makes it fail with errConflict when the CSR
// changed since it was read.
func (c *apiClient) updateApproval(ctx context.Context, o *csrObject, cond condition) error {
	var obj map[string]any
	if err := json.Unmarshal(o.raw, &obj); err != nil {
		return fmt.Errorf("decode certificate signing request %s: %w", o.Metadata.Name, err)
	}
	status, _ := obj["status"].(map[string]any)
	if status == nil {
		status = map[string]any{}
		obj["status"] = status
	}
	conds, _ := status["conditions"].([]any)
	status["conditions"] = append(conds, cond)
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPut, csrPath+"/"+url.PathEscape(o.Metadata.Name)+"/approval", body)
	return err
}

// watchEvent is one line of a watch stream (metav1.WatchEvent).
type watchEvent struct {
	Type   string          `json:"type"` // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
	Object json.RawMessage `json:"object"`
}

// watch streams CSR changes after resourceVersion rv to fn until the server ends the watch (after
// timeout), ctx is done, or fn fails. It returns the last resourceVersion seen; errGone when rv is
// too old (list again).
func (c *apiClient) watch(ctx context.Context, rv string, timeout time.Duration, fn func(*csrObject) error) (string, error) {
	q := url.Values{"watch": {"true"}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"},
		"timeoutSeconds": {strconv.Itoa(int(timeout.Seconds()))}}
	resp, err := c.send(ctx, http.MethodGet, csrPath+"?"+q.Encode(), nil)
	if err != nil {
		return rv, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return rv, nil
			}
			return rv, fmt.Errorf("watch certificate signing requests: %w", err)
		}
		switch ev.Type {
		case "ERROR":
			var st struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(ev.Object, &st)
			return rv, statusError(http.MethodGet, csrPath+"?watch", st.Code, ev.Object)
		case "ADDED", "MODIFIED", "DELETED", "BOOKMARK":
			o, err := decodeCSR(ev.Object)
			if err != nil {
				return rv, err
			}
			if o.Metadata.ResourceVersion != "" {
				rv = o.Metadata.ResourceVersion
			}
			if ev.Type == "ADDED" || ev.Type == "MODIFIED" {
				if err := fn(o); err != nil {
					return rv, err
				}
			}
		}
	}
}
