package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// tokenBytes is the entropy of one node token: 256 bits.
const tokenBytes = 32

// nodeNameRE is an RFC 1123 DNS subdomain (lowercase), the same rule Kubernetes applies to node names;
// it also guarantees a safe file name (no "/", no leading ".").
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// The token lifecycle (issue 34 item 2). STATE/pki/tokens/<node> is the one place a node's token
// lives; `appliance serve` reads it there on every authentication (pkg/server.NodeTokensIn), so a
// change takes effect at once without a restart, and the rendered files that embed a token
// (hostagent.yaml, the Ignition configs) are served with the current one:
//
//	EnsureNodeTokens  (pki phase)  creates a missing token, reuses an existing one
//	RotateNodeToken   a new token replaces the old one: at every enrolment that binds a new
//	                  machine key (a network (re)install), at `appliance node reinstall`, and when
//	                  the power phase installs hostagent over SSH
//	RevokeNodeToken   `appliance node revoke`: the file is removed, nothing authenticates as the node
//	                  until one of the above gives it a new token
//
// A replaced or removed token stops working at the next request that presents it.

// EnsureNodeTokens makes dir/tokens hold one bearer token per node and returns node name → token.
//
// A token is 256 random bits from crypto/rand, encoded base64url without padding (RFC 4648 §5; 43
// characters), stored alone in tokens/<node> with mode 0600. An existing token is reused unchanged (a
// node may already hold it: only RotateNodeToken replaces it); a missing one (a new node, or one
// revoked by RevokeNodeToken) is created, and reaches a node only through an enrolment or an install
// over SSH; a file with the wrong mode is rewritten 0600. Tokens of nodes not in nodes
// are left in place and only their node names are reported in Outcome.Detail; tokens themselves never
// appear in Detail or errors.
//
// Node names must be RFC 1123 subdomains (as Kubernetes node names); duplicates are ignored. A token file
// that is not a 256-bit base64url token returns an error wrapping ErrConflict naming the file: it is not
// regenerated, because a node may be configured with it.
func EnsureNodeTokens(dir string, nodes []string) (map[string]string, Outcome, error) {
	for _, n := range nodes {
		if err := checkNodeName(n); err != nil {
			return nil, Outcome{}, err
		}
	}
	tokDir := joinPath(dir, TokensDir)
	tokens := make(map[string]string, len(nodes))
	var created, reused, fixed int
	for _, n := range nodes {
		if _, seen := tokens[n]; seen {
			continue
		}
		path := joinPath(tokDir, n)
		data, have, err := readOptional(path)
		if err != nil {
			return nil, Outcome{}, fmt.Errorf("node token: %w", err)
		}
		if have {
			tok := strings.TrimSpace(string(data))
			if !validToken(tok) {
				return nil, Outcome{}, conflict(path, "not a 256-bit base64url token",
					"restore it from backup, or delete it to issue a new token (the node must then get the new one)")
			}
			changed, err := atomicfile.Write(path, data, 0o600) // only rewrites when the mode is wrong
			if err != nil {
				return nil, Outcome{}, fmt.Errorf("node token for %s: %w", n, err)
			}
			if changed {
				fixed++
			}
			tokens[n] = tok
			reused++
			continue
		}
		tok, err := newToken()
		if err != nil {
			return nil, Outcome{}, err
		}
		if _, err := atomicfile.Write(path, []byte(tok+"\n"), 0o600); err != nil {
			return nil, Outcome{}, fmt.Errorf("node token for %s: %w", n, err)
		}
		tokens[n] = tok
		created++
	}

	stale, err := unlistedTokens(tokDir, tokens)
	if err != nil {
		return nil, Outcome{}, err
	}
	var parts []string
	if created > 0 {
		parts = append(parts, "created "+plural(created, "node token"))
	}
	if reused > 0 {
		parts = append(parts, "reused "+plural(reused, "node token"))
	}
	if fixed > 0 {
		parts = append(parts, fmt.Sprintf("set mode 0600 on %d", fixed))
	}
	if len(stale) > 0 {
		parts = append(parts, fmt.Sprintf("left %s of unlisted nodes in place (%s)", plural(len(stale), "token"), strings.Join(stale, ", ")))
	}
	detail := joinNonEmpty(", ", parts...)
	if detail == "" {
		detail = "no node tokens"
	}
	return tokens, Outcome{Changed: created+fixed > 0, Detail: detail}, nil
}

// NodeTokenPath is dir/tokens/<node>: node's token file (0600) in the PKI directory dir.
func NodeTokenPath(dir, node string) string { return joinPath(joinPath(dir, TokensDir), node) }

// checkNodeName refuses a node name that is not a lowercase RFC 1123 subdomain (and so not a safe
// file name).
func checkNodeName(n string) error {
	if len(n) > 253 || !nodeNameRE.MatchString(n) {
		return fmt.Errorf("node token: node name %q is not a lowercase RFC 1123 DNS subdomain", n)
	}
	return nil
}

// RotateNodeToken gives node a new token: 256 new random bits (as EnsureNodeTokens makes them)
// written to dir/tokens/<node> atomically with mode 0600 (pkg/atomicfile: temporary file, fsync,
// rename, fsync of the directory), replacing the old token or creating the first one. It returns
// the new token; the old one is refused by `appliance serve` from its next use on. Errors: a node
// name that is not an RFC 1123 subdomain, file system errors (the old token is then still in place).
// The token never appears in an error.
func RotateNodeToken(dir, node string) (string, error) {
	if err := checkNodeName(node); err != nil {
		return "", err
	}
	tok, err := newToken()
	if err != nil {
		return "", err
	}
	if _, err := atomicfile.Write(NodeTokenPath(dir, node), []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("rotate the node token of %s: %w", node, err)
	}
	return tok, nil
}

// RevokeNodeToken removes node's token file dir/tokens/<node> and fsyncs the directory, so that
// nothing authenticates as node until RotateNodeToken (an enrolment, a reinstall) or
// EnsureNodeTokens (the next `appliance bootstrap`, which hands the new token only to an SSH install)
// gives it a new one. It reports whether there was a token to remove. Errors: a bad node name, file
// system errors.
func RevokeNodeToken(dir, node string) (bool, error) {
	if err := checkNodeName(node); err != nil {
		return false, err
	}
	path := NodeTokenPath(dir, node)
	err := os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("revoke the node token of %s: %w", node, err)
	}
	if d, err := os.Open(joinPath(dir, TokensDir)); err == nil {
		err = d.Sync()
		_ = d.Close()
		if err != nil {
			return true, fmt.Errorf("revoke the node token of %s: sync %s: %w", node, joinPath(dir, TokensDir), err)
		}
	}
	return true, nil
}

// ReadNodeToken returns node's current token from dir/tokens/<node>; found is false when there is
// none (never created, or revoked). Errors: a bad node name, a file that is not a 256-bit base64url
// token (wrapping ErrConflict), file system errors.
func ReadNodeToken(dir, node string) (tok string, found bool, err error) {
	if err := checkNodeName(node); err != nil {
		return "", false, err
	}
	path := NodeTokenPath(dir, node)
	data, have, err := readOptional(path)
	if err != nil || !have {
		return "", false, err
	}
	tok = strings.TrimSpace(string(data))
	if !validToken(tok) {
		return "", false, conflict(path, "not a 256-bit base64url token", "delete it and run `appliance node reinstall` (or `appliance bootstrap` for an SSH node) to issue a new one")
	}
	return tok, true, nil
}

// VerifyToken reports whether got equals the expected token want, in time independent of their contents
// and lengths (both are hashed with SHA-256, then compared with crypto/subtle). An empty want never
// matches.
func VerifyToken(want, got string) bool {
	if want == "" {
		return false
	}
	w, g := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(w[:], g[:]) == 1
}

func newToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate node token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func validToken(tok string) bool {
	b, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	return err == nil && len(b) == tokenBytes
}

// unlistedTokens returns the sorted names of token files in tokDir for nodes not in listed. Hidden files
// (atomicfile's temporaries) are skipped.
func unlistedTokens(tokDir string, listed map[string]string) ([]string, error) {
	ents, err := os.ReadDir(tokDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list node tokens: %w", err)
	}
	var stale []string
	for _, e := range ents {
		name := e.Name()
		if _, ok := listed[name]; ok || strings.HasPrefix(name, ".") || !e.Type().IsRegular() {
			continue
		}
		stale = append(stale, name)
	}
	slices.Sort(stale)
	return stale, nil
}
