// Package provision brings a pre-installed host (Debian or RHEL family, reachable over SSH) under
// hostagent: it installs the appliance CA into the system trust store, points the package manager
// at the appliance's /repo/, installs the hostagent binary, its configuration (appliance URL, CA pin,
// node token) and its systemd unit, and (re)starts it. It is the SSH counterpart of the Ignition
// config a BMC-booted node receives, and writes the same paths (pkg/ignition's constants).
//
// Every file is compared by SHA-256 on the host first and written only when it differs (atomically,
// through the Remote), so a rerun changes nothing and a run cut off at any point finishes when run
// again.
package provision

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/ignition"
)

// Remote is a shell on the host: x/crypto/ssh in production (power.SSHClient).
type Remote interface {
	// Run runs cmd with /bin/sh; a non-zero exit is reported in exitCode, not as err.
	Run(ctx context.Context, cmd string, stdin io.Reader) (stdout, stderr []byte, exitCode int, err error)
	// WriteFile atomically replaces path with data and mode.
	WriteFile(ctx context.Context, path string, data []byte, mode os.FileMode) error
}

// Host is what gets installed on one node.
type Host struct {
	// ApplianceURL is https://host:port of the appliance.
	ApplianceURL string
	// CAPEM is the appliance CA (PEM).
	CAPEM []byte
	// Hostagent is the hostagent executable.
	Hostagent []byte
	// HostagentConfig is the node's /etc/hostagent/config.yaml (holds the node token: never log it).
	HostagentConfig []byte
	// RepoKeyring is the OpenPGP public keyring that signs the bundle's Debian repository
	// (pkg/bundle.agentapi.RepoKeyringPath), installed as agentapi.RepoKeyringPath and named by the apt source's
	// signed-by option. Required for Debian-family hosts.
	RepoKeyring []byte
}

// AptSource is the sources.list line for the appliance's repository at applianceURL: apt accepts
// only Release files signed by a key of agentapi.RepoKeyringPath.
func AptSource(applianceURL string) string {
	return "deb [signed-by=" + agentapi.RepoKeyringPath + "] " + applianceURL + "/repo/debian stable main\n"
}

// Result says what Provision did.
type Result struct {
	Family  string   // "debian" or "rhel"
	Changed []string // paths written, plus "hostagent restarted"
}

// Family detection from /etc/os-release (ID and ID_LIKE, os-release(5)).
func family(ctx context.Context, r Remote) (string, error) {
	out, _, code, err := r.Run(ctx, `. /etc/os-release && echo "$ID $ID_LIKE"`, nil)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("read /etc/os-release: exit %d", code)
	}
	ids := strings.Fields(string(out))
	for _, id := range ids {
		switch id {
		case "debian", "ubuntu":
			return "debian", nil
		case "rhel", "fedora", "centos", "rocky", "almalinux":
			return "rhel", nil
		}
	}
	return "", fmt.Errorf("unsupported OS %q: provisioning over SSH supports Debian and RHEL families", strings.Join(ids, " "))
}

// file is one file to install.
type file struct {
	path string
	data []byte
	mode os.FileMode
}

// Provision installs everything and makes hostagent run. Errors name the step and the path.
func Provision(ctx context.Context, r Remote, h Host) (Result, error) {
	var res Result
	fam, err := family(ctx, r)
	if err != nil {
		return res, err
	}
	res.Family = fam
	u, err := url.Parse(h.ApplianceURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return res, fmt.Errorf("appliance URL %q: want https://host:port", h.ApplianceURL)
	}
	files := []file{
		{ignition.HostagentBinaryPath, h.Hostagent, 0o755},
		{ignition.HostagentConfigPath, h.HostagentConfig, 0o600},
		{"/etc/systemd/system/" + ignition.HostagentUnit, []byte(agentapi.HostagentUnitContents), 0o644},
	}
	trustCmd := ""
	switch fam {
	case "debian":
		if len(h.RepoKeyring) == 0 {
			return res, errors.New("no keyring for the bundle's Debian repository: the bundle must carry a signed repository (make it with `appliance bundle create`)")
		}
		files = append(files,
			file{ignition.CAPathDebian, h.CAPEM, 0o644},
			// apt trusts the appliance CA for this host only, and the repository only when its
			// InRelease is signed by the bundle's repository key (signed-by); then it checks
			// Release → Packages → .deb hashes itself.
			file{"/etc/apt/apt.conf.d/90appliance", []byte(fmt.Sprintf("Acquire::https::%s::CaInfo %q;\n", u.Hostname(), ignition.CAPathDebian)), 0o644},
			file{agentapi.RepoKeyringPath, h.RepoKeyring, 0o644},
			file{agentapi.AptSourcePath, []byte(AptSource(h.ApplianceURL)), 0o644},
		)
		trustCmd = "command -v update-ca-certificates >/dev/null && update-ca-certificates >/dev/null || true"
	case "rhel":
		// The bundle carries no RPM repository yet: only the CA and hostagent are installed.
		files = append(files, file{ignition.CAPathFedora, h.CAPEM, 0o644})
		trustCmd = "command -v update-ca-trust >/dev/null && update-ca-trust extract || true"
	}
	sums, err := remoteSums(ctx, r, files)
	if err != nil {
		return res, err
	}
	// Parent directories: /etc/hostagent holds the node token, so it is 0700.
	mkdir := "install -d -m 0700 " + filepath.Dir(ignition.HostagentConfigPath) + " && install -d -m 0755"
	for _, f := range files {
		mkdir += " '" + filepath.Dir(f.path) + "'"
	}
	if _, stderr, code, err := r.Run(ctx, mkdir, nil); err != nil || code != 0 {
		return res, fmt.Errorf("create directories: exit %d: %v %s", code, err, bytes.TrimSpace(stderr))
	}
	caChanged := false
	for _, f := range files {
		want := sha256.Sum256(f.data)
		if sums[f.path] == hex.EncodeToString(want[:]) {
			continue
		}
		if err := r.WriteFile(ctx, f.path, f.data, f.mode); err != nil {
			return res, fmt.Errorf("install %s: %w", f.path, err)
		}
		res.Changed = append(res.Changed, f.path)
		if f.path == ignition.CAPathDebian || f.path == ignition.CAPathFedora {
			caChanged = true
		}
	}
	if caChanged {
		if _, stderr, code, err := r.Run(ctx, trustCmd, nil); err != nil || code != 0 {
			return res, fmt.Errorf("update the system trust store: exit %d: %v %s", code, err, bytes.TrimSpace(stderr))
		}
	}
	// --no-block: hostagent is Type=notify and reports ready only once the node is configured.
	cmd := startScript(ignition.HostagentUnit, ignition.HostagentBinaryPath)
	if len(res.Changed) > 0 {
		cmd = "systemctl daemon-reload && systemctl enable " + ignition.HostagentUnit + " && systemctl restart --no-block " + ignition.HostagentUnit
		res.Changed = append(res.Changed, "hostagent restarted")
	}
	out, stderr, code, err := r.Run(ctx, cmd, nil)
	if err != nil || code != 0 {
		return res, fmt.Errorf("start %s: exit %d: %v %s", ignition.HostagentUnit, code, err, bytes.TrimSpace(stderr))
	}
	if len(res.Changed) == 0 && strings.Contains(string(out), staleRestarted) {
		res.Changed = append(res.Changed, "hostagent restarted (it ran a replaced executable)")
	}
	return res, nil
}

// staleRestarted is what startScript prints when it restarted a hostagent that ran a replaced
// executable.
const staleRestarted = "restarted-stale-hostagent"

// startScript, for a host whose files are all current: start unit if it is not running, and
// restart it if its main process runs an executable that is no longer bin
// (Linux shows a replaced one as "PATH (deleted)" in /proc/PID/exe, proc(5)): a run killed between
// writing a new hostagent and restarting it (an upgrade) would else leave the old build running for
// good. A unit that is still starting (activating: Type=notify) with the current executable is left
// alone.
func startScript(unit, bin string) string {
	return `u='` + unit + `'
pid=$(systemctl show -p MainPID --value "$u" 2>/dev/null)
if [ -n "$pid" ] && [ "$pid" != 0 ] && [ "$(readlink /proc/$pid/exe 2>/dev/null)" != '` + bin + `' ]; then
  systemctl daemon-reload && systemctl restart --no-block "$u" && echo ` + staleRestarted + `
else
  systemctl is-active --quiet "$u" || systemctl enable --now --no-block "$u"
fi`
}

// remoteSums returns the SHA-256 of each path that exists on the host (sha256sum(1) output).
func remoteSums(ctx context.Context, r Remote, files []file) (map[string]string, error) {
	var q []string
	for _, f := range files {
		q = append(q, "'"+f.path+"'")
	}
	out, _, _, err := r.Run(ctx, "sha256sum "+strings.Join(q, " ")+" 2>/dev/null", nil)
	if err != nil {
		return nil, fmt.Errorf("read installed files: %w", err)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			sums[f[1]] = f[0]
		}
	}
	return sums, nil
}
