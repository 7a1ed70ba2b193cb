package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airgap-appliance/appliance/pkg/pki"
)

// NodeTokens is the set of node bearer tokens the front accepts, shared by the Ignition store and
// the agent API so that both answer a token alike. It keeps SHA-256 digests only, and compares them
// in constant time. Safe for concurrent use.
//
// Made by NodeTokensIn, it follows the token files of pkg/pki (STATE/pki/tokens/<node>, one per
// listed node) as they change under a running `appliance serve`, from this process (an enrolment)
// or another (`appliance node reinstall`, `appliance node revoke`), without a restart:
//
//   - a token that matches a node is checked against that node's file as it is now: one stat per
//     authentication, and a re-read when the file changed (pkg/atomicfile replaces it by rename, so
//     a rotated token always has a new inode). A rotated or revoked token is refused at its first
//     use after the change, and a config watch opened with it ends (AgentAPI).
//   - a token that matches no node makes it look again at every listed node's file when the tokens
//     directory changed since it last looked (one stat of the directory otherwise). While the
//     directory's mtime is within racyWindow of that look it always looks again: a change in the
//     same tick of the file system's clock leaves the mtime as it was. So a new token is accepted at
//     its first use.
//
// Tokens replaced or removed while the process runs are remembered by digest (at most maxRetired),
// so that their 401 says what happened (Refusal).
//
// Made by NewNodeTokens, it is a fixed set (SetTokens replaces it): tests, and a front without a
// state directory.
type NodeTokens struct {
	dir    string          // the PKI directory (pki.NodeTokenPath); "" for a fixed set
	nodes  []string        // the nodes whose files are followed (dir mode)
	isNode map[string]bool // nodes as a set

	mu      sync.RWMutex
	entries map[string]tokenEntry     // node → its current token
	dirKey  fileKey                   // the tokens directory at the last full look
	looked  time.Time                 // when the last full look started
	retired map[[32]byte]retiredToken // digest → what became of it
}

type tokenEntry struct {
	digest [32]byte
	file   fileKey // zero for a fixed set
}

// fileKey identifies one version of a file: an atomic replace changes the inode.
type fileKey struct {
	ino   uint64
	size  int64
	mtime int64
}

func keyOf(st os.FileInfo) fileKey {
	k := fileKey{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		k.ino = sys.Ino
	}
	return k
}

// retiredToken is a token that stopped working while this process ran.
type retiredToken struct {
	node    string
	at      time.Time
	revoked bool // removed (revoked); false: replaced by a new token
}

// maxRetired bounds NodeTokens' memory of retired tokens (a node is rotated a handful of times).
const maxRetired = 4096

// racyWindow: a tokens directory whose mtime is less than this before the last look may have
// changed again within the same mtime (see NodeTokens).
const racyWindow = time.Second

// NewNodeTokens returns a fixed set: node name → token.
func NewNodeTokens(tokens map[string]string) *NodeTokens {
	t := &NodeTokens{}
	t.set(tokens)
	return t
}

// NodeTokensIn returns the tokens of nodes as pkg/pki keeps them in the PKI directory pkiDir
// (STATE/pki), followed as they change. A node without a token file (none made yet, or revoked) or
// with a file that does not hold a token has no valid token. The directory need not exist yet.
func NodeTokensIn(pkiDir string, nodes []string) *NodeTokens {
	t := &NodeTokens{dir: pkiDir, nodes: append([]string(nil), nodes...), isNode: map[string]bool{}, entries: map[string]tokenEntry{}}
	for _, n := range nodes {
		t.isNode[n] = true
	}
	t.lookAll()
	return t
}

// set replaces a fixed set's tokens.
func (t *NodeTokens) set(tokens map[string]string) {
	m := make(map[string]tokenEntry, len(tokens))
	for n, tok := range tokens {
		m[n] = tokenEntry{digest: sha256.Sum256([]byte(tok))}
	}
	t.mu.Lock()
	t.entries = m
	t.mu.Unlock()
}

// current returns node's token as it is now (dir mode: after checking its file).
func (t *NodeTokens) current(node string) (tokenEntry, bool) {
	if t.dir == "" {
		t.mu.RLock()
		e, ok := t.entries[node]
		t.mu.RUnlock()
		return e, ok
	}
	if !t.isNode[node] {
		return tokenEntry{}, false
	}
	return t.look(node)
}

// look checks node's token file and updates the entry when the file changed; a token that went away
// is retired.
func (t *NodeTokens) look(node string) (tokenEntry, bool) {
	path := pki.NodeTokenPath(t.dir, node)
	st, err := os.Stat(path)
	t.mu.RLock()
	old, had := t.entries[node]
	t.mu.RUnlock()
	if err != nil || !st.Mode().IsRegular() {
		if had {
			t.replace(node, old, tokenEntry{}, false)
		}
		return tokenEntry{}, false
	}
	key := keyOf(st)
	if had && old.file == key {
		return old, true
	}
	tok, found, err := pki.ReadNodeToken(t.dir, node)
	if err != nil || !found {
		if had {
			t.replace(node, old, tokenEntry{}, false)
		}
		return tokenEntry{}, false
	}
	e := tokenEntry{digest: sha256.Sum256([]byte(tok)), file: key}
	t.replace(node, old, e, true)
	return e, true
}

// replace makes e node's entry (ok false: none) unless another look changed it since old was read;
// a token that changes or goes away is retired.
func (t *NodeTokens) replace(node string, old, e tokenEntry, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, had := t.entries[node]
	if had != (old != tokenEntry{}) || cur != old {
		return // another look got there first
	}
	if had && cur.digest != e.digest {
		if t.retired == nil || len(t.retired) >= maxRetired {
			t.retired = map[[32]byte]retiredToken{}
		}
		t.retired[cur.digest] = retiredToken{node: node, at: time.Now().UTC(), revoked: !ok}
	}
	if ok {
		t.entries[node] = e
	} else {
		delete(t.entries, node)
	}
}

// lookAll looks at every listed node's file (dir mode).
func (t *NodeTokens) lookAll() {
	start := time.Now()
	var key fileKey
	if st, err := os.Stat(t.tokensDir()); err == nil {
		key = keyOf(st)
	}
	for _, n := range t.nodes {
		t.look(n)
	}
	t.mu.Lock()
	t.dirKey, t.looked = key, start
	t.mu.Unlock()
}

func (t *NodeTokens) tokensDir() string { return filepath.Join(t.dir, pki.TokensDir) }

// lookAllDue reports whether the tokens directory may hold a change lookAll has not seen.
func (t *NodeTokens) lookAllDue() bool {
	var key fileKey
	if st, err := os.Stat(t.tokensDir()); err == nil {
		key = keyOf(st)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return key != t.dirKey || t.looked.Sub(time.Unix(0, key.mtime)) < racyWindow
}

// authorized reports whether token is node's current token.
func (t *NodeTokens) authorized(node, token string) bool {
	got := sha256.Sum256([]byte(token))
	want, ok := t.current(node)
	eq := subtle.ConstantTimeCompare(got[:], want.digest[:]) == 1
	return ok && token != "" && eq
}

// match returns the node whose known token's digest is got, comparing against every node's in
// constant time (the time depends on the number of nodes only).
func (t *NodeTokens) match(got [32]byte) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	found := ""
	for n, e := range t.entries {
		if subtle.ConstantTimeCompare(got[:], e.digest[:]) == 1 {
			found = n
		}
	}
	return found
}

// nodeFor returns the node whose current token is token.
func (t *NodeTokens) nodeFor(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	got := sha256.Sum256([]byte(token))
	n := t.match(got)
	if n == "" && t.dir != "" && t.lookAllDue() {
		t.lookAll()
		n = t.match(got)
	}
	if n == "" {
		return "", false
	}
	if t.dir != "" && !t.authorized(n, token) { // the file changed since: an old token
		return "", false
	}
	return n, true
}

// Refusal is the text of the 401 for token: for a token this process saw replaced or revoked, what
// happened to it and what the node needs; otherwise the general rule. It never says whether a node
// exists to someone who does not hold one of its tokens.
func (t *NodeTokens) Refusal(token string) string {
	const remedy = "a node gets its new token only through the appliance: a BMC-powered node by enrolling again " +
		"(the operator runs `appliance node reinstall NODE --yes`), an SSH node from `appliance bootstrap`, which installs hostagent with it"
	if token != "" {
		d := sha256.Sum256([]byte(token))
		t.mu.RLock()
		r, ok := t.retired[d]
		t.mu.RUnlock()
		if ok {
			what := "replaced at " + r.at.Format(time.RFC3339) + " (the node was installed or enrolled again, or `appliance node reinstall` ran)"
			if r.revoked {
				what = "revoked at " + r.at.Format(time.RFC3339) + " (`appliance node revoke`, or its token file was removed)"
			}
			return fmt.Sprintf("unauthorized: this token of node %s was %s and is never accepted again; %s",
				r.node, what, strings.Replace(remedy, "NODE", r.node, 1))
		}
	}
	return "unauthorized: send this node's current token as Authorization: Bearer <token> (never in the URL). " +
		"A node's token is replaced at every install, enrolment and `appliance node reinstall`, and removed by " +
		"`appliance node revoke`; an old one is never accepted again: " + remedy
}

// bearerChallenge is the WWW-Authenticate value of every 401 (RFC 6750 §3).
const bearerChallenge = `Bearer realm="appliance"`

// unauthorized answers 401 with the bearer challenge and text; the agent API and /ignition/ answer
// every bad token so (NodeTokens.Refusal).
func unauthorized(w http.ResponseWriter, text string) {
	w.Header().Set("WWW-Authenticate", bearerChallenge)
	http.Error(w, text, http.StatusUnauthorized)
}
