package config

import (
	"fmt"
	"net/netip"
	"reflect"
	"time"

	"github.com/airgap-appliance/appliance/pkg/strictyaml"
)

// Decode strictly decodes one BootstrapConfiguration YAML document. It does not apply defaults or
// run Validate. On failure it returns a nil configuration and an ErrorList holding every problem
// found, each with its field path and line:
//   - YAML syntax errors, an empty input, or more than one document;
//   - an apiVersion or kind other than APIVersion and Kind (then nothing else is checked, since the
//     schema of another version is unknown);
//   - unknown keys, duplicate keys, merge keys ("<<");
//   - values of the wrong shape (a list where a mapping belongs, a quoted "6443" for a port) and values
//     that do not parse (CIDRs, IP addresses, integers out of range, an explicit 0 where 0 is not a
//     valid value).
func Decode(data []byte) (*BootstrapConfiguration, error) {
	c, r := decode(data)
	if len(r.Errors) > 0 {
		return nil, r.Errors
	}
	return c, nil
}

// decode is Decode that also returns the partially decoded configuration when the errors are
// confined to fields (nil when r.Fatal), so that Load can run Validate and report everything at once.
func decode(data []byte) (*BootstrapConfiguration, *strictyaml.Result) {
	c := &BootstrapConfiguration{}
	r := decoder.Decode(data, c)
	if r.Fatal {
		return nil, r
	}
	c.lines = r.Lines
	return c, r
}

// decoder decodes BootstrapConfiguration documents. A struct field tagged `strictyaml:"nonzero"`
// rejects an explicit 0 (0 means "unset, use the default" in Go, so it may not be written).
var decoder = &strictyaml.Decoder{
	APIVersion: APIVersion,
	Kind:       Kind,
	Empty: "the configuration is empty: it must be one YAML document starting with `apiVersion: " +
		APIVersion + "` and `kind: " + Kind + "` (`appliance config defaults` prints a complete example)",
	Scalars: map[reflect.Type]strictyaml.ScalarType{
		reflect.TypeFor[netip.Prefix]():  {Want: "a CIDR such as 10.0.0.0/24", Parse: parsePrefix},
		reflect.TypeFor[netip.Addr]():    {Want: "an IP address such as 10.0.0.1", Parse: parseAddr},
		reflect.TypeFor[time.Duration](): {Want: "a duration such as 250ms", Parse: parseDuration},
	},
}

// parseDuration decodes a positive duration in Go's notation (time.ParseDuration: "250ms", "1s",
// "1m30s"); "" leaves the field unset. A bare number is refused: its unit would be a guess.
func parseDuration(s strictyaml.Scalar) (any, error) {
	if s.Text == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(s.Text)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s is not a duration: write a number with its unit, e.g. 250ms or 1s", s.Quoted)
	case d <= 0:
		return nil, fmt.Errorf("%s is not a positive duration: write one such as 250ms or 1s, or leave the field out for the default", s.Quoted)
	}
	return d, nil
}

// parsePrefix decodes a CIDR; "" leaves the field unset.
func parsePrefix(s strictyaml.Scalar) (any, error) {
	if s.Text == "" {
		return nil, nil
	}
	p, err := netip.ParsePrefix(s.Text)
	if err != nil {
		return nil, fmt.Errorf("%q is not a CIDR: write a network address and prefix length, e.g. 10.0.0.0/24", s.Text)
	}
	return p, nil
}

// parseAddr decodes an IP address without zone; "" leaves the field unset.
func parseAddr(s strictyaml.Scalar) (any, error) {
	if s.Text == "" {
		return nil, nil
	}
	a, err := netip.ParseAddr(s.Text)
	if err != nil || a.Zone() != "" {
		return nil, fmt.Errorf("%q is not an IP address: write a plain IPv4 or IPv6 address (no prefix length, no %%zone), e.g. 10.0.0.1", s.Text)
	}
	return a, nil
}
