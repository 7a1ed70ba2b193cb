package hostagent

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/calico"
	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestApplyCNI applies pkg/calico's manifest the way a control plane's api step does, with the
// Kubernetes fixture's kubectl against a real kube-apiserver (test/kubetest): the first call applies
// every object and records the manifest's hash (0600), the second runs no kubectl at all (the log
// gains nothing), and a changed manifest (another MTU) is applied again and lands in the cluster.
func TestApplyCNI(t *testing.T) {
	labns.RequireRoot(t)
	s := kubetest.StartAPIServer(t, kubetest.Options{})
	kubectl := labns.KubernetesBin(t, "kubectl")
	t.Setenv("PATH", filepath.Dir(kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	dir := t.TempDir()
	p := cniPaths{kubeconfig: s.AdminKubeconfig, manifest: filepath.Join(dir, "etc", "cni.yaml"),
		applied: filepath.Join(dir, "lib", "cni-applied"), log: filepath.Join(dir, "log", "kubeadm.log")}
	params := calico.Params{PodCIDR: netip.MustParsePrefix("10.233.0.0/16"), NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")},
		PodMTU: 1450, APIServerHost: netip.MustParseAddr("10.100.0.100"), APIServerPort: 6443}
	manifest := func() string {
		m, err := calico.Manifest(params)
		if err != nil {
			t.Fatal(err)
		}
		return string(m)
	}
	k := &agentapi.KubernetesConfig{CNI: CNICalico, CNIManifest: manifest()}
	ctx := context.Background()

	did, err := applyCNI(ctx, k, p)
	if err != nil || !strings.HasPrefix(did, "applied the calico manifest (") {
		t.Fatalf("first apply: %q, %v", did, err)
	}
	objects := strings.Count(k.CNIManifest, "\n---\n") + 1
	if !strings.Contains(did, "("+strconv.Itoa(objects)+" objects)") {
		t.Errorf("first apply reported %q, want %d objects", did, objects)
	}
	if fi, err := os.Stat(p.applied); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v, want 0600", p.applied, fi, err)
	}
	logSize := func() int64 {
		fi, err := os.Stat(p.log)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := logSize()
	if did, err := applyCNI(ctx, k, p); err != nil || did != "calico manifest unchanged" {
		t.Errorf("second apply: %q, %v", did, err)
	}
	if logSize() != before {
		t.Errorf("the second apply ran kubectl")
	}

	params.PodMTU = 8950
	k.CNIManifest = manifest()
	if did, err := applyCNI(ctx, k, p); err != nil || !strings.HasPrefix(did, "applied") {
		t.Fatalf("changed manifest: %q, %v", did, err)
	}
	out, err := exec.Command(kubectl, "--kubeconfig", s.AdminKubeconfig, "-n", "kube-system", "get", "configmap", "calico-config",
		"-o", "jsonpath={.data.veth_mtu}").CombinedOutput()
	if err != nil || string(out) != "8950" {
		t.Errorf("calico-config veth_mtu after the change: %q, %v", out, err)
	}
	if did, err := applyCNI(ctx, &agentapi.KubernetesConfig{}, p); err != nil || did != "" {
		t.Errorf("no manifest: %q, %v", did, err)
	}
}
