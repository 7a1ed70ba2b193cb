//go:build e2e

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/calico"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/overlay"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// The pod network's proofs (issue 13 item 1): pods on different nodes reach each other, a Service
// answers, and with Calico a NetworkPolicy denies and then allows real traffic. The lab runs Calico
// when its bundle holds calico.Image (build-bundle.sh with CALICO_BIN, selected by APPLIANCE_BUNDLE),
// else the bridge CNI, which enforces no NetworkPolicy: that subtest then says so and skips.

// cniNamespace holds the test's pods; it is deleted at the end so later subtests (day 2 drains w1)
// find none of them.
const cniNamespace = "cni-e2e"

// testImage is the fixture's busybox (docker.io/library/busybox:1.35, in every fixture bundle).
const testImage = "docker.io/library/busybox:1.35"

// e2eCNI is the CNI the lab's configuration asks for: calico when the bundle at bundlePath has
// calico.Image, else flannel (on the two-subnet lab, newK8sLabCNI).
func e2eCNI(t *testing.T) string {
	t.Helper()
	b, err := bundle.Open(bundlePath)
	if err != nil {
		t.Fatalf("bundle %s: %v", bundlePath, err)
	}
	lp, err := layout.FromPath(b.ImagesDir())
	if err != nil {
		t.Logf("bundle %s: no image layout (%v): the lab runs the %s CNI", bundlePath, err, config.CNIBridge)
		return config.CNIBridge
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Annotations[bundle.RefNameAnnotation] == calico.Image {
			t.Logf("bundle %s has %s: the lab runs the %s CNI", bundlePath, calico.Image, config.CNICalico)
			return config.CNICalico
		}
	}
	t.Logf("bundle %s has no %s (build-bundle.sh CALICO_BIN=…): the lab runs the %s CNI (flannel's VXLAN, the overlay of the appliance's own image) on the two-subnet lab", bundlePath, calico.Image, config.CNIFlannel)
	return config.CNIFlannel
}

// calicoOnly is the template's CNI: "calico" or "flannel" sets networks.cni (and workloadPlane.mtu
// 1500, the lab veths' MTU); the bridge default writes neither, so the bridge lab's configuration is
// unchanged.
func calicoOnly(cni string) string {
	if cni != config.CNIBridge {
		return cni
	}
	return ""
}

// kubeStdin runs kubectl like kube with stdin.
func (k *k8sLab) kubeStdin(stdin string, args ...string) (string, error) {
	argv := append([]string{k.kubectl, "--kubeconfig", statedir.AdminKubeconfig(k.state), "--server", apiVIPURL, "--request-timeout", "10s"}, args...)
	cmd := k.exec("boot", argv...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// poll calls f every second until it returns nil or d has passed (a bound on a hang, not a timed
// assertion), and returns its last error.
func poll(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// webPod serves its own name over HTTP on port 8080 (busybox httpd); clientPod only sleeps, for
// kubectl exec. Both are pinned to a node (nodeName) and tolerate every taint.
func webPod(name, node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[3]s, labels: {app: web}}
spec:
  nodeName: %[2]s
  tolerations: [{operator: Exists}]
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: %[4]s
    command: [sh, -c, "mkdir -p /www && echo %[1]s > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: [{containerPort: 8080}]
`, name, node, cniNamespace, testImage)
}

func clientPod(name, node, role string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[3]s, labels: {role: %[4]s}}
spec:
  nodeName: %[2]s
  tolerations: [{operator: Exists}]
  terminationGracePeriodSeconds: 0
  containers:
  - name: client
    image: %[5]s
    command: [sleep, "3600"]
`, name, node, cniNamespace, role, testImage)
}

type podInfo struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		PodIP      string `json:"podIP"`
		Conditions []struct {
			Type               string    `json:"type"`
			Status             string    `json:"status"`
			LastTransitionTime time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
	} `json:"status"`
}

func (p podInfo) readySince() (time.Time, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" && c.Status == "True" {
			return c.LastTransitionTime, true
		}
	}
	return time.Time{}, false
}

func (k *k8sLab) pods(namespace, selector string) ([]podInfo, error) {
	args := []string{"get", "pods", "-n", namespace, "-o", "json"}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	out, err := k.kube(args...)
	if err != nil {
		return nil, fmt.Errorf("kubectl get pods -n %s: %v", namespace, err)
	}
	var l struct {
		Items []podInfo `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// fetch runs wget in the client pod against url (at most 3 s, busybox's timeout) and returns the
// body; any failure is an error. Not wget -T: busybox 1.35's wget with -T ends by SIGSEGV (exit
// status 139) whatever the answer (checked on Debian's busybox 1:1.35.0-4+deb12u1).
func (k *k8sLab) fetch(client, url string) (string, error) {
	out, err := k.kube("exec", "-n", cniNamespace, client, "--", "timeout", "3", "wget", "-q", "-O", "-", url)
	if err != nil {
		return "", fmt.Errorf("%s: wget %s: %v %s", client, url, err, strings.TrimSpace(out))
	}
	return strings.TrimSpace(out), nil
}

// cniTimeline logs, per node, when (from the start of bootstrap) the node registered, its CNI pod
// (calico-node) became Ready and the Node became Ready, and the CNI's share of racked → Ready: the
// longest registered → Node Ready wait, which is the time the node waited for its pod network.
func (k *k8sLab) cniTimeline(t *testing.T, cni string, start time.Time, racked time.Duration) {
	out, err := k.kube("get", "nodes", "-o", "json")
	if err != nil {
		t.Errorf("kubectl get nodes: %v", err)
		return
	}
	var nodes struct {
		Items []struct {
			Metadata struct {
				Name              string    `json:"name"`
				CreationTimestamp time.Time `json:"creationTimestamp"`
			} `json:"metadata"`
			Status struct {
				Conditions []struct {
					Type               string    `json:"type"`
					Status             string    `json:"status"`
					LastTransitionTime time.Time `json:"lastTransitionTime"`
				} `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Errorf("kubectl get nodes: %v", err)
		return
	}
	cniReady := map[string]time.Time{}
	if cni != config.CNIBridge {
		ns, sel := calico.Namespace, "k8s-app=calico-node"
		if cni == config.CNIFlannel {
			ns, sel = overlay.Namespace, "app.kubernetes.io/name="+overlay.Name
		}
		ps, err := k.pods(ns, sel)
		if err != nil {
			t.Error(err)
		}
		for _, p := range ps {
			if at, ok := p.readySince(); ok {
				cniReady[p.Spec.NodeName] = at
			}
		}
	}
	rel := func(at time.Time) string {
		if at.IsZero() {
			return "      -"
		}
		return fmt.Sprintf("%+6.0fs", at.Sub(start).Seconds())
	}
	var b strings.Builder
	var longest time.Duration
	longestNode := ""
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Metadata.Name < nodes.Items[j].Metadata.Name })
	fmt.Fprintf(&b, "CNI %s (Kubernetes times, 1 s resolution, from the start of bootstrap):\n", cni)
	fmt.Fprintf(&b, "  %-5s %10s %12s %12s %8s\n", "node", "registered", "CNI ready", "Node Ready", "waited")
	for _, n := range nodes.Items {
		var ready time.Time
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready = c.LastTransitionTime
			}
		}
		wait := ready.Sub(n.Metadata.CreationTimestamp)
		if ready.IsZero() {
			wait = 0
		}
		if wait > longest {
			longest, longestNode = wait, n.Metadata.Name
		}
		fmt.Fprintf(&b, "  %-5s %10s %12s %12s %7.0fs\n", n.Metadata.Name, rel(n.Metadata.CreationTimestamp), rel(cniReady[n.Metadata.Name]), rel(ready), wait.Seconds())
	}
	fmt.Fprintf(&b, "  CNI ready share of racked → Ready (%.1fs): %.1f%% (%s waited %.0fs from registration to Ready)",
		racked.Seconds(), 100*longest.Seconds()/racked.Seconds(), longestNode, longest.Seconds())
	t.Log("timeline\n" + b.String())
}

// podNetwork runs the pod network's proofs on the day-1 cluster (before day 2 changes the nodes).
func (k *k8sLab) podNetwork(t *testing.T, cni string, start time.Time, racked time.Duration) {
	t.Run("pod network ("+cni+"): CNI timeline", func(t *testing.T) {
		if err := poll(3*time.Minute, k.nodesReady); err != nil {
			t.Fatal(err)
		}
		k.cniTimeline(t, cni, start, racked)
	})
	if cni == config.CNIFlannel {
		t.Run("flannel: the overlay Ready on every node, pod ranges routed over VXLAN across the router", func(t *testing.T) {
			if err := poll(3*time.Minute, func() error {
				ps, err := k.pods(overlay.Namespace, "app.kubernetes.io/name="+overlay.Name)
				if err != nil {
					return err
				}
				var ready []string
				for _, p := range ps {
					if _, ok := p.readySince(); ok {
						ready = append(ready, p.Spec.NodeName)
					}
				}
				if len(ready) != len(k8sNodes) {
					return fmt.Errorf("%s Ready on %v of %v", overlay.Name, ready, k8sNodes)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			dev := overlay.DeviceName(config.VXLANVNI)
			for _, node := range k8sNodes {
				// The VXLAN device: VNI 1, UDP 4789, from the node's workload-plane address; and the
				// routes to every other node's pod range over it.
				out := k.ssh(t, node, "ip -d link show "+dev+" | head -3")
				if !strings.Contains(out, fmt.Sprintf("vxlan id %d local %s", config.VXLANVNI, k.wlAddr(node))) || !strings.Contains(out, fmt.Sprintf("dstport %d", config.VXLANPort)) {
					t.Errorf("%s: %s is not VXLAN %d on port %d from %s:\n%s", node, dev, config.VXLANVNI, config.VXLANPort, k.wlAddr(node), out)
				}
				for _, other := range k8sNodes {
					if other == node {
						continue
					}
					prefix := k.podRangeOf(t, other)
					if out, _ := k.run(node, "ip", "route", "show", prefix); !strings.Contains(out, "dev "+dev) {
						t.Errorf("%s: route to %s's pod range %s: %q, want it over %s", node, other, prefix, out, dev)
					}
				}
			}
		})
	}
	if cni == config.CNICalico {
		t.Run("calico: calico-node Ready on every node, and no bridge network left", func(t *testing.T) {
			if err := poll(3*time.Minute, func() error {
				ps, err := k.pods(calico.Namespace, "k8s-app=calico-node")
				if err != nil {
					return err
				}
				var ready []string
				for _, p := range ps {
					if _, ok := p.readySince(); ok {
						ready = append(ready, p.Spec.NodeName)
					}
				}
				if len(ready) != len(k8sNodes) {
					return fmt.Errorf("calico-node Ready on %v of %v", ready, k8sNodes)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			for _, node := range k8sNodes {
				out := k.ssh(t, node, "ls /etc/cni/net.d; ip -d link show vxlan.calico | head -3")
				if !strings.Contains(out, calico.CNIConfName) || strings.Contains(out, "10-appliance-bridge") || !strings.Contains(out, "vxlan id") {
					t.Errorf("%s: /etc/cni/net.d and vxlan.calico:\n%s", node, out)
				}
			}
		})
	}

	// Whatever happens below, the namespace and its pods are gone before day 2 starts: `appliance node
	// remove w1` refuses a node that runs pods no controller owns (web-w1 is one).
	defer k.deleteCNINamespace(t)
	// Servers on w1 and cp2, the clients on cp1: every path crosses a node.
	manifest := "apiVersion: v1\nkind: Namespace\nmetadata: {name: " + cniNamespace + "}\n---\n" +
		webPod("web-w1", "w1") + "---\n" + webPod("web-cp2", "cp2") + "---\n" +
		clientPod("client", "cp1", "client") + "---\n" + clientPod("other", "cp1", "other") + "---\n" +
		fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: %s}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`, cniNamespace)
	ips := map[string]string{}
	ok := t.Run("pod network ("+cni+"): pods on different nodes reach each other", func(t *testing.T) {
		if out, err := k.kubeStdin(manifest, "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		pods := netip.MustParsePrefix("10.233.0.0/16") // the lab's networks.pods (the default)
		if err := poll(3*time.Minute, func() error {
			ps, err := k.pods(cniNamespace, "")
			if err != nil {
				return err
			}
			var notReady []string
			for _, p := range ps {
				if _, ok := p.readySince(); !ok {
					notReady = append(notReady, p.Metadata.Name)
					continue
				}
				ips[p.Metadata.Name] = p.Status.PodIP
			}
			if len(ps) != 4 || len(notReady) > 0 {
				return fmt.Errorf("%d pods, not Ready: %v", len(ps), notReady)
			}
			return nil
		}); err != nil {
			out, _ := k.kube("get", "pods", "-n", cniNamespace, "-o", "wide")
			ev, _ := k.kube("get", "events", "-n", cniNamespace)
			t.Fatalf("%v\n%s\n%s", err, out, ev)
		}
		for name, ip := range ips {
			if a, err := netip.ParseAddr(ip); err != nil || !pods.Contains(a) {
				t.Errorf("%s has IP %q, outside networks.pods %s", name, ip, pods)
			}
		}
		for _, web := range []string{"web-w1", "web-cp2"} {
			body, err := k.fetch("client", "http://"+ips[web]+":8080/")
			if err != nil || body != web {
				t.Errorf("client (cp1) → %s (%s): %q, %v", web, ips[web], body, err)
			}
		}
		// The reverse direction, from w1 to cp1's pod: ping (busybox's, from the web pod).
		if out, err := k.kube("exec", "-n", cniNamespace, "web-w1", "--", "ping", "-c", "1", "-W", "2", ips["client"]); err != nil {
			t.Errorf("web-w1 (w1) → client (cp1) %s: ping: %v\n%s", ips["client"], err, out)
		}
	})
	if !ok {
		return
	}
	t.Run("pod network ("+cni+"): a Service answers", func(t *testing.T) {
		out, err := k.kube("get", "service", "-n", cniNamespace, "web", "-o", "jsonpath={.spec.clusterIP}")
		if err != nil {
			t.Fatalf("kubectl get service: %v", err)
		}
		seen := map[string]bool{}
		// kube-proxy balances at random: ask until both backends answered (bounded).
		for i := 0; i < 40 && len(seen) < 2; i++ {
			body, err := k.fetch("client", "http://"+strings.TrimSpace(out)+"/")
			if err != nil {
				t.Fatalf("Service web (%s): %v", out, err)
			}
			seen[body] = true
		}
		if !seen["web-w1"] || !seen["web-cp2"] {
			t.Errorf("Service web answered from %v, want web-w1 and web-cp2", seen)
		}
	})
	k.bandwidth(t, ips)
	t.Run("pod network ("+cni+"): a NetworkPolicy denies, then allows, real traffic", func(t *testing.T) {
		if cni != config.CNICalico {
			t.Skipf("SKIPPED: networks.cni is %s, which enforces no NetworkPolicy; the lab runs Calico when its bundle has %s (build-bundle.sh CALICO_BIN=…, APPLIANCE_BUNDLE=…)", cni, calico.Image)
		}
		url := "http://" + ips["web-w1"] + ":8080/"
		for _, c := range []string{"client", "other"} {
			if body, err := k.fetch(c, url); err != nil || body != "web-w1" {
				t.Fatalf("before any policy, %s → web-w1: %q, %v", c, body, err)
			}
		}
		deny := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-deny-all, namespace: %s}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
`, cniNamespace)
		if out, err := k.kubeStdin(deny, "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		denied := time.Now()
		if err := poll(time.Minute, func() error {
			if body, err := k.fetch("client", url); err == nil {
				return fmt.Errorf("client still reaches web-w1 (%q) under web-deny-all", body)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("web-deny-all enforced %.1fs after it was applied", time.Since(denied).Seconds())
		allow := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-allow-clients, namespace: %s}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 8080, protocol: TCP}]
`, cniNamespace)
		if out, err := k.kubeStdin(allow, "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		if err := poll(time.Minute, func() error {
			body, err := k.fetch("client", url)
			if err != nil || body != "web-w1" {
				return fmt.Errorf("client → web-w1 under web-allow-clients: %q, %v", body, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// The allow names role=client only: the other pod (role=other) stays denied.
		if body, err := k.fetch("other", url); err == nil {
			t.Errorf("other (role=other) reaches web-w1 (%q) although only role=client is allowed", body)
		}
		// Policies gone, traffic flows again.
		if out, err := k.kube("delete", "networkpolicy", "-n", cniNamespace, "--all"); err != nil {
			t.Fatalf("kubectl delete networkpolicy: %v\n%s", err, out)
		}
		if err := poll(time.Minute, func() error {
			_, err := k.fetch("other", url)
			return err
		}); err != nil {
			t.Errorf("after deleting the policies: %v", err)
		}
	})
}

// deleteCNINamespace deletes cniNamespace and waits (at most 2 minutes) until none of its pods is left.
func (k *k8sLab) deleteCNINamespace(t *testing.T) {
	if out, err := k.kube("delete", "namespace", cniNamespace, "--ignore-not-found", "--wait=false"); err != nil {
		t.Errorf("delete namespace %s: %v %s", cniNamespace, err, out)
		return
	}
	if err := poll(2*time.Minute, func() error {
		ps, err := k.pods(cniNamespace, "")
		if err != nil {
			return err
		}
		if len(ps) > 0 {
			return fmt.Errorf("%d pods of namespace %s left", len(ps), cniNamespace)
		}
		return nil
	}); err != nil {
		t.Errorf("deleting namespace %s: %v", cniNamespace, err)
	}
}
