package ignition

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"
)

// upstreamServer maps a registry host to the URL containerd uses when no mirror answers
// (containerd docs/hosts.md: docker.io is served by registry-1.docker.io).
func upstreamServer(registry string) string {
	if registry == "docker.io" {
		return "https://registry-1.docker.io"
	}
	return "https://" + registry
}

// hostsTemplate is containerd's registry host configuration (containerd docs/hosts.md,
// /etc/containerd/certs.d/<registry>/hosts.toml). No TOML library is a dependency of this module,
// so it is a template whose every string goes through tomlString.
var hostsTemplate = template.Must(template.New("hosts.toml").Funcs(template.FuncMap{"toml": tomlString}).Parse(
	`# Written by the air-gap appliance: pull {{.Registry}} images through the appliance mirror.
server = {{toml .Server}}

[host.{{toml .Endpoint}}]
  capabilities = ["pull", "resolve"]
  ca = {{toml .CA}}
  override_path = true
`))

// hostsTOML renders the hosts.toml for one mirror (validated by checkParams).
func hostsTOML(m Mirror) []byte {
	var b bytes.Buffer
	err := hostsTemplate.Execute(&b, struct{ Registry, Server, Endpoint, CA string }{
		Registry: m.Registry, Server: upstreamServer(m.Registry), Endpoint: m.Endpoint, CA: ContainerdCAPath,
	})
	if err != nil { // only a broken template can fail, and a test executes it
		panic(fmt.Sprintf("hosts.toml template: %v", err))
	}
	return b.Bytes()
}

// tomlString quotes s as a TOML basic string (TOML 1.0 "Basic strings": escape quote, backslash
// and control characters).
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
