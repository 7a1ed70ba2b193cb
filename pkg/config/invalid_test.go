package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airgap-appliance/appliance/firewall"
	kubeadmmanifests "github.com/airgap-appliance/appliance/kubeadm-manifests"
)

// TestInvalidFiles loads every configuration under testdata/invalid (the lab's configuration with one
// thing wrong that `config validate` once accepted although it cannot work) and asserts the exact set
// of error paths, each with what its message must say. Every file in the directory must have a case.
func TestInvalidFiles(t *testing.T) {
	type want struct{ path, msg string }
	tests := map[string][]want{
		"server-port-is-api-port":  {{"server.port", "6443 is also the port of kube-apiserver (tcp 6443) on the appliance host"}},
		"server-port-is-ssh":       {{"server.port", "22 is also the port of ssh (tcp 22) on the appliance host"}},
		"api-port-is-etcd":         {{"apiServer.port", "2379 is also the port of etcd (tcp 2379-2380) on control-plane nodes"}},
		"api-port-is-apiserver-lb": {{"apiServer.port", "9445 is also the port of apiserver-lb (tcp 9445) on control-plane nodes"}},
		"api-port-in-nodeport-range": {{"apiServer.port",
			"30443 is also the port of nodeport-tcp (tcp 30000-32767) on nodes[0] (cp1, control-plane and worker)"}},
		"server-port-is-kubelet-on-a-node": {{"server.port", "10250 is also the port of kubelet (tcp 10250) on the appliance host, which is also nodes[3] (w1)"}},
		"kubernetes-version-newer": {{"kubernetesVersion", `"v1.38.0" cannot be deployed: unsupported Kubernetes minor v1.38: ` +
			"the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2"}},
		"kubernetes-version-older": {{"kubernetesVersion", `"v1.34.4" cannot be deployed: unsupported Kubernetes minor v1.34: the appliance deploys v1.35`}},
		"state-dir-root":           {{"stateDir", `"/" is a system directory`}},
		"state-dir-etc":            {{"stateDir", `"/etc/" is a system directory`}},
		"state-dir-var":            {{"stateDir", `"/var/lib/../" is a system directory (/var)`}},
		"state-dir-in-proc":        {{"stateDir", `"/proc/appliance" is inside /proc`}},
		"state-dir-usr-lib":        {{"stateDir", `"/usr/lib" is a system directory`}},
		"tag-binary":               {{"clusterName", "YAML tags are not supported (!!binary)"}},
		"tag-custom":               {{"nodes[1].power", "YAML tags are not supported (!ssh)"}},
		"ipv6-only": {
			{"networks.controlPlane.cidrs[0]", "fd00:100::/64 is IPv6: the appliance supports IPv4 networks only"},
			{"networks.workloadPlane.cidrs[0]", "fd00:200::/64 is IPv6"},
			{"networks.pods", "fd00:233::/56 is IPv6"},
			{"networks.services", "fd00:96::/112 is IPv6"},
			{"apiServer.vip", "fd00:100::100 is IPv6"}},
		"ipv6-workload-plane": {{"networks.workloadPlane.cidrs[1]", "fd00:200::/64 is IPv6"}},
	}
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			wants, ok := tests[name]
			if !ok {
				t.Fatalf("%s has no case in this table", f)
			}
			_, _, err := Load(f, ValidateOptions{})
			var errs ErrorList
			if !errors.As(err, &errs) {
				t.Fatalf("Load(%s) = %v, want an ErrorList", f, err)
			}
			var wantPaths []string
			for _, w := range wants {
				wantPaths = append(wantPaths, w.path)
				requireErr(t, errs, w.path, w.msg, 0)
			}
			slices.Sort(wantPaths)
			if got := errPaths(errs); !slices.Equal(got, wantPaths) {
				t.Errorf("error paths = %q, want %q; errors:\n%v", got, wantPaths, errs)
			}
			for _, e := range errs {
				if e.Line == 0 {
					t.Errorf("%s has no line", e)
				}
			}
		})
	}
}

// TestSupportedKubernetesVersion: the range Validate accepts is the one kubeadm-manifests can render
// (its Images knows the image sets of pkg/k8sversion's table); a supported minor passes without
// errors or warnings, anything else, v1.34 (past its end of life) included, is refused with the
// supported minors.
func TestSupportedKubernetesVersion(t *testing.T) {
	for _, tt := range []struct {
		version string
		err     string // "" = none; else what the error at kubernetesVersion contains
	}{
		{"v1.35.0", ""},
		{"v1.35.4", ""},
		{"v1.36.3", ""},
		{"v1.37.2", ""},
		{"v1.37.99", ""},
		{"v1.34.4", `"v1.34.4" cannot be deployed: unsupported Kubernetes minor v1.34: the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2`},
		{"v1.33.5", "unsupported Kubernetes minor v1.33: the appliance deploys v1.35, v1.36 and v1.37"},
		{"v1.38.0", `"v1.38.0" cannot be deployed: unsupported Kubernetes minor v1.38`},
		{"v2.35.0", "unsupported Kubernetes minor v2.35"},
		{"v0.35.1", "unsupported Kubernetes minor v0.35"},
	} {
		_, renderErr := kubeadmmanifests.Images(kubeadmmanifests.Cluster{KubernetesVersion: tt.version, ImageRepository: "registry.k8s.io"})
		c := labConfig(t)
		c.KubernetesVersion = tt.version
		warns, errs := Validate(c, ValidateOptions{})
		if got := findErr(errs, "kubernetesVersion") == nil; got != (renderErr == nil) {
			t.Errorf("%s: Validate accepts = %v, kubeadm-manifests renders = %v (%v)", tt.version, got, renderErr == nil, renderErr)
		}
		if tt.err != "" {
			requireErr(t, errs, "kubernetesVersion", tt.err, 0)
		} else if len(errs) > 0 {
			t.Errorf("%s: errors %v", tt.version, errs)
		}
		if w := findErr(warns, "kubernetesVersion"); w != nil {
			t.Errorf("%s: warning %v", tt.version, w)
		}
	}
}

// TestKubernetesVersionMatchesBundle: with CheckFiles, a readable bundle's own Kubernetes version
// (bundle.yaml) must be the configured one.
func TestKubernetesVersionMatchesBundle(t *testing.T) {
	f := newFileFixture(t)
	meta := "apiVersion: appliance.airgap.dev/v1alpha1\nkind: Bundle\nname: k8s-1.36.3\nkubernetesVersion: v1.36.3\ncreated: 2025-01-31T12:00:00Z\n"
	f.write(t, filepath.Join("bundle", "bundle.yaml"), []byte(meta), 0o644)
	_, errs := Validate(f.c, ValidateOptions{CheckFiles: true})
	if got := errPaths(errs); !slices.Equal(got, []string{"kubernetesVersion"}) {
		t.Fatalf("error paths = %q, want [kubernetesVersion]; errors:\n%v", got, errs)
	}
	requireErr(t, errs, "kubernetesVersion", `"`+DefaultKubernetesVersion+`" differs from the bundle's Kubernetes v1.36.3`, 0)
	requireErr(t, errs, "kubernetesVersion", "set kubernetesVersion: v1.36.3", 0)

	f.c.KubernetesVersion = "v1.36.3"
	if _, errs := Validate(f.c, ValidateOptions{CheckFiles: true}); len(errs) > 0 {
		t.Fatalf("matching version: %v", errs)
	}
	// Offline, the bundle is not read.
	f.c.KubernetesVersion = DefaultKubernetesVersion
	if _, errs := Validate(f.c, ValidateOptions{}); len(errs) > 0 {
		t.Fatalf("offline: %v", errs)
	}
}

// TestStateDirSymlinkToSystemDir: with CheckFiles, a stateDir that resolves to a system directory
// through a symbolic link is refused too.
func TestStateDirSymlinkToSystemDir(t *testing.T) {
	f := newFileFixture(t)
	link := filepath.Join(f.dir, "state-link")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	f.c.StateDir = link
	_, errs := Validate(f.c, ValidateOptions{CheckFiles: true})
	requireErr(t, errs, "stateDir", "resolves to /etc, a system directory", 0)
	if _, errs := Validate(f.c, ValidateOptions{}); findErr(errs, "stateDir") != nil {
		t.Errorf("offline, the link is not followed: %v", errs)
	}
}

// TestLoadRefusesNonRegularFiles: a FIFO (which would block the reader until a writer comes), a
// device and a directory are refused before anything is read.
func TestLoadRefusesNonRegularFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// If Load blocks on the FIFO, a writer that opens and closes it lets it go on (with an empty read),
	// so that the test fails instead of hanging.
	done := make(chan error, 1)
	go func() { _, _, err := Load(fifo, ValidateOptions{}); done <- err }()
	var err error
	for err == nil {
		select {
		case err = <-done:
		default:
			if w, werr := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); werr == nil {
				_ = w.Close()
				t.Errorf("Load opened the FIFO for reading and waited for a writer")
				err = <-done
			}
		}
	}
	dir := t.TempDir()
	for name, err := range map[string]error{fifo: err, "/dev/zero": loadErr("/dev/zero"), dir: loadErr(dir)} {
		if err == nil || !strings.Contains(err.Error(), "is not a regular file") {
			t.Errorf("Load(%s) = %v, want an error saying it is not a regular file", name, err)
		}
	}
}

func loadErr(path string) error {
	_, _, err := Load(path, ValidateOptions{})
	return err
}

// TestLongValuesClipped: a value of a megabyte is not repeated by the error about it.
func TestLongValuesClipped(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "lab.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 1<<20)
	doc := strings.Replace(string(data), "clusterName: lab\n", "clusterName: "+long+"\n", 1)
	doc = strings.Replace(doc, "  path: /var/cache/appliance/bundle\n", "  path: /"+long+"\n", 1)
	doc = strings.Replace(doc, "    passwordFile: /var/lib/appliance-lab/bmc/w1.password\n", "    passwordFile: /"+long+"\n", 1)
	path := filepath.Join(t.TempDir(), "long.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = Load(path, ValidateOptions{CheckFiles: true})
	var errs ErrorList
	if !errors.As(err, &errs) {
		t.Fatalf("Load = %v, want an ErrorList", err)
	}
	requireErr(t, errs, "clusterName", `"`+strings.Repeat("x", 80)+`…(1048576 bytes)" is not a valid name`, 0)
	requireErr(t, errs, "bundle.path", "…(1048577 bytes) cannot be read", 0)
	requireErr(t, errs, "nodes[3].power.passwordFile", "…(1048577 bytes)", 0)
	for _, e := range errs {
		if len(e.Error()) > 1024 {
			t.Errorf("%s: %d bytes", e.Path, len(e.Error()))
		}
	}
}

// TestConfiguredPortNames: the port-table entries whose ports server.port and apiServer.port set
// exist under the names Validate looks for.
func TestConfiguredPortNames(t *testing.T) {
	found := map[string]uint16{}
	for _, p := range firewall.Ports(1111, 2222) {
		found[p.Name] = p.From
	}
	if found[portNameAppliance] != 1111 || found[portNameAPI] != 2222 {
		t.Errorf("firewall.Ports has %s=%d, %s=%d; want 1111 and 2222", portNameAppliance, found[portNameAppliance], portNameAPI, found[portNameAPI])
	}
}

// TestCheckStateDir: --state-dir gets the checks stateDir gets (before, the flag skipped them: `appliance
// bootstrap --state-dir /etc` was accepted).
func TestCheckStateDir(t *testing.T) {
	link := filepath.Join(t.TempDir(), "to-etc")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		"/etc":                 "a system directory",
		"/proc/appliance":      "inside /proc",
		"state":                "is not absolute",
		link:                   "resolves to /etc",
		"/var/lib/appliance-x": "",
	} {
		err := CheckStateDir(dir)
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckStateDir(%q) = %v, want nil", dir, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--state-dir")):
			t.Errorf("CheckStateDir(%q) = %v, want an error naming --state-dir and %q", dir, err, want)
		}
	}
}
