package config

import (
	"crypto/ed25519"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/crypto/ssh"
)

// cmpConfig compares configurations ignoring the recorded source lines and nil-vs-empty slices.
var cmpConfig = []cmp.Option{cmpopts.IgnoreUnexported(BootstrapConfiguration{}), cmpopts.EquateEmpty(),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}

// labConfig decodes testdata/lab.yaml and applies defaults.
func labConfig(t testing.TB) *BootstrapConfiguration {
	t.Helper()
	data, err := os.ReadFile("testdata/lab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Decode(data)
	if err != nil {
		t.Fatalf("Decode(lab.yaml): %v", err)
	}
	SetDefaults(c)
	return c
}

// errPaths returns the sorted paths of errs.
func errPaths(errs []*FieldError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Path)
	}
	slices.Sort(out)
	return out
}

// findErr returns the first error at path, or nil.
func findErr(errs []*FieldError, path string) *FieldError {
	for _, e := range errs {
		if e.Path == path {
			return e
		}
	}
	return nil
}

// requireErr fails unless errs holds an error at path whose message contains msg (and, when line > 0,
// whose line is line).
func requireErr(t *testing.T, errs []*FieldError, path, msg string, line int) {
	t.Helper()
	for _, e := range errs {
		if e.Path == path && strings.Contains(e.Msg, msg) && (line == 0 || e.Line == line) {
			return
		}
	}
	t.Errorf("no error at %s containing %q (line %d); got:\n%s", path, msg, line, ErrorList(errs).Error())
}

// testHostKey returns a deterministic ed25519 public key as one authorized_keys line, and the private key.
func testHostKey(t testing.TB) (string, ed25519.PrivateKey) {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))), priv
}
