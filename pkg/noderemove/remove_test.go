package noderemove

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/config/configtest"
	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

// startAPIServer runs a real etcd and kube-apiserver (test/kubetest) until the test ends, its
// admin kubeconfig at STATE/kubernetes/admin.conf like kubeadm's admin.conf, and returns a client
// from it. The ServiceAccount admission plugin is off: no kube-controller-manager makes the default
// service accounts the test's pods would need. No kubelet runs either: the test plays its part where
// it needs one (status writes).
func startAPIServer(t *testing.T, stateDir string) *kubeapi.Client {
	t.Helper()
	return kubetest.StartAPIServer(t, kubetest.Options{
		AdminKubeconfig: statedir.AdminKubeconfig(stateDir), DisableAdmissionPlugins: []string{"ServiceAccount"},
	}).Client
}

func mustDo(t *testing.T, c *kubeapi.Client, method, path string, obj any) []byte {
	t.Helper()
	var body []byte
	if obj != nil {
		var err error
		if body, err = json.Marshal(obj); err != nil {
			t.Fatal(err)
		}
	}
	b, err := c.Do(context.Background(), method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return b
}

// createPod creates a pod bound to node (and with ready, marks it Ready through the status
// subresource, as its kubelet would).
func createPod(t *testing.T, c *kubeapi.Client, ns, name, node string, meta map[string]any, ready bool) {
	t.Helper()
	m := map[string]any{"name": name, "namespace": ns}
	for k, v := range meta {
		m[k] = v
	}
	mustDo(t, c, http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": m,
		"spec": map[string]any{"nodeName": node, "containers": []any{map[string]any{"name": "c", "image": "registry.k8s.io/pause:3.10"}}},
	})
	if !ready {
		return
	}
	var p map[string]any
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+name, nil), &p); err != nil {
		t.Fatal(err)
	}
	p["status"] = map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
	mustDo(t, c, http.MethodPut, "/api/v1/namespaces/"+ns+"/pods/"+name+"/status", p)
}

// TestRemoveAgainstAPIServer runs removals against a real kube-apiserver: a control plane whose
// removal would lose etcd quorum (cp2, and cp1, the init node, alike) is refused with the numbers
// and nothing changes; a control plane
// the appliance cannot reach over SSH is refused; a worker is drained (its own pod evicted, the
// DaemonSet and static pods left), its Node deleted and its removal recorded, its unreachable host
// skipped; a rerun changes nothing; a dry run only says what it would do; a PodDisruptionBudget
// that allows no eviction fails the drain at its timeout, naming the pod, with nothing recorded.
func TestRemoveAgainstAPIServer(t *testing.T) {
	stateDir := t.TempDir()
	c := startAPIServer(t, stateDir)
	ctx := context.Background()

	// The configuration: five SSH nodes whose sshd is a closed port on 127.0.0.1.
	dir := t.TempDir()
	power := configtest.UnreachableSSH(t, dir)
	cfg := config.Example()
	cfg.StateDir = stateDir
	for i := range cfg.Nodes {
		cfg.Nodes[i].Power = power
	}
	opts := func(node string) Options {
		return Options{Config: cfg, ConfigPath: "bootstrap.yaml", StateDir: stateDir, Node: node, PowerTarget: bootstrap.PowerTarget,
			DrainTimeout: time.Minute}
	}

	for _, n := range []string{"cp1", "cp2", "cp3", "w1", "w2"} {
		mustDo(t, c, http.MethodPost, "/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": n}})
	}
	etcd := map[string]any{"labels": map[string]string{"component": "etcd", "tier": "control-plane"},
		"annotations": map[string]string{"kubernetes.io/config.mirror": "x"}}
	createPod(t, c, "kube-system", "etcd-cp1", "cp1", etcd, true)
	createPod(t, c, "kube-system", "etcd-cp2", "cp2", etcd, true)
	createPod(t, c, "kube-system", "etcd-cp3", "cp3", etcd, false) // unhealthy
	createPod(t, c, "default", "app", "w1", nil, true)
	createPod(t, c, "kube-system", "proxy", "w1", map[string]any{"ownerReferences": []any{map[string]any{
		"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-proxy", "uid": "0d0b8c3e-0000-4000-8000-000000000001"}}}, true)
	createPod(t, c, "kube-system", "static-w1", "w1", map[string]any{"annotations": map[string]string{"kubernetes.io/config.mirror": "x"}}, true)

	// Quorum: cp3 is unhealthy, so cp2 must stay.
	_, err := Remove(ctx, opts("cp2"))
	want := "refused: 3 etcd members, 1 unhealthy (cp3): removing cp2 leaves 1 healthy of the 2 needed; fix cp3 first"
	if !errors.Is(err, ErrRefused) || err == nil || err.Error() != want {
		t.Fatalf("remove cp2: %v\nwant %s", err, want)
	}
	var cp2 node
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/nodes/cp2", nil), &cp2); err != nil || cp2.Spec.Unschedulable {
		t.Errorf("a refused removal changed cp2: unschedulable %v (%v)", cp2.Spec.Unschedulable, err)
	}
	// cp1, the first control plane of nodes[] (kubeadm's init node), is under the same rule: the
	// removal knows no init node (the next render makes the first remaining control plane that
	// joined the one that renews the join secrets, pkg/plan KubeadmLeader).
	if _, err := Remove(ctx, opts("cp1")); !errors.Is(err, ErrRefused) || err.Error() != "refused: 3 etcd members, 1 unhealthy (cp3): removing cp1 leaves 1 healthy of the 2 needed; fix cp3 first" {
		t.Errorf("remove cp1: %v", err)
	}
	// cp3 may go as far as quorum is concerned, but only kubeadm reset on it removes its member.
	if _, err := Remove(ctx, opts("cp3")); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "cp3 runs an etcd member, which only `kubeadm reset` on it removes here, and it does not answer over SSH") {
		t.Errorf("remove unreachable cp3: %v", err)
	}

	// A dry run of w1 says what it would do and changes nothing.
	res, err := Remove(ctx, Options{Config: cfg, ConfigPath: "bootstrap.yaml", StateDir: stateDir, Node: "w1", PowerTarget: bootstrap.PowerTarget, DryRun: true, Force: true})
	if err != nil || len(res.Steps) != 2 || res.Steps[1].Detail != "would cordon and drain (1 pods to evict), kubeadm reset over SSH, delete the Node, record it removed" {
		t.Fatalf("dry run: %+v %v", res, err)
	}

	// "app" has no controller: an eviction would delete it for good, so without Force it is refused.
	if _, err := Remove(ctx, opts("w1")); !errors.Is(err, ErrRefused) || err.Error() !=
		"refused: w1 runs 1 pods no controller owns, which an eviction deletes for good: default/app; move or delete them, or remove it with appliance node remove w1 --force" {
		t.Errorf("remove w1 with a bare pod: %v", err)
	}
	var w1 node
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/nodes/w1", nil), &w1); err != nil || w1.Spec.Unschedulable {
		t.Errorf("the refused removal cordoned w1 (%v)", err)
	}
	o := opts("w1")
	o.Force = true
	res, err = Remove(ctx, o)
	if err != nil {
		t.Fatalf("remove w1: %v", err)
	}
	got := map[string]Step{}
	for _, s := range res.Steps {
		got[s.Name] = s
	}
	if d := got["drain"].Detail; d != "cordoned, 1 pods evicted: default/app (DaemonSet and static pods stay)" {
		t.Errorf("drain: %q", d)
	}
	if d := got["reset"].Detail; !strings.HasPrefix(d, "skipped: it does not answer over SSH") {
		t.Errorf("reset: %q", d)
	}
	if s := got["delete"]; !s.Changed || s.Detail != "deleted the Node" || !got["record"].Changed {
		t.Errorf("delete/record: %+v %+v", s, got["record"])
	}
	if _, err := c.Do(ctx, http.MethodGet, "/api/v1/nodes/w1", nil); !errors.Is(err, kubeapi.ErrNotFound) {
		t.Errorf("Node w1 after the removal: %v", err)
	}
	var app, proxy pod
	_ = json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/namespaces/default/pods/app", nil), &app)
	_ = json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/namespaces/kube-system/pods/proxy", nil), &proxy)
	if app.Metadata.DeletionTimestamp == nil || proxy.Metadata.DeletionTimestamp != nil {
		t.Errorf("evictions: app deleting %v (want true), DaemonSet pod deleting %v (want false)",
			app.Metadata.DeletionTimestamp != nil, proxy.Metadata.DeletionTimestamp != nil)
	}
	h, err := nodestate.Open(statedir.Nodes(stateDir)).History("w1")
	if err != nil || len(h) != 1 || h[0].Kind != nodestate.Removed || h[0].Detail != "appliance node remove" {
		t.Errorf("history of w1: %+v %v", h, err)
	}

	// A PodDisruptionBudget that allows no disruption (no controller computes it here: 0 allowed)
	// makes the eviction answer 429; the drain gives up at its timeout naming the pod, and the
	// node is left cordoned and in the cluster, not recorded removed.
	createPod(t, c, "default", "guarded", "w2", map[string]any{"labels": map[string]string{"app": "guarded"}}, true)
	mustDo(t, c, http.MethodPost, "/apis/policy/v1/namespaces/default/poddisruptionbudgets", map[string]any{
		"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": map[string]any{"name": "guarded"},
		"spec": map[string]any{"minAvailable": 1, "selector": map[string]any{"matchLabels": map[string]string{"app": "guarded"}}},
	})
	o = opts("w2")
	o.DrainTimeout, o.Force = 3*time.Second, true
	_, err = Remove(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "drain w2: 1 pods still on it after 3s: default/guarded (its PodDisruptionBudget allows no eviction now)") {
		t.Errorf("remove w2 under a PodDisruptionBudget: %v", err)
	}
	var w2 node
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/nodes/w2", nil), &w2); err != nil || !w2.Spec.Unschedulable {
		t.Errorf("w2 after the failed drain: unschedulable %v (%v), want cordoned", w2.Spec.Unschedulable, err)
	}
	if h, _ := nodestate.Open(statedir.Nodes(stateDir)).History("w2"); len(h) != 0 {
		t.Errorf("a failed removal recorded history: %+v", h)
	}

	// A rerun finds everything done.
	o = opts("w1")
	o.Force = true
	res, err = Remove(ctx, o)
	if err != nil {
		t.Fatalf("rerun: %v", err)
	}
	for _, s := range res.Steps {
		if s.Changed {
			t.Errorf("rerun changed %s: %s", s.Name, s.Detail)
		}
	}
}

// TestDrainWaitsForEvictedPodsToBeDeleted: on a Ready node the drain returns only once the pods it
// evicted are deleted, whatever their phase. Since Kubernetes 1.27 the kubelet moves a pod being
// deleted to Succeeded or Failed before it deletes the object; a drain that skipped finished pods
// returned while the evicted pod was still bound to the node (the e2e's on-w1 pod in CI run 15).
// Real kube-apiserver; no kubelet runs here, so the test plays its two writes (the terminal phase,
// then the final delete).
func TestDrainWaitsForEvictedPodsToBeDeleted(t *testing.T) {
	stateDir := t.TempDir()
	c := startAPIServer(t, stateDir)
	ctx := context.Background()
	k := kube{c}

	mustDo(t, c, http.MethodPost, "/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "w3"}})
	var n map[string]any
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/nodes/w3", nil), &n); err != nil {
		t.Fatal(err)
	}
	n["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
	mustDo(t, c, http.MethodPut, "/api/v1/nodes/w3/status", n)
	owned := map[string]any{"ownerReferences": []any{map[string]any{
		"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "0d0b8c3e-0000-4000-8000-000000000002", "controller": true}}}
	createPod(t, c, "default", "web", "w3", owned, true)
	// A pod that finished on its own (a Job's): neither evicted nor waited for.
	createPod(t, c, "default", "job", "w3", owned, false)
	var job map[string]any
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/namespaces/default/pods/job", nil), &job); err != nil {
		t.Fatal(err)
	}
	job["status"] = map[string]any{"phase": "Succeeded"}
	mustDo(t, c, http.MethodPut, "/api/v1/namespaces/default/pods/job/status", job)

	// The eviction; a pod bound to a node is deleted gracefully: it gets a deletionTimestamp and
	// stays until its kubelet confirms.
	var web pod
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/namespaces/default/pods/web", nil), &web); err != nil {
		t.Fatal(err)
	}
	if err := k.evict(ctx, web); err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(mustDo(t, c, http.MethodGet, "/api/v1/namespaces/default/pods/web", nil), &p); err != nil {
		t.Fatal(err)
	}
	if p["metadata"].(map[string]any)["deletionTimestamp"] == nil {
		t.Fatalf("the evicted pod has no deletionTimestamp: %v", p["metadata"])
	}
	// The kubelet's first write: the terminal phase (its containers stopped), object not deleted yet.
	p["status"] = map[string]any{"phase": "Succeeded", "conditions": []any{map[string]any{"type": "Ready", "status": "False"}}}
	mustDo(t, c, http.MethodPut, "/api/v1/namespaces/default/pods/web/status", p)

	evicted, err := k.drain(ctx, "w3", 3*time.Second)
	if err == nil || err.Error() != "drain w3: 1 pods still on it after 3s: default/web (being deleted); rerun when they can move (more capacity, a looser PodDisruptionBudget)" {
		t.Errorf("drain while the evicted pod is Succeeded but not deleted: evicted %v, err %v; want it to wait for default/web", evicted, err)
	}

	// The kubelet's last write: the delete. Now the drain is done, and evicts nothing more.
	mustDo(t, c, http.MethodDelete, "/api/v1/namespaces/default/pods/web?gracePeriodSeconds=0", nil)
	evicted, err = k.drain(ctx, "w3", time.Minute)
	if err != nil || len(evicted) != 0 {
		t.Errorf("drain after the delete: evicted %v, err %v; want none and no error", evicted, err)
	}
	if _, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/default/pods/job", nil); err != nil {
		t.Errorf("the finished pod: %v, want it left alone", err)
	}
}

// TestRemovePowersOffThroughBMC: a worker powered through a Redfish BMC (issue 15 item 2, "powered
// off through its BMC when it has one") is drained, deleted and powered off: the real kube-apiserver
// holds its Node, and the BMC is the lab's Redfish BMC (test/redfishbmc: the project's own emulator,
// because no real BMC can run here; TLS with a pinned CA, sessions; no host behind it), whose system the test powers on first. A rerun finds it already off.
func TestRemovePowersOffThroughBMC(t *testing.T) {
	stateDir := t.TempDir()
	c := startAPIServer(t, stateDir)
	bmc := labredfish.Start(t, labredfish.Options{})
	ctx := context.Background()
	dir := t.TempDir()
	caFile, passFile := filepath.Join(dir, "bmc-ca.crt"), filepath.Join(dir, "bmc-password")
	if err := os.WriteFile(caFile, bmc.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(passFile, []byte(bmc.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Example()
	cfg.StateDir = stateDir
	var w2 config.Node
	for i := range cfg.Nodes {
		if cfg.Nodes[i].Name == "w2" {
			cfg.Nodes[i].Power = config.Power{Kind: config.PowerRedfish, Address: fmt.Sprintf("https://127.0.0.1:%d", bmc.Port),
				Username: bmc.User, PasswordFile: passFile, CAFile: caFile}
			w2 = cfg.Nodes[i]
		}
	}
	if w2.Name == "" {
		t.Fatal("config.Example has no w2")
	}
	target, err := bootstrap.PowerTarget(w2)
	if err != nil {
		t.Fatal(err)
	}
	state := func() power.State {
		t.Helper()
		b, err := power.New(ctx, target, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		s, err := b.PowerState(ctx)
		if err != nil {
			t.Fatalf("power state through the lab BMC: %v", err)
		}
		return s
	}
	b, err := power.New(ctx, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.PowerOn(ctx); err != nil {
		t.Fatalf("power on through the lab BMC: %v", err)
	}
	b.Close()
	// The fake driver applies a power change 1-11 s after the request, like real hardware.
	waitState := func(want power.State) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) { // a hang guard
			if s := state(); s == want {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("w2 is %s through its BMC, want %s", s, want)
			}
		}
	}
	waitState(power.StateOn)
	mustDo(t, c, http.MethodPost, "/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "w2"}})

	o := Options{Config: cfg, ConfigPath: "bootstrap.yaml", StateDir: stateDir, Node: "w2", PowerTarget: bootstrap.PowerTarget, DrainTimeout: time.Minute}
	res, err := Remove(ctx, o)
	if err != nil {
		t.Fatalf("remove w2: %v", err)
	}
	got := map[string]Step{}
	for _, s := range res.Steps {
		got[s.Name] = s
	}
	if s := got["power"]; !s.Changed || s.Detail != "powered off (redfish)" {
		t.Errorf("power step: %+v, want powered off (redfish)", s)
	}
	if d := got["reset"].Detail; !strings.HasPrefix(d, "skipped: no shell on it (power.kind redfish)") {
		t.Errorf("reset: %q", d)
	}
	waitState(power.StateOff)
	if _, err := c.Do(ctx, http.MethodGet, "/api/v1/nodes/w2", nil); !errors.Is(err, kubeapi.ErrNotFound) {
		t.Errorf("Node w2 after the removal: %v", err)
	}
	res, err = Remove(ctx, o)
	if err != nil {
		t.Fatalf("rerun: %v", err)
	}
	for _, s := range res.Steps {
		if s.Changed {
			t.Errorf("rerun changed %s: %s", s.Name, s.Detail)
		}
		if s.Name == "power" && s.Detail != "already off (redfish)" {
			t.Errorf("rerun's power step: %q, want already off", s.Detail)
		}
	}
}
