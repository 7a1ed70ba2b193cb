package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// MaxReportBytes bounds the body of POST agentapi.ReportPathV1.
const MaxReportBytes = 64 << 10

// headerBearer returns the token of an "Authorization: Bearer <token>" header, or "". The scheme is
// matched case-insensitively and may be followed by several spaces (RFC 7235 §2.1: credentials =
// auth-scheme 1*SP token68; RFC 6750 §2.1 names the scheme "Bearer").
func headerBearer(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimLeft(token, " ")
}

// AgentAPI serves the hostagent API (pkg/agentapi) under /agent/v1/:
//
//	GET  agentapi.ConfigPathV1  the node's NodeConfig, the file Dir/<node>/nodeconfig.json as
//	                            rendered (passed through Gate when set, then through
//	                            agentapi.WithholdSecrets by the node's kubeadm record in Nodes:
//	                            least secret per node); reading it records nothing
//	                            (a node moves only by its reports). Its ETag is the served bytes'
//	                            SHA-256 (first 128 bits, hex, quoted); with ?wait=<that ETag> the
//	                            answer waits until the served config differs, up to
//	                            agentapi.ConfigWaitMax, or until EndWatches (server shutdown); a
//	                            node's watch beyond MaxWatchesPerNode at once → 429
//	POST agentapi.ReportPathV1  one agentapi.Report (one JSON object and nothing after it, at most
//	                            MaxReportBytes, unknown fields refused) recorded by the node store →
//	                            204; a bad report → 400; over ReportRate/ReportBurst for the node →
//	                            429 with Retry-After (nothing read or recorded)
//	POST agentapi.InstalledPathV1  one agentapi.InstallNotice (same bounds as a report), passed to
//	                            Installed → 204; refused (another node's MAC, agentapi.
//	                            ErrInstallNoticeRefused) → 403, nothing to mark (Installed nil, or
//	                            agentapi.ErrInstallNoticeNotServed) → 404, the node's previous
//	                            notice still in progress (agentapi.ErrInstallNoticeBusy) → 429, a
//	                            bad body → 400
//
// The node is the one whose token is sent as "Authorization: Bearer <token>" (scheme in any case;
// never in the query: it would reach logs of proxies). A missing, wrong or unknown token gets one
// and the same 401 (the challenge /ignition/ sends, a text naming the header and the token
// lifecycle), so a node can read and write only its own records and a caller learns nothing about
// which nodes exist; a token this process saw replaced or revoked is told so (NodeTokens.Refusal).
// The token is the node's current one at every request (UseTokens with NodeTokensIn follows the
// state directory), and a config watch re-checks it as it polls: a watch opened with a token that
// is then replaced or revoked ends with that 401.
type AgentAPI struct {
	// Dir is the rendered dir (STATE/rendered), one directory per node.
	Dir string
	// Nodes records reports.
	Nodes *nodestate.Store
	// Log receives store failures; nil discards. Tokens and configs are never logged.
	Log *slog.Logger
	// Gate, when set, adjusts a node's config as it is served (the kubeadm join order: it sets
	// Kubernetes.Proceed and WaitingFor from the other nodes' progress).
	Gate func(node string, nc *agentapi.NodeConfig)
	// Installed, when set, takes a node's install notice (POST agentapi.InstalledPathV1; ctx is the
	// request's, ended when its client goes away; node is the one its token names, remote the
	// request's address): pkg/applianced's install notices. Set it before serving. nil: notices are
	// answered 404 (this appliance does not network-boot).
	Installed func(ctx context.Context, node string, n agentapi.InstallNotice, remote string) error

	tokens *NodeTokens

	// refused holds the install-notice refusals already logged (logged once each, not per retry).
	refusedMu sync.Mutex
	refused   map[string]bool

	watchMu  sync.Mutex
	watchEnd chan struct{}  // closed by EndWatches; watches in progress answer at once
	watching map[string]int // node → config watches in progress (at most MaxWatchesPerNode)

	reports    *keyedLimiter // per node: ReportRate, ReportBurst
	limitsOnce sync.Once
	refusals   refusalLog // 429s, logged once a minute per node and limit
}

// EndWatches makes every config watch in progress answer now with the config it has (the server
// is shutting down: a watch would hold a graceful shutdown for up to agentapi.ConfigWaitMax).
// Watches that start later wait as usual.
func (a *AgentAPI) EndWatches() {
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	if a.watchEnd != nil {
		close(a.watchEnd)
		a.watchEnd = nil
	}
}

func (a *AgentAPI) watchEndCh() chan struct{} {
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	if a.watchEnd == nil {
		a.watchEnd = make(chan struct{})
	}
	return a.watchEnd
}

// NewAgentAPI returns the agent API for the rendered dir, accepting the given node tokens (node
// name → token) and recording into nodes.
func NewAgentAPI(dir string, tokens map[string]string, nodes *nodestate.Store, log *slog.Logger) *AgentAPI {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AgentAPI{Dir: dir, Nodes: nodes, Log: log, reports: newKeyedLimiter(ReportRate, ReportBurst), tokens: NewNodeTokens(tokens)}
}

// SetTokens replaces the accepted tokens by a fixed set (node name → token).
func (a *AgentAPI) SetTokens(tokens map[string]string) { a.tokens.set(tokens) }

// UseTokens makes the API accept the tokens of t (NodeTokensIn: the state directory's, followed as
// they change; shared with the IgnitionStore). Call it before serving.
func (a *AgentAPI) UseTokens(t *NodeTokens) { a.tokens = t }

func (a *AgentAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var want string
	switch r.URL.Path {
	case agentapi.ConfigPathV1:
		want = http.MethodGet
	case agentapi.ReportPathV1, agentapi.InstalledPathV1:
		want = http.MethodPost
	default:
		http.NotFound(w, r)
		return
	}
	token := headerBearer(r)
	node, ok := a.tokens.nodeFor(token)
	if !ok {
		if r.URL.Path == agentapi.InstalledPathV1 {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			a.logRefusedOnce("unauthenticated|"+host, "install notice refused: no valid node token (401); the machine must send the token its enrolment gave it as Authorization: Bearer, over the pinned HTTPS API",
				"remote", r.RemoteAddr)
		}
		unauthorized(w, a.tokens.Refusal(token))
		return
	}
	if r.Method != want {
		w.Header().Set("Allow", want)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if want == http.MethodGet {
		a.config(w, r, node, token)
		return
	}
	if r.URL.Path == agentapi.InstalledPathV1 {
		a.installed(w, r, node)
		return
	}
	a.report(w, r, node)
}

// installed takes a node's install notice (agentapi.InstalledPathV1).
func (a *AgentAPI) installed(w http.ResponseWriter, r *http.Request, node string) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxReportBytes))
	dec.DisallowUnknownFields()
	var n agentapi.InstallNotice
	if err := dec.Decode(&n); err != nil {
		http.Error(w, `bad install notice: want one JSON object {"mac": "<the boot NIC's MAC>"}: `+err.Error(), http.StatusBadRequest)
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		http.Error(w, "bad install notice: want exactly one JSON object, complete, and nothing after it", http.StatusBadRequest)
		return
	}
	if a.Installed == nil {
		http.Error(w, "this appliance does not network-boot any machine (boot.dhcp off): it keeps no install marks", http.StatusNotFound)
		return
	}
	err := a.Installed(r.Context(), node, n, r.RemoteAddr)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, agentapi.ErrInstallNoticeBusy):
		tooManyRequests(w, installBusyRetry, err.Error())
	case errors.Is(err, agentapi.ErrInstallNoticeRefused):
		a.logRefusedOnce("refused|"+node+"|"+err.Error(), "install notice refused (403)", "node", node, "remote", r.RemoteAddr, "reason", err.Error())
		http.Error(w, err.Error(), http.StatusForbidden)
	case errors.Is(err, agentapi.ErrInstallNoticeNotServed):
		http.Error(w, err.Error(), http.StatusNotFound)
	default:
		a.Log.Error("record install notice", "node", node, "error", err)
		http.Error(w, "the appliance could not record the install; the machine retries", http.StatusServiceUnavailable)
	}
}

// installBusyRetry is the Retry-After of a notice that arrives while the node's previous one is
// being acted on (a BMC call takes seconds).
const installBusyRetry = 5 * time.Second

// maxLoggedRefusals bounds the set of install-notice refusals remembered as logged.
const maxLoggedRefusals = 1024

// logRefusedOnce logs a refused install notice once per key (a machine retries its notice).
func (a *AgentAPI) logRefusedOnce(key, msg string, attrs ...any) {
	a.refusedMu.Lock()
	if a.refused == nil || len(a.refused) >= maxLoggedRefusals {
		a.refused = map[string]bool{}
	}
	seen := a.refused[key]
	a.refused[key] = true
	a.refusedMu.Unlock()
	if !seen {
		a.Log.Warn(msg, attrs...)
	}
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

// served is the node's config as served now: the rendered file, passed through Gate, then
// stripped of the kubeadm secrets the node does not need now (agentapi.WithholdSecrets: the
// cluster CA key once the node has run kubeadm, a joining node's join secrets outside its turn).
// Whether it has run kubeadm is the node store's record (RanKubeadm); a store that cannot say is
// read as "it has" (withhold rather than leak: the node retries).
func (a *AgentAPI) served(node string) ([]byte, error) {
	data, nc, err := a.readNodeConfig(node)
	if err != nil {
		return data, err
	}
	if a.Gate != nil {
		a.Gate(node, nc)
	}
	if k := nc.Kubernetes; k != nil {
		// The record is read only when it decides something: a CA key to serve, or join secrets
		// of a node whose turn it is.
		joined := false
		if k.CAKeyPEM != "" || (!k.RenewsJoinSecrets() && k.Proceed) {
			joined = a.ranKubeadm(node)
		}
		agentapi.WithholdSecrets(nc, joined)
	} else if a.Gate == nil {
		return data, nil
	}
	data, err = json.MarshalIndent(nc, "", "  ")
	return append(data, '\n'), err
}

// ranKubeadm is Nodes.RanKubeadm, true when there is no store or it cannot say.
func (a *AgentAPI) ranKubeadm(node string) bool {
	if a.Nodes == nil {
		return true
	}
	ran, err := a.Nodes.RanKubeadm(node)
	if err != nil {
		a.Log.Error("read whether the node has run kubeadm; withholding its kubeadm secrets", "node", node, "error", err)
		return true
	}
	return ran
}

// configETag is the ETag of served config bytes: their SHA-256's first 128 bits in hex, quoted
// (RFC 9110 section 8.8.3, a strong validator).
func configETag(data []byte) string {
	sum := sha256.Sum256(data)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}

// startWatch counts a config watch of node in; false when the node holds MaxWatchesPerNode already.
// done counts it out.
func (a *AgentAPI) startWatch(node string) (done func(), ok bool) {
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	if a.watching[node] >= MaxWatchesPerNode {
		return nil, false
	}
	if a.watching == nil {
		a.watching = map[string]int{}
	}
	a.watching[node]++
	return func() {
		a.watchMu.Lock()
		defer a.watchMu.Unlock()
		if a.watching[node]--; a.watching[node] <= 0 {
			delete(a.watching, node)
		}
	}, true
}

func (a *AgentAPI) config(w http.ResponseWriter, r *http.Request, node, token string) {
	data, err := a.served(node)
	if wait := r.URL.Query().Get(agentapi.ConfigWaitParam); wait != "" && err == nil && configETag(data) == wait {
		done, ok := a.startWatch(node)
		if !ok {
			a.refusals.log(a.Log, "watch\x00"+node, "config watch refused: the node holds the most watches at once (429)",
				"node", node, "remote", r.RemoteAddr, "max", MaxWatchesPerNode)
			tooManyRequests(w, configWatchPoll*10, fmt.Sprintf("too many config watches of node %s at once (at most %d): close one, or fetch without %s", node, MaxWatchesPerNode, agentapi.ConfigWaitParam))
			return
		}
		defer done()
		// A watch on the config the node has: poll the rendered file and the gate (both cheap, and
		// changed by other processes: `appliance bootstrap` renders, other nodes' reports move the
		// gate) until the served bytes differ, the wait ends or the client goes away; and the token
		// it was opened with, which ends the watch with a 401 once it is replaced or revoked.
		deadline := time.NewTimer(agentapi.ConfigWaitMax)
		defer deadline.Stop()
		tick := time.NewTicker(configWatchPoll)
		defer tick.Stop()
		ending := a.watchEndCh()
	watch:
		for {
			select {
			case <-r.Context().Done():
				return // nobody to answer
			case <-deadline.C:
				break watch
			case <-ending:
				break watch
			case <-tick.C:
			}
			if !a.tokens.authorized(node, token) {
				unauthorized(w, a.tokens.Refusal(token))
				return
			}
			next, nerr := a.served(node)
			if nerr != nil || configETag(next) != wait {
				data, err = next, nerr
				break
			}
		}
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
	w.Header().Set("ETag", configETag(data))
	_, _ = w.Write(data)
}

// configWatchPoll is how often a watch (agentapi.ConfigWaitParam) looks at the node's config.
const configWatchPoll = 500 * time.Millisecond

func (a *AgentAPI) report(w http.ResponseWriter, r *http.Request, node string) {
	a.limitsOnce.Do(func() {
		if a.reports == nil { // an AgentAPI not made by NewAgentAPI
			a.reports = newKeyedLimiter(ReportRate, ReportBurst)
		}
	})
	if ok, wait := a.reports.allow(node, time.Now()); !ok {
		a.refusals.log(a.Log, "report\x00"+node, "report refused: the node reports faster than the limit (429)",
			"node", node, "remote", r.RemoteAddr, "limit", rateText(ReportRate, ReportBurst))
		tooManyRequests(w, wait, fmt.Sprintf("too many reports from node %s: at most %s; retry after the Retry-After seconds", node, rateText(ReportRate, ReportBurst)))
		return
	}
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
	// One JSON document, then the end of a body as long as its Content-Length said (a body cut short
	// or followed by more data is not the report the node sent).
	if _, err := dec.Token(); err != io.EOF {
		http.Error(w, "bad report: want exactly one JSON object, complete, and nothing after it", http.StatusBadRequest)
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
