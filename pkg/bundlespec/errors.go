package bundlespec

import "github.com/airgap-appliance/appliance/pkg/strictyaml"

// The error types are pkg/strictyaml's (as pkg/config's are), so that the CLI reports every document
// of the appliance the same way: `path: message (line N)`, one per line.
type (
	// FieldError is one problem with one field: Path (field path, "" for the document as a whole),
	// Line (1-based, 0 when unknown) and Msg (what is wrong and what to do).
	FieldError = strictyaml.FieldError
	// ErrorList is every error found in a document; it matches ErrInvalid with errors.Is and yields
	// its *FieldError values to errors.As.
	ErrorList = strictyaml.ErrorList
)

// ErrInvalid is matched (errors.Is) by every ErrorList this package returns: the specification was
// read but is not valid.
var ErrInvalid = strictyaml.ErrInvalid
