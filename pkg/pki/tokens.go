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

// EnsureNodeTokens makes dir/tokens hold one bearer token per node and returns node name → token.
//
// A token is 256 random bits from crypto/rand, encoded base64url without padding (RFC 4648 §5; 43
// characters), stored alone in tokens/<node> with mode 0600. An existing token is reused unchanged (a
// node may already hold it); a file with the wrong mode is rewritten 0600. Tokens of nodes not in nodes
// are left in place and only their node names are reported in Outcome.Detail; tokens themselves never
// appear in Detail or errors.
//
// Node names must be RFC 1123 subdomains (as Kubernetes node names); duplicates are ignored. A token file
// that is not a 256-bit base64url token returns an error wrapping ErrConflict naming the file: it is not
// regenerated, because a node may be configured with it.
func EnsureNodeTokens(dir string, nodes []string) (map[string]string, Outcome, error) {
	for _, n := range nodes {
		if len(n) > 253 || !nodeNameRE.MatchString(n) {
			return nil, Outcome{}, fmt.Errorf("node token: node name %q is not a lowercase RFC 1123 DNS subdomain", n)
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
