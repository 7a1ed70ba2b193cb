package bundlespec

import (
	"errors"
	"reflect"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/strictyaml"
)

// Decode strictly decodes one BundleSpecification YAML document. It does not apply defaults or run
// Validate. On failure it returns a nil specification and an ErrorList holding every problem found,
// each with its field path and line:
//   - YAML syntax errors, an empty input, or more than one document;
//   - an apiVersion or kind other than APIVersion and Kind (then nothing else is checked, since the
//     schema of another version is unknown);
//   - unknown keys (with the valid key it most likely misspells), duplicate keys, merge keys ("<<");
//   - values of the wrong shape (a string where a list belongs, a list where a mapping belongs) and
//     sizes that do not parse (output.partSize).
func Decode(data []byte) (*BundleSpecification, error) {
	s, r := decode(data)
	if len(r.Errors) > 0 {
		return nil, r.Errors
	}
	return s, nil
}

// decode is Decode that also returns the partially decoded specification when the errors are
// confined to fields (nil when r.Fatal), so that Load can run Validate and report everything at once.
func decode(data []byte) (*BundleSpecification, *strictyaml.Result) {
	s := &BundleSpecification{}
	r := decoder.Decode(data, s)
	if r.Fatal {
		return nil, r
	}
	s.lines = r.Lines
	return s, r
}

// decoder decodes BundleSpecification documents.
var decoder = &strictyaml.Decoder{
	APIVersion: APIVersion,
	Kind:       Kind,
	Empty: "the bundle specification is empty: it must be one YAML document starting with `apiVersion: " +
		APIVersion + "` and `kind: " + Kind + "`",
	Scalars: map[reflect.Type]strictyaml.ScalarType{
		reflect.TypeFor[Size](): {Want: "a size such as 4GiB", Parse: parseSizeScalar},
	},
	// Keys people are likely to write from other tools' vocabulary (apt's sources.list, Docker), and
	// this document's key for the same thing.
	Synonyms: map[string]string{
		"keyring":   "signedBy",
		"keyrings":  "signedBy",
		"uris":      "uri",
		"suites":    "suite",
		"addons":    "install",
		"registry":  "hosts",
		"mirror":    "mirrors",
		"ca":        "caFile",
		"repoKey":   "repoKeyFile",
		"bundleKey": "bundleKeyFile",
	},
}

// parseSizeScalar decodes a Size (ParseSize).
func parseSizeScalar(s strictyaml.Scalar) (any, error) {
	size, err := ParseSize(s.Text)
	if err != nil {
		return nil, errors.New(s.Quoted + " is not a size: " + strings.TrimPrefix(err.Error(), ErrSize.Error()+": "))
	}
	return size, nil
}
