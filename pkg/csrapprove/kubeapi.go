package csrapprove

// The few Kubernetes API calls the approver makes, as plain REST over net/http (certificates.k8s.io/v1,
// https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/certificate-signing-request-v1/).
// The client and kubeconfig loading are pkg/kubeapi's (plain REST, not client-go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/airgap-appliance/appliance/pkg/kubeapi"
)

const csrPath = "/apis/certificates.k8s.io/v1/certificatesigningrequests"

// Sentinel errors of API calls (pkg/kubeapi): HTTP 409, 404, and 410 for a watch whose
// resourceVersion is too old.
var (
	errConflict = kubeapi.ErrConflict
	errNotFound = kubeapi.ErrNotFound
	errGone     = kubeapi.ErrGone
)

// apiClient is the approver's client: pkg/kubeapi's, with the CSR calls below.
type apiClient struct{ *kubeapi.Client }

// loadKubeconfig builds the client from a kubeconfig file (kubeapi.Load).
func loadKubeconfig(path string) (*apiClient, error) {
	c, err := kubeapi.Load(path)
	if err != nil {
		return nil, err
	}
	return &apiClient{c}, nil
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

// list returns every CSR and the list's resourceVersion (where a watch starts).
func (c *apiClient) list(ctx context.Context) ([]*csrObject, string, error) {
	b, err := c.Do(ctx, http.MethodGet, csrPath, nil)
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
	b, err := c.Do(ctx, http.MethodGet, csrPath+"/"+url.PathEscape(name), nil)
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
	_, err = c.Do(ctx, http.MethodPut, csrPath+"/"+url.PathEscape(o.Metadata.Name)+"/approval", body)
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
	resp, err := c.Send(ctx, http.MethodGet, csrPath+"?"+q.Encode(), nil)
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
			return rv, kubeapi.StatusError(http.MethodGet, csrPath+"?watch", st.Code, ev.Object)
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
