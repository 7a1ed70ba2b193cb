package ignition

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/coreos/go-semver/semver"
	"github.com/coreos/ignition/v2/config/v3_3"
	"github.com/coreos/ignition/v2/config/v3_4"
	translate34 "github.com/coreos/ignition/v2/config/v3_4/translate"
	"github.com/coreos/ignition/v2/config/v3_5"
	translate35 "github.com/coreos/ignition/v2/config/v3_5/translate"
	"github.com/coreos/ignition/v2/config/validate"
	"github.com/coreos/vcontext/report"
)

// Marshal returns the node's config in spec version (one of SupportedVersions, normally from
// Negotiate) as indented JSON, plus warnings to log (e.g. unknown keys in snippets, which Ignition
// itself only warns about). The base is translated up with Ignition's translators
// (v3_4/translate, v3_5/translate); each snippet is parsed with that version's
// ParseCompatibleVersion and merged over it in order with that version's Merge (base as parent,
// snippet as child); the result is validated again. The same Config and version always give the
// same bytes.
//
// Errors: a version not in SupportedVersions, or a snippet declaring a newer spec than version,
// wraps ErrNotAcceptable (naming the snippet and both versions); a snippet that fails to parse wraps
// ErrInvalidSnippet; a merged config that fails validation wraps ErrInvalidConfig.
func (c *Config) Marshal(version string) ([]byte, []string, error) {
	switch version {
	case "3.3.0":
		return marshalAs(c, version, c.base, v3_3.ParseCompatibleVersion, v3_3.Merge)
	case "3.4.0":
		return marshalAs(c, version, translate34.Translate(c.base), v3_4.ParseCompatibleVersion, v3_4.Merge)
	case "3.5.0":
		return marshalAs(c, version, translate35.Translate(translate34.Translate(c.base)), v3_5.ParseCompatibleVersion, v3_5.Merge)
	}
	return nil, nil, fmt.Errorf("%w: spec version %q is not one of %s", ErrNotAcceptable, version, strings.Join(SupportedVersions, ", "))
}

// marshalAs merges the snippets over base (already in spec version) and validates and serialises
// the result. T is one of the vX_Y/types.Config types.
func marshalAs[T any](c *Config, version string, base T,
	parse func([]byte) (T, report.Report, error), merge func(parent, child T) T,
) ([]byte, []string, error) {
	target := *semver.New(version)
	var warnings []string
	cfg := base
	for _, s := range c.snippets {
		if target.LessThan(s.version) {
			return nil, nil, fmt.Errorf("%w: node %q: snippet %q declares Ignition spec %s, but the client accepts at most %s: set its ignition.version to %s if it uses no newer feature, or boot the node with a newer Ignition",
				ErrNotAcceptable, c.node, s.name, s.version, version, version)
		}
		child, rpt, err := parse(s.data)
		if err != nil {
			return nil, nil, fmt.Errorf("%w %q (as spec %s): %w: %s", ErrInvalidSnippet, s.name, version, err, strings.TrimSpace(rpt.String()))
		}
		warnings = append(warnings, reportLines("snippet "+quote(s.name), rpt)...)
		cfg = merge(cfg, child)
	}

	rpt := validate.ValidateWithContext(cfg, nil)
	if rpt.IsFatal() {
		names := make([]string, 0, len(c.snippets))
		for _, s := range c.snippets {
			names = append(names, quote(s.name))
		}
		return nil, nil, fmt.Errorf("%w: node %q, spec %s, after merging snippets [%s]: %s",
			ErrInvalidConfig, c.node, version, strings.Join(names, ", "), strings.TrimSpace(rpt.String()))
	}
	warnings = append(warnings, reportLines("merged config", rpt)...)

	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("encode Ignition %s config for node %q: %w", version, c.node, err)
	}
	return append(out, '\n'), slices.Clip(warnings), nil
}

// reportLines turns the non-fatal entries of an Ignition report into "<prefix>: <entry>" lines.
func reportLines(prefix string, rpt report.Report) []string {
	var out []string
	for _, e := range rpt.Entries {
		if !e.Kind.IsFatal() {
			out = append(out, prefix+": "+e.String())
		}
	}
	return out
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
