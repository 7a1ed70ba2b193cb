package config

import "github.com/airgap-appliance/appliance/pkg/strictyaml"

// The error types are pkg/strictyaml's, shared by every document of the appliance, so that the CLI
// reports them all the same way: `path: message (line N)`, one per line.
type (
	// FieldError is one problem with one field of the document: Path (the field path in YAML keys,
	// e.g. "networks.controlPlane.cidrs[1]" or "nodes[0].power.kind"; empty for problems with the
	// document as a whole), Line (1-based, 0 when unknown) and Msg (what is wrong and what to do).
	FieldError = strictyaml.FieldError
	// ErrorList is every error found in a document. It implements error (one FieldError per line),
	// matches ErrInvalid with errors.Is and yields its *FieldError values to errors.As.
	ErrorList = strictyaml.ErrorList
)

// ErrInvalid is matched (errors.Is) by every ErrorList: the configuration was read but is not valid.
var ErrInvalid = strictyaml.ErrInvalid
