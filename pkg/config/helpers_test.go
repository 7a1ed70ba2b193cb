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

	"github.com/airgap-appliance/appliance/pkg/strictyaml/strictyamltest"
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

// Error helpers shared with the other documents decoded by pkg/strictyaml.
var (
	errPaths   = strictyamltest.Paths   // sorted paths of errs
	findErr    = strictyamltest.Find    // first error at path, or nil
	requireErr = strictyamltest.Require // fails unless errs holds an error at path containing msg (at line, if > 0)
)

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

// fieldWant is an error a test expects: its field path and what its message must contain.
type fieldWant struct{ path, msg string }

// requireExactly asserts that errs hold exactly the paths of wants (no other path), each with an
// error whose message contains its msg.
func requireExactly(t *testing.T, errs ErrorList, wants []fieldWant) {
	t.Helper()
	var paths []string
	for _, w := range wants {
		requireErr(t, errs, w.path, w.msg, 0)
		paths = append(paths, w.path)
	}
	if got := errPaths(errs); strings.Join(got, ",") != strings.Join(slices.Sorted(slices.Values(paths)), ",") {
		t.Errorf("error paths %v, want %v; errors:\n%v", got, slices.Sorted(slices.Values(paths)), errs)
	}
}
