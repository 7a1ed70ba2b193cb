package bundlespec

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/airgap-appliance/appliance/pkg/strictyaml"
	"github.com/airgap-appliance/appliance/pkg/strictyaml/strictyamltest"
)

// header is the type metadata every test document starts with.
const header = "apiVersion: appliance.airgap.dev/v1alpha1\nkind: BundleSpecification\n"

// cmpSpec compares specifications ignoring the recorded source lines and nil-vs-empty slices and maps.
var cmpSpec = []cmp.Option{cmpopts.IgnoreUnexported(BundleSpecification{}), cmpopts.EquateEmpty()}

// Error helpers shared with the other documents decoded by pkg/strictyaml.
var (
	errPaths   = strictyamltest.Paths   // sorted paths of errs
	findErr    = strictyamltest.Find    // first error at path, or nil
	requireErr = strictyamltest.Require // fails unless errs holds an error at path containing msg (at line, if > 0)
	pathCovers = strictyaml.Covers
	parentPath = strictyaml.ParentPath
)

// mustDecode decodes doc and applies defaults.
func mustDecode(t testing.TB, doc string) *BundleSpecification {
	t.Helper()
	s, err := Decode([]byte(doc))
	if err != nil {
		t.Fatalf("Decode: %v\n%s", err, doc)
	}
	SetDefaults(s)
	return s
}
