// Package containerd renders the files that make containerd pull images through the appliance's
// registry mirror: one hosts.toml per source registry under /etc/containerd/certs.d (containerd
// docs/hosts.md) and the CRI plugin's registry config_path in /etc/containerd/config.toml.
//
// No TOML library is a dependency of this module: hosts.toml is a template whose every string goes
// through TOMLString, and SetConfigPath edits config.toml as text, touching only the one key it owns
// (see there). Both pkg/ignition (first boot) and the hostagent (every boot) use this package, so the
// node gets the same bytes from either.
package containerd

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// Paths on the node.
const (
	// CertsDir is containerd's hosts directory, the CRI registry config_path.
	CertsDir = "/etc/containerd/certs.d"
	// CAPath is the appliance CA each hosts.toml names for the mirror.
	CAPath = CertsDir + "/appliance-ca.crt"
	// ConfigPath is containerd's main configuration file.
	ConfigPath = "/etc/containerd/config.toml"
)

// UpstreamServer maps a registry host[:port] to the URL containerd falls back to when no mirror
// answers (containerd docs/hosts.md: docker.io is served by registry-1.docker.io).
func UpstreamServer(registry string) string {
	if registry == "docker.io" {
		return "https://registry-1.docker.io"
	}
	return "https://" + registry
}

// hostsTemplate is containerd's registry host configuration (containerd docs/hosts.md,
// CertsDir/<registry>/hosts.toml).
var hostsTemplate = template.Must(template.New("hosts.toml").Funcs(template.FuncMap{"toml": TOMLString}).Parse(
	`# Written by the air-gap appliance: pull {{.Registry}} images through the appliance mirror.
server = {{toml .Server}}
{{range .Endpoints}}
[host.{{toml .}}]
  capabilities = ["pull", "resolve"]
  ca = {{toml $.CA}}
  override_path = true
{{end}}`))

// HostsTOML renders CertsDir/<registry>/hosts.toml: pull and resolve registry's images from endpoint
// (the appliance's https URL for that registry's namespace, e.g.
// "https://10.0.0.1:8443/v2/registry.k8s.io"; override_path because it already names the /v2/
// prefix), trusting the CA certificate at caPath (usually CAPath). Every value is quoted as a TOML
// basic string, so any input yields valid TOML; callers validate registry and endpoint (pkg/ignition
// does) because containerd would treat a nonsense value as an unreachable host.
func HostsTOML(registry, endpoint, caPath string) []byte {
	return HostsTOMLEndpoints(registry, []string{endpoint}, caPath)
}

// HostsTOMLEndpoints is HostsTOML with several mirrors of the same content, one [host] table each:
// containerd tries them in order and moves to the next when one fails (docs/hosts.md: "hosts are
// tried in the order listed"). After the hand-off these are the control planes' in-cluster mirrors.
func HostsTOMLEndpoints(registry string, endpoints []string, caPath string) []byte {
	var b bytes.Buffer
	err := hostsTemplate.Execute(&b, struct {
		Registry, Server, CA string
		Endpoints            []string
	}{
		Registry: registry, Server: UpstreamServer(registry), Endpoints: endpoints, CA: caPath,
	})
	if err != nil { // only a broken template can fail, and a test executes it
		panic(fmt.Sprintf("hosts.toml template: %v", err))
	}
	return b.Bytes()
}

// TOMLString quotes s as a TOML basic string (TOML 1.0 "Basic strings": escape quote, backslash
// and control characters).
func TOMLString(s string) string {
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

// ErrUnsupportedConfig is wrapped by SetConfigPath when it cannot edit config.toml safely.
var ErrUnsupportedConfig = errors.New("unsupported containerd config.toml")

var (
	versionLine = regexp.MustCompile(`(?m)^\s*version\s*=\s*(\d+)\s*(#.*)?$`)
	headerLine  = regexp.MustCompile(`^\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(#.*)?$`)
	configPathK = regexp.MustCompile(`^(\s*)config_path\s*=\s*(.*?)\s*(#.*)?$`)
	spacesInKey = regexp.MustCompile(`\s*\.\s*`)
	literalKey  = regexp.MustCompile(`'([^'"\\]*)'`)
)

// tableKey normalises a table header's key for comparison: no spaces around the dots, and TOML literal
// strings ('io.containerd.cri.v1.images', as containerd 2.x's `config default` and `config migrate`
// write them) as the basic strings they equal ("io.containerd.cri.v1.images").
func tableKey(k string) string {
	return literalKey.ReplaceAllString(spacesInKey.ReplaceAllString(k, "."), `"$1"`)
}

// registryTable returns the CRI registry table of a config.toml of the given schema version:
// version 2 (containerd 1.x) `plugins."io.containerd.grpc.v1.cri".registry`, versions 3 (containerd
// 2.0+) and 4 (2.3+, what `containerd config migrate` writes; it renamed only the task-monitor and
// restart plugins) `plugins."io.containerd.cri.v1.images".registry` (containerd docs/cri/config.md,
// RELEASES.md "Daemon Configuration").
func registryTable(version string) (string, bool) {
	switch version {
	case "2":
		return `plugins."io.containerd.grpc.v1.cri".registry`, true
	case "3", "4":
		return `plugins."io.containerd.cri.v1.images".registry`, true
	}
	return "", false
}

// SetConfigPath returns config.toml contents whose CRI registry config_path is certsDir, and
// whether that differs from data. It edits text, so comments and the operator's other settings
// stay byte-identical: it replaces the value of an existing config_path line inside the registry
// table, adds the key right under the table header when the table has none, or appends the table
// when the file has no such table.
//
// It supports schema versions 2 (containerd 1.5-1.7), 3 and 4 (containerd 2.x), read from the file's
// top-level `version` key. A file without a version (containerd's pre-1.5 schema 1), another
// version, or one that sets the key in a form it cannot find safely (an inline table or dotted keys
// for the registry) yields an error wrapping ErrUnsupportedConfig: set config_path by hand, or
// regenerate the file with `containerd config default`.
func SetConfigPath(data []byte, certsDir string) ([]byte, bool, error) {
	m := versionLine.FindSubmatch(data)
	if m == nil {
		return nil, false, fmt.Errorf("%w: no top-level `version = 2`, `3` or `4` (schema 1 is not supported; regenerate it with `containerd config default`)", ErrUnsupportedConfig)
	}
	table, ok := registryTable(string(m[1]))
	if !ok {
		return nil, false, fmt.Errorf("%w: schema version %s (want 2, 3 or 4)", ErrUnsupportedConfig, m[1])
	}
	want := "config_path = " + TOMLString(certsDir)
	lines := strings.SplitAfter(string(data), "\n")
	current := "" // the table the line belongs to
	header := -1  // line index of the registry table's header
	for i, line := range lines {
		if h := headerLine.FindStringSubmatch(strings.TrimRight(line, "\r\n")); h != nil && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			current = tableKey(h[1])
			if current == table {
				header = i
			}
			continue
		}
		if current != table {
			if strings.Contains(line, "config_path") && strings.Contains(line, "registry") && !strings.HasPrefix(strings.TrimSpace(line), "#") {
				return nil, false, fmt.Errorf("%w: line %d sets the registry as a dotted key or inline table; set config_path = %s there by hand", ErrUnsupportedConfig, i+1, TOMLString(certsDir))
			}
			continue
		}
		cm := configPathK.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
		if cm == nil {
			continue
		}
		if cm[2] == TOMLString(certsDir) {
			return data, false, nil
		}
		nl := line[len(strings.TrimRight(line, "\r\n")):]
		comment := ""
		if cm[3] != "" {
			comment = " " + cm[3]
		}
		lines[i] = cm[1] + want + comment + nl
		return []byte(strings.Join(lines, "")), true, nil
	}
	if header >= 0 {
		indent := "  "
		out := append(slices.Clone(lines[:header+1]), indent+want+"\n")
		out = append(out, lines[header+1:]...)
		return []byte(strings.Join(out, "")), true, nil
	}
	var b bytes.Buffer
	b.Write(data)
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "\n[%s]\n  %s\n", table, want)
	return b.Bytes(), true, nil
}

// CNIBinDir is where Debian's containernetworking-plugins installs the CNI plugins (upstream
// containerd looks in /opt/cni/bin).
const CNIBinDir = "/usr/lib/cni"

// CNIConfDir is where containerd's CRI plugin reads CNI network configurations.
const CNIConfDir = "/etc/cni/net.d"

// criTemplate is a complete containerd 2.x config (version 3, containerd docs/cri/config.md) for a
// kubeadm node, following the Kubernetes container-runtime docs. Version 3 splits the CRI plugin of
// version 2 (`io.containerd.grpc.v1.cri`) in three: the image service `io.containerd.cri.v1.images`
// (the sandbox image, now pinned_images.sandbox so the image GC keeps it, and the registry's
// config_path for hosts.toml mirrors), the runtime service `io.containerd.cri.v1.runtime`
// (restrict_oom_score_adj, the runc v2 shim with the systemd cgroup driver, the CNI directories) and
// the gRPC server `io.containerd.grpc.v1.cri`, which keeps only the streaming server's settings; their
// defaults (streaming on 127.0.0.1, no TCP service) are what a kubeadm node wants, so that table is not
// written.
//
//   - SystemdCgroup = true: kubelet's cgroupDriver: systemd. containerd 2.x also answers kubelet's CRI
//     RuntimeConfig call with this driver (internal/cri/server/runtime_config_linux.go), and kubelet
//     1.34+ takes it from there (cmd/kubelet/app/server.go getCgroupDriverFromCRI).
//   - restrict_oom_score_adj: containerd clamps the negative OOM scores static pods ask for to what it
//     may set — needed where the runtime lacks CAP_SYS_RESOURCE, as in containers (the lab's nodes).
//   - cni.bin_dirs (a list since containerd 2.1; bin_dir is deprecated): Debian's plugin directory.
//
// containerd 2.3 reads version 3 as is and migrates it in memory to its own latest schema (4, which
// only renames the task-monitor and restart plugins, neither set here): RELEASES.md "Daemon
// Configuration". containerd 1.x does NOT refuse version 3: it ignores the unknown plugin ids and runs
// the CRI with its defaults (no mirrors, cgroupfs), so CheckVersion must pass before this is written.
var criTemplate = template.Must(template.New("config.toml").Funcs(template.FuncMap{"toml": TOMLString}).Parse(
	`# Written by the air-gap appliance's hostagent for kubeadm (containerd 2.x, config version 3).
version = 3

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {{toml .SandboxImage}}

  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {{toml .CertsDir}}

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = true

  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{{toml .CNIBinDir}}]
    conf_dir = {{toml .CNIConfDir}}
`))

// CRIConfig renders ConfigPath for a Kubernetes node running containerd MinVersion or later:
// sandboxImage is the pause image reference (e.g. "registry.k8s.io/pause:3.10.1", pulled through the
// mirror like every other image). The output is deterministic.
func CRIConfig(sandboxImage string) []byte {
	var b bytes.Buffer
	err := criTemplate.Execute(&b, struct{ SandboxImage, CNIBinDir, CNIConfDir, CertsDir string }{sandboxImage, CNIBinDir, CNIConfDir, CertsDir})
	if err != nil {
		panic(err) // the template and its inputs are fixed: a failure is a programming error
	}
	return b.Bytes()
}

// MinVersion is the oldest containerd CRIConfig's output is for: config version 3 needs containerd
// 2.0, and cni.bin_dirs 2.1 (2.0 would ignore it and look for the CNI plugins in /opt/cni/bin).
const MinVersion = "2.1"

// ErrTooOld is wrapped by CheckVersion when the installed containerd is older than MinVersion.
var ErrTooOld = errors.New("containerd is too old for the appliance's config")

var versionField = regexp.MustCompile(`^v?(\d+)\.(\d+)\.\d+`)

// CheckVersion reads the output of `containerd --version` ("containerd
// github.com/containerd/containerd/v2 v2.3.7 REVISION"; Debian 12's: "containerd
// github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3") and returns the version it
// names. A version older than MinVersion yields an error wrapping ErrTooOld that says what to do; an
// output it cannot read, another error.
func CheckVersion(out string) (string, error) {
	f := strings.Fields(out)
	if len(f) < 3 || f[0] != "containerd" {
		return "", fmt.Errorf("cannot read the containerd version from %q", strings.TrimSpace(out))
	}
	m := versionField.FindStringSubmatch(f[2])
	if m == nil {
		return "", fmt.Errorf("cannot read the containerd version from %q", strings.TrimSpace(out))
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < 2 || (major == 2 && minor < 1) {
		return f[2], fmt.Errorf("%w: containerd %s is installed, the config hostagent writes (version 3) needs %s or later "+
			"(containerd 1.x would ignore it and run without the mirrors and the systemd cgroup driver): "+
			"the bundle's repository must carry containerd >= %s, and a pre-installed host must upgrade it (apt-get install containerd)",
			ErrTooOld, f[2], MinVersion, MinVersion)
	}
	return f[2], nil
}
