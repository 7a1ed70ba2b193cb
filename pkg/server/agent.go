package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// MaxReportBytes bounds the body of POST agentapi.ReportPathV1.
const MaxReportBytes = 64 << 10

// tokenSet holds SHA-256 digests of the node tokens; both the Ignition store and the agent API
// check bearer tokens through it, so they answer a bad token identically.
type tokenSet struct {
	mu     sync.RWMutex
	tokens map[string][32]byte // node → SHA-256 of its token
}

func (t *tokenSet) set(tokens map[string]string) {
	m := make(map[string][32]byte, len(tokens))
	for n, tok := range tokens {
		m[n] = sha256.Sum256([]byte(tok))
	}
	t.mu.Lock()
	t.tokens = m
	t.mu.Unlock()
}

// authorized compares hashes in constant time; an unknown node is compared against a dummy.
func (t *tokenSet) authorized(node, token string) bool {
	got := sha256.Sum256([]byte(token))
	t.mu.RLock()
	want, ok := t.tokens[node]
	t.mu.RUnlock()
	eq := subtle.ConstantTimeCompare(got[:], want[:]) == 1
	return ok && token != "" && eq
}

// nodeFor returns the node whose token is token. It compares against every node's digest in
// constant time, so the time taken depends on the number of nodes only.
func (t *tokenSet) nodeFor(token string) (string, bool) {
	got := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	found := ""
	for n, want := range t.tokens {
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
			found = n
		}
	}
	return found, found != "" && token != ""
}

// unauthorized is the one 401 answer of every token-authenticated endpoint.
func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="appliance"`)
	http.Error(w, "unauthorized: send this node's token (Authorization: Bearer or ?token=)", http.StatusUnauthorized)
}

// AgentAPI serves the hostagent API (pkg/agentapi) under /agent/v1/:
//
//	GET  agentapi.ConfigPathV1  the node's NodeConfig, the file Dir/<node>/nodeconfig.json as
//	                            rendered (passed through Gate when set); the first fetch of a boot
//	                            (agentapi.BootIDHeader) moves the node to agent-connected
//	POST agentapi.ReportPathV1  one agentapi.Report (JSON, at most MaxReportBytes, unknown fields
//	                            refused) recorded by the node store → 204; a bad report → 400
//
// The node is the one whose token is sent as "Authorization: Bearer <token>" (never in the query:
// it would reach logs of proxies). A missing, wrong or unknown token gets the same 401 as
// /ignition/, so a node can read and write only its own records.
type AgentAPI struct {
	// Dir is the rendered dir (STATE/rendered), one directory per node.
	Dir string
	// Nodes records reports and config fetches.
	Nodes *nodestate.Store
	// Log receives store failures; nil discards. Tokens and configs are never logged.
	Log *slog.Logger
	// Gate, when set, adjusts a node's config as it is served (the kubeadm join order: it sets
	// Kubernetes.Proceed and WaitingFor from the other nodes' progress).
	Gate func(node string, nc *agentapi.NodeConfig)

	tokens tokenSet
}

// NewAgentAPI returns the agent API for the rendered dir, accepting the given node tokens (node
// name → token) and recording into nodes.
func NewAgentAPI(dir string, tokens map[string]string, nodes *nodestate.Store, log *slog.Logger) *AgentAPI {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &AgentAPI{Dir: dir, Nodes: nodes, Log: log}
	a.tokens.set(tokens)
	return a
}

// SetTokens replaces the accepted tokens (node name → token).
func (a *AgentAPI) SetTokens(tokens map[string]string) { a.tokens.set(tokens) }

func headerBearer(r *http.Request) string {
	const p = "Bearer "
	if h := r.Header.Get("Authorization"); len(h) > len(p) && h[:len(p)] == p {
		return h[len(p):]
	}
	return ""
}

func (a *AgentAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var want string
	switch r.URL.Path {
	case agentapi.ConfigPathV1:
		want = http.MethodGet
	case agentapi.ReportPathV1:
		want = http.MethodPost
	default:
		http.NotFound(w, r)
		return
	}
	node, ok := a.tokens.nodeFor(headerBearer(r))
	if !ok {
		unauthorized(w)
		return
	}
	if r.Method != want {
		w.Header().Set("Allow", want)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if want == http.MethodGet {
		a.config(w, r, node)
		return
	}
	a.report(w, r, node)
}

// readNodeConfig reads Dir/<node>/nodeconfig.json.
func (a *AgentAPI) readNodeConfig(node string) ([]byte, *agentapi.NodeConfig, error) {
	b, err := os.ReadFile(filepath.Join(a.Dir, node, statedir.NodeConfigFile))
	if err != nil {
		return nil, nil, err
	}
	var nc agentapi.NodeConfig
	if err := json.Unmarshal(b, &nc); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(a.Dir, node, statedir.NodeConfigFile), err)
	}
	return b, &nc, nil
}

func (a *AgentAPI) config(w http.ResponseWriter, r *http.Request, node string) {
	data, nc, err := a.readNodeConfig(node)
	if err == nil && a.Gate != nil && nc.Kubernetes != nil {
		a.Gate(node, nc)
		data, err = json.MarshalIndent(nc, "", "  ")
		data = append(data, '\n')
	}
	if errors.Is(err, fs.ErrNotExist) {
		http.Error(w, "no node config rendered for this node; rerun `appliance bootstrap` (render phase)", http.StatusNotFound)
		return
	} else if err != nil {
		a.Log.Error("read node config", "node", node, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if _, err := w.Write(data); err != nil {
		return
	}
	if _, err := a.Nodes.ConfigFetched(node, r.Header.Get(agentapi.BootIDHeader)); err != nil {
		a.Log.Error("record config fetch", "node", node, "error", err)
	}
}

func (a *AgentAPI) report(w http.ResponseWriter, r *http.Request, node string) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxReportBytes))
	dec.DisallowUnknownFields()
	var rep agentapi.Report
	if err := dec.Decode(&rep); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, fmt.Sprintf("report larger than %d bytes", MaxReportBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "bad report: "+err.Error(), http.StatusBadRequest)
		return
	}
	var plan []string
	if _, nc, err := a.readNodeConfig(node); err == nil {
		plan = agentapi.Plan(*nc)
	}
	if _, _, err := a.Nodes.Record(node, plan, rep); errors.Is(err, nodestate.ErrInvalidReport) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	} else if err != nil {
		a.Log.Error("record report", "node", node, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// caHandler serves the appliance CA certificate (public: nodes check it against their pin).
func caHandler(pemBytes []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(pemBytes)
	})
}
