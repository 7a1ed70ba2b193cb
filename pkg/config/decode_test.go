package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const header = "apiVersion: appliance.airgap.dev/v1alpha1\nkind: BootstrapConfiguration\n"

// TestDecodeErrors asserts the path, line and message of every decoding error class.
func TestDecodeErrors(t *testing.T) {
	type want struct {
		path string
		line int
		msg  string
	}
	tests := []struct {
		name string
		doc  string
		want []want // exactly these errors, in order
	}{
		{"empty file", "", []want{{"", 0, "the configuration is empty"}}},
		{"only comments", "# nothing\n\n# here\n", []want{{"", 0, "the configuration is empty"}}},
		{"empty document", "---\n", []want{{"", 0, "the configuration is empty"}}},
		{"null document", "~\n", []want{{"", 1, "the configuration is empty"}}},
		{"two documents", header + "clusterName: a\n---\n" + header, []want{{"", 5, "a second YAML document starts here"}}},
		{"two documents, second broken", header + "---\n: : :\n", []want{{"", 0, "invalid YAML"}}},
		{"syntax error", header + "clusterName: [a\nnodes: x\n", []want{{"", 0, "invalid YAML"}}},
		{"tab indentation", header + "networks:\n\tpods: 10.0.0.0/8\n", []want{{"", 4, "invalid YAML: found character that cannot start any token"}}},
		{"list at the root", "- a\n- b\n", []want{{"", 1, "the document must be a mapping"}}},
		{"scalar at the root", "hello\n", []want{{"", 1, "the document must be a mapping"}}},
		{"missing apiVersion and kind", "clusterName: lab\n", []want{
			{"apiVersion", 1, "is required: add `apiVersion: appliance.airgap.dev/v1alpha1`"},
			{"kind", 1, "is required: add `kind: BootstrapConfiguration`"}}},
		{"wrong apiVersion", "apiVersion: appliance.airgap.dev/v1beta1\nkind: BootstrapConfiguration\nbogus: 1\n", []want{
			{"apiVersion", 1, `"appliance.airgap.dev/v1beta1" is not supported: this appliance reads appliance.airgap.dev/v1alpha1 only`}}},
		{"wrong kind", "apiVersion: appliance.airgap.dev/v1alpha1\nkind: ClusterConfiguration\n", []want{
			{"kind", 2, `"ClusterConfiguration" is not supported`}}},
		{"unknown top-level key", header + "clusterName: lab\nclustername: lab\n", []want{
			{"clustername", 4, `unknown field "clustername": did you mean "clusterName"?`}}},
		{"unknown nested key", header + "networks:\n  contolPlane:\n    cidrs: [10.0.0.0/24]\n", []want{
			{"networks.contolPlane", 4, `unknown field "contolPlane": did you mean "controlPlane"?`}}},
		{"unknown key without suggestion", header + "bundle:\n  url: x\n", []want{
			{"bundle.url", 4, `unknown field "url": valid keys here are path`}}},
		{"unknown key in a node", header + "nodes:\n- name: a\n  power:\n    kind: ssh\n    passwordFle: x\n", []want{
			{"nodes[0].power.passwordFle", 7, `did you mean "passwordFile"?`}}},
		{"unknown key, prefix of a valid one", header + "nodes:\n- power:\n    password: x\n", []want{
			{"nodes[0].power.password", 5, `did you mean "passwordFile"?`}}},
		{"duplicate key", header + "clusterName: a\nclusterName: b\n", []want{
			{"clusterName", 4, "duplicate key (first set at line 3)"}}},
		{"merge key", header + "base: &b {port: 1}\n", []want{{"base", 3, `unknown field "base"`}}},
		{"merge key inside", header + "server:\n  <<: {port: 1}\n", []want{{"server.<<", 4, "merge keys (<<) are not supported"}}},
		{"non-string key", header + "? [a, b]\n: c\n", []want{{"", 3, "keys must be plain strings, not a list"}}},
		{"bad CIDR", header + "networks:\n  controlPlane:\n    cidrs:\n    - 10.0.0.0/24\n    - 10.0.0.0/33\n", []want{
			{"networks.controlPlane.cidrs[1]", 7, `"10.0.0.0/33" is not a CIDR`}}},
		{"CIDR without length", header + "networks:\n  pods: 10.233.0.0\n", []want{
			{"networks.pods", 4, `"10.233.0.0" is not a CIDR: write a network address and prefix length`}}},
		{"cidrs not a list", header + "networks:\n  controlPlane:\n    cidrs: 10.0.0.0/24\n", []want{
			{"networks.controlPlane.cidrs", 5, "must be a list"}}},
		{"bad address", header + "apiServer:\n  vip: 10.0.0.300\n", []want{
			{"apiServer.vip", 4, `"10.0.0.300" is not an IP address`}}},
		{"address with prefix", header + "nodes:\n- addresses: [10.0.0.1/24]\n", []want{
			{"nodes[0].addresses[0]", 4, `"10.0.0.1/24" is not an IP address`}}},
		{"address with zone", header + "server:\n  listenAddress: fe80::1%eth0\n", []want{
			{"server.listenAddress", 4, "no %zone"}}},
		{"port as quoted string", header + "apiServer:\n  port: \"6443\"\n", []want{
			{"apiServer.port", 4, `"6443" is not valid: write an integer from 1 to 65535 (without quotes)`}}},
		{"port as word", header + "server:\n  port: https\n", []want{
			{"server.port", 4, `"https" is not valid: write an integer from 1 to 65535`}}},
		{"port too large", header + "server:\n  port: 65536\n", []want{
			{"server.port", 4, "65536 is not valid: write an integer from 1 to 65535"}}},
		{"port negative", header + "server:\n  port: -1\n", []want{{"server.port", 4, "-1 is not valid"}}},
		{"port explicit zero", header + "server:\n  port: 0\n", []want{
			{"server.port", 4, "0 is not valid: write an integer from 1 to 65535; omit the key to use the default"}}},
		{"port float", header + "server:\n  port: 8443.5\n", []want{{"server.port", 4, "8443.5 is not valid"}}},
		{"port as list", header + "server:\n  port: [1]\n", []want{{"server.port", 4, "must be an integer from 1 to 65535, not a list"}}},
		{"virtualRouterID 256", header + "apiServer:\n  keepalived:\n    virtualRouterID: 256\n", []want{
			{"apiServer.keepalived.virtualRouterID", 5, "256 is not valid: write an integer from 1 to 255"}}},
		{"virtualRouterID 0", header + "apiServer:\n  keepalived:\n    virtualRouterID: 0\n", []want{
			{"apiServer.keepalived.virtualRouterID", 5, "omit the key to use the default"}}},
		{"bool as word", header + "apiServer:\n  keepalived:\n    enabled: maybe\n", []want{
			{"apiServer.keepalived.enabled", 5, `"maybe" is not a boolean: write true or false`}}},
		{"string as mapping", header + "clusterName: {a: b}\n", []want{{"clusterName", 3, "must be a string, not a mapping"}}},
		{"mapping as string", header + "networks: 10.0.0.0/8\n", []want{{"networks", 3, "must be a mapping of key: value"}}},
		{"several at once", header + "clusterNme: a\nnetworks:\n  pods: x\n  services: y\napiServer:\n  port: z\n", []want{
			{"clusterNme", 3, `did you mean "clusterName"?`},
			{"networks.pods", 5, `"x" is not a CIDR`},
			{"networks.services", 6, `"y" is not a CIDR`},
			{"apiServer.port", 8, `"z" is not valid`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Decode([]byte(tt.doc))
			if c != nil {
				t.Errorf("Decode returned a configuration along with errors")
			}
			var list ErrorList
			if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode error = %v (%T), want an ErrorList matching ErrInvalid", err, err)
			}
			if len(list) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(list), len(tt.want), list)
			}
			for i, w := range tt.want {
				g := list[i]
				if g.Path != w.path || (w.line != 0 && g.Line != w.line) || !strings.Contains(g.Msg, w.msg) {
					t.Errorf("error %d = {%q, line %d, %q}, want {%q, line %d, containing %q}", i, g.Path, g.Line, g.Msg, w.path, w.line, w.msg)
				}
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		check func(t *testing.T, c *BootstrapConfiguration)
	}{
		{"nulls and empty strings leave fields unset", header + "apiServer:\n  vip: \"\"\n  port: ~\n  keepalived:\nnetworks:\n  pods: null\nnodes: []\n",
			func(t *testing.T, c *BootstrapConfiguration) {
				if c.APIServer.VIP.IsValid() || c.APIServer.Port != 0 || c.APIServer.Keepalived.Enabled != nil || c.Networks.Pods.IsValid() {
					t.Errorf("null/empty values were not left unset: %+v", c.APIServer)
				}
			}},
		{"aliases", header + "networks:\n  controlPlane:\n    cidrs: &net [10.1.0.0/24]\n  workloadPlane:\n    cidrs: *net\n",
			func(t *testing.T, c *BootstrapConfiguration) {
				if got := c.Networks.WorkloadPlane.CIDRs; len(got) != 1 || got[0].String() != "10.1.0.0/24" {
					t.Errorf("alias not followed: %v", got)
				}
			}},
		{"keepalived disabled", header + "apiServer:\n  keepalived:\n    enabled: false\n",
			func(t *testing.T, c *BootstrapConfiguration) {
				if c.APIServer.Keepalived.IsEnabled() {
					t.Error("enabled: false decoded as enabled")
				}
			}},
		{"hex and octal integers", header + "server:\n  port: 0x20FB\napiServer:\n  keepalived:\n    virtualRouterID: 0o77\n",
			func(t *testing.T, c *BootstrapConfiguration) {
				if c.Server.Port != 8443 || c.APIServer.Keepalived.VirtualRouterID != 63 {
					t.Errorf("port %d vrid %d, want 8443 and 63", c.Server.Port, c.APIServer.Keepalived.VirtualRouterID)
				}
			}},
		{"IPv6", header + "networks:\n  controlPlane: {cidrs: [\"fd00:100::/64\"]}\napiServer:\n  vip: fd00:100::100\n",
			func(t *testing.T, c *BootstrapConfiguration) {
				if c.APIServer.VIP.String() != "fd00:100::100" || c.Networks.ControlPlane.CIDRs[0].String() != "fd00:100::/64" {
					t.Errorf("IPv6 decoded wrong: %v %v", c.APIServer.VIP, c.Networks.ControlPlane.CIDRs)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Decode([]byte(tt.doc))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			tt.check(t, c)
		})
	}
}

// TestLoadReportsEverythingAtOnce: decoding errors (unknown key, bad CIDR, quoted port) and validation
// errors (duplicate node, VIP outside the control plane, missing power) come out of one Load, in
// document order, with lines; a field that failed to decode is not reported a second time.
func TestLoadReportsEverythingAtOnce(t *testing.T) {
	doc := header + `clusterName: lab
networks:
  controlPlane:
    cidrs: [10.100.0.0/24, 10.100.1.0/33]
  services: 10.96.0.0/16
apiServer:
  vip: 10.9.0.100
  port: "6443"
bundle:
  path: /srv/bundle
colour: blue
nodes:
- name: cp1
  roles: [control-plane]
  addresses: [10.100.0.11]
  power: {kind: ssh, privateKeyFile: /k, knownHostsFile: /kh}
- name: cp1
  roles: [control-plane]
  addresses: [not-an-ip]
`
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, warnings, err := Load(path, ValidateOptions{})
	if c != nil {
		t.Error("Load returned a configuration along with errors")
	}
	var list ErrorList
	if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Load error = %v (%T), want ErrorList", err, err)
	}
	want := []struct {
		path string
		line int
		msg  string
	}{
		{"networks.controlPlane.cidrs[1]", 6, `"10.100.1.0/33" is not a CIDR`},
		{"apiServer.vip", 9, "10.9.0.100 is outside every networks.controlPlane.cidrs"},
		{"apiServer.port", 10, `"6443" is not valid`},
		{"bundle.publicKeys", 11, "is required: pin the public key"},
		{"colour", 13, `unknown field "colour"`},
		{"nodes", 14, "etcd"}, // the warning; checked below
		{"nodes[1].name", 19, `"cp1" is also nodes[0].name`},
		{"nodes[1].power", 19, "is required"},
		{"nodes[1].addresses[0]", 21, `"not-an-ip" is not an IP address`},
	}
	var gotErrs int
	for _, w := range want {
		if w.path == "nodes" {
			if len(warnings) != 1 || warnings[0].Path != "nodes" || !strings.Contains(warnings[0].Msg, "quorum") || warnings[0].Line != w.line {
				t.Errorf("warnings = %v, want the even-control-plane warning at nodes (line %d)", ErrorList(warnings), w.line)
			}
			continue
		}
		gotErrs++
		requireErr(t, list, w.path, w.msg, w.line)
	}
	if len(list) != gotErrs {
		t.Errorf("got %d errors, want %d:\n%v", len(list), gotErrs, list)
	}
	for i := 1; i < len(list); i++ {
		if list[i].Line < list[i-1].Line {
			t.Errorf("errors not in document order:\n%v", list)
			break
		}
	}
	if !strings.Contains(err.Error(), "networks.controlPlane.cidrs[1]: \"10.100.1.0/33\" is not a CIDR: write a network address and prefix length, e.g. 10.0.0.0/24 (line 6)\n") {
		t.Errorf("rendered error list:\n%s", err)
	}
}

func TestLoadReadErrors(t *testing.T) {
	_, _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), ValidateOptions{})
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("missing file: err = %v, want one wrapping fs.ErrNotExist and not ErrInvalid", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(big, ValidateOptions{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file: err = %v", err)
	}
}

func TestFieldErrorFormat(t *testing.T) {
	tests := []struct {
		e    FieldError
		want string
	}{
		{FieldError{Path: "networks.controlPlane.cidrs[1]", Line: 7, Msg: `"10.0.0.0/33" is not a CIDR`}, `networks.controlPlane.cidrs[1]: "10.0.0.0/33" is not a CIDR (line 7)`},
		{FieldError{Path: "clusterName", Msg: "is required"}, "clusterName: is required"},
		{FieldError{Line: 3, Msg: "invalid YAML: x"}, "invalid YAML: x (line 3)"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	list := ErrorList{&tests[0].e, &tests[1].e}
	if got := list.Error(); got != tests[0].want+"\n"+tests[1].want {
		t.Errorf("ErrorList.Error() = %q", got)
	}
	var fe *FieldError
	if !errors.As(error(list), &fe) || fe.Path != "networks.controlPlane.cidrs[1]" {
		t.Errorf("errors.As(ErrorList, *FieldError) = %v", fe)
	}
}
