package hostagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// CNICalico is agentapi.KubernetesConfig.CNI for Calico (config.CNICalico).
const CNICalico = "calico"

// CNIFlannel is agentapi.KubernetesConfig.CNI for the flannel overlay (config.CNIFlannel): the bridge
// network with agentapi.KubernetesConfig.PodMTU and no pod routes.
const CNIFlannel = "flannel"

// Paths of the Calico CNI on a control plane.
const (
	// CNIManifestPath is the CNI manifest the control plane applies (0644: no secret in it).
	CNIManifestPath = "/etc/kubernetes/appliance/cni.yaml"
	// CNIAppliedPath records the SHA-256 of the manifest last applied, so each manifest is applied
	// once per node and again when it changes.
	CNIAppliedPath = "/var/lib/hostagent/cni-applied"
	// AdminKubeconfigPath is kubeadm's admin.conf, written on every control plane.
	AdminKubeconfigPath = "/etc/kubernetes/admin.conf"
)

// applyTimeout bounds one `kubectl apply` of the CNI manifest.
const applyTimeout = 2 * time.Minute

// stepCNICalico is the cni step with Calico: calico-node's install-cni writes the node's CNI network
// (10-calico.conflist) and felix routes the pods, so the agent only removes the bridge network it
// may have written before (a node re-installed with another networks.cni) and never touches routes.
// did lists what the step already changed (IP forwarding).
func stepCNICalico(did []string) (string, error) {
	if err := os.Remove(CNIConfigPath); err == nil {
		did = append(did, "removed the bridge network "+CNIConfigPath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("remove the bridge network %s: %w", CNIConfigPath, err)
	}
	const detail = "calico: calico-node writes the CNI network and routes the pods"
	if len(did) == 0 {
		return "unchanged: " + detail, nil
	}
	return strings.Join(did, ", ") + ": " + detail, nil
}

// cniPaths are where applyCNI reads and writes: AdminKubeconfigPath, CNIManifestPath,
// CNIAppliedPath and KubeadmLogPath (kubectl's output) on a node.
type cniPaths struct{ kubeconfig, manifest, applied, log string }

var nodeCNIPaths = cniPaths{AdminKubeconfigPath, CNIManifestPath, CNIAppliedPath, KubeadmLogPath}

// applyCNI applies k.CNIManifest with kubectl server-side (field manager "appliance", conflicts
// forced: the appliance owns these objects) through the kubeconfig (the node's admin.conf), when its
// SHA-256 differs from the one recorded in p.applied; the manifest is written to p.manifest first.
// It returns what it did for the step's detail ("" when there is no manifest).
func applyCNI(ctx context.Context, k *agentapi.KubernetesConfig, p cniPaths) (string, error) {
	if k == nil || k.CNIManifest == "" {
		return "", nil
	}
	return applyManifest(ctx, k.CNI, k.CNIManifest, p)
}

// applyManifest applies manifest (named what in the detail and errors) as applyCNI describes.
func applyManifest(ctx context.Context, what, manifest string, p cniPaths) (string, error) {
	sum := sha256.Sum256([]byte(manifest))
	want := hex.EncodeToString(sum[:])
	if b, err := os.ReadFile(p.applied); err == nil && strings.TrimSpace(string(b)) == want {
		return what + " manifest unchanged", nil
	}
	if _, err := atomicfile.Write(p.manifest, []byte(manifest), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", p.manifest, err)
	}
	start := time.Now()
	out, err := run(ctx, applyTimeout, p.log, nil, "kubectl", "--kubeconfig", p.kubeconfig, "apply",
		"--server-side", "--force-conflicts", "--field-manager", "appliance", "-f", p.manifest)
	if err != nil {
		return "", fmt.Errorf("apply the %s manifest: %w", what, err)
	}
	if _, err := atomicfile.Write(p.applied, []byte(want+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", p.applied, err)
	}
	return fmt.Sprintf("applied the %s manifest (%d objects) in %.1fs", what, strings.Count(out, "serverside-applied"), time.Since(start).Seconds()), nil
}
