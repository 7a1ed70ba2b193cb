package overlay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labns"
)

func TestMain(m *testing.M) {
	labns.ProbeMain(map[string]func([]string) int{"overlay": overlayProbe})
	os.Exit(m.Run())
}

// The lab of TestOverlayAcrossRouter: two nodes in two subnets joined by a router namespace.
const (
	subnetA, nodeAAddr, routerAAddr = "10.71.0.0/24", "10.71.0.2", "10.71.0.1"
	// nodeAKnown is node a's second address on the same link, the one the appliance knows it by
	// (nodes[].addresses): its VXLAN endpoint, although the CIDR order alone would pick the primary.
	nodeAKnown                      = "10.71.0.3"
	subnetB, nodeBAddr, routerBAddr = "10.72.0.0/24", "10.72.0.2", "10.72.0.1"
	podNetwork                      = "10.244.0.0/16"
	podCIDRA, podGatewayA, podA     = "10.244.1.0/24", "10.244.1.1", "10.244.1.2"
	podCIDRB, podGatewayB, podB     = "10.244.2.0/24", "10.244.2.1", "10.244.2.2"
	testVNI, testPort, testMTU      = 1, 4789, 1500
)

// overlayProbe is the test binary as one node's `appliance overlay` (one process per node, as flannel
// needs): overlay NODE KUBECONFIG STATEDIR PODRANGES PUBLICADDRESSES. It prints "ready" once Run registered the node and runs
// until stdin closes.
func overlayProbe(args []string) int {
	if len(args) != 6 {
		fmt.Println("error: overlay NODE KUBECONFIG STATEDIR PODRANGES PUBLICADDRESSES")
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = os.Stdin.Read(make([]byte, 1)) // EOF when the test closes stdin
		cancel()
	}()
	err := Run(ctx, Options{
		NodeName: args[1], Kubeconfig: args[2], StateDir: args[3], PodRangesFile: args[4], PublicAddressesFile: args[5],
		Network:     netip.MustParsePrefix(podNetwork),
		PublicCIDRs: []netip.Prefix{netip.MustParsePrefix(subnetA), netip.MustParsePrefix(subnetB)},
		VNI:         testVNI, Port: testPort, MTU: testMTU,
		Log:   slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Ready: func(Lease) { fmt.Println("ready") },
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

// TestOverlayAcrossRouter runs the overlay for real: two node namespaces in different subnets
// (10.71.0.0/24 and 10.72.0.0/24) joined only by a router namespace that has no route to any pod
// address, a real kube-apiserver (test/kubetest) with Node objects registered without
// spec.podCIDR (kube-controller-manager runs with --allocate-node-cidrs=false here: the overlay
// sets it from the appliance's pod ranges, and refuses a node whose spec.podCIDR disagrees), the
// manifest's RBAC applied with kubectl and each overlay authenticated as the manifest's
// ServiceAccount, and a "pod" namespace behind each node. It proves a TCP connection from a pod
// address of node a reaches a pod address of node b (so it crossed the router inside VXLAN on UDP
// 4789), that flannel.1 is VXLAN VNI 1 on port 4789 with MTU 1450, that each node's annotations name
// its own workload-plane address, and that the path stops once node b's object is deleted.
func TestOverlayAcrossRouter(t *testing.T) {
	router, nodeA, nodeB := labns.New(t, "ovr"), labns.New(t, "ova"), labns.New(t, "ovb")
	pa, pb := labns.New(t, "opa"), labns.New(t, "opb")
	kubectl := labns.KubernetesBin(t, "kubectl")
	s := kubetest.StartAPIServer(t, kubetest.Options{})

	// The fabric: a and b reach each other only through the router.
	labns.Link(t, nodeA, nodeAAddr+"/24", router, routerAAddr+"/24")
	labns.Link(t, router, routerBAddr+"/24", nodeB, nodeBAddr+"/24") // (Link names the ends by side: no two alike)
	nodeA.MustRun("ip", "addr", "add", nodeAKnown+"/24", "dev", "v"+nodeA.Name[len(nodeA.Name)-6:]+"a")
	nodeA.MustRun("ip", "route", "add", "default", "via", routerAAddr)
	nodeB.MustRun("ip", "route", "add", "default", "via", routerBAddr)
	// The pods: an address of each node's pod range behind it (cni0's part, played by a veth).
	labns.Link(t, pa, podA+"/24", nodeA, podGatewayA+"/24")
	labns.Link(t, nodeB, podGatewayB+"/24", pb, podB+"/24")
	pa.MustRun("ip", "route", "add", "default", "via", podGatewayA)
	pb.MustRun("ip", "route", "add", "default", "via", podGatewayB)
	for _, ns := range []*labns.NS{router, nodeA, nodeB} {
		ns.MustRun("sysctl", "-qw", "net.ipv4.ip_forward=1")
	}
	if out, err := router.Run("ip", "route", "get", podB); err == nil {
		t.Fatalf("the router has a route to the pods, the test would prove nothing: %s", out)
	}

	// The manifest's objects, applied as hostagent applies them, and the nodes as kubelet and
	// kube-controller-manager leave them (spec.podCIDR allocated).
	m, err := Manifest(ManifestOptions{Image: testImage, Network: netip.MustParsePrefix(podNetwork),
		PublicCIDRs: []netip.Prefix{netip.MustParsePrefix(subnetA), netip.MustParsePrefix(subnetB)},
		VNI:         testVNI, Port: testPort, MTU: testMTU, APIServer: "10.71.0.100:6443",
		PodRanges: map[string]netip.Prefix{"a": netip.MustParsePrefix(podCIDRA), "b": netip.MustParsePrefix(podCIDRB), "c": netip.MustParsePrefix("10.244.3.0/24"),
			"d": netip.MustParsePrefix("10.244.4.0/24")},
		PublicAddresses: map[string]netip.Addr{"a": netip.MustParseAddr(nodeAKnown), "b": netip.MustParseAddr(nodeBAddr), "d": netip.MustParseAddr("10.72.0.77")}})
	if err != nil {
		t.Fatal(err)
	}
	kube := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(kubectl, append([]string{"--kubeconfig", s.AdminKubeconfig}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	kube(string(m), "apply", "--server-side", "--field-manager", "appliance", "-f", "-")
	kube("apiVersion: v1\nkind: Node\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: b\n---\n"+
		"apiVersion: v1\nkind: Node\nmetadata:\n  name: c\nspec:\n  podCIDR: 10.244.9.0/24\n", "apply", "-f", "-")

	dir := t.TempDir()
	ranges := filepath.Join(dir, PodRangesKey)
	if err := os.WriteFile(ranges, []byte(kube("", "get", "configmap", "-n", Namespace, Name, "-o", `jsonpath={.data.pod-ranges\.json}`)), 0o644); err != nil {
		t.Fatal(err)
	}
	addrs := filepath.Join(dir, PublicAddressesKey)
	if err := os.WriteFile(addrs, []byte(kube("", "get", "configmap", "-n", Namespace, Name, "-o", `jsonpath={.data.public-addresses\.json}`)), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "overlay.conf")
	s.WriteKubeconfig(t, kubeconfig, "system:serviceaccount:"+Namespace+":"+Name, "system:serviceaccounts", "system:serviceaccounts:"+Namespace)
	for _, n := range []struct {
		name string
		ns   *labns.NS
	}{{"a", nodeA}, {"b", nodeB}} {
		s.ServeIn(t, n.ns)
		labns.StartProbe(t, n.ns, "overlay", n.name, kubeconfig, filepath.Join(dir, n.name), ranges, addrs)
	}
	// Node c registered with another range than the appliance's: refused, named, nothing set up.
	stdin, keepOpen, err := os.Pipe() // the probe runs until its stdin closes: hold it open
	if err != nil {
		t.Fatal(err)
	}
	defer keepOpen.Close()
	for node, want := range map[string]string{
		"c": "node c has spec.podCIDR 10.244.9.0/24 but the appliance assigned it 10.244.3.0/24",
		// Node d is known by an address its host does not carry: refused, naming it.
		"d": "the appliance knows node d by 10.72.0.77 (its workload-plane address in nodes[].addresses), which is not a usable address here",
	} {
		cmd := labns.ProbeCommand(t, nodeA, "overlay", node, kubeconfig, filepath.Join(dir, node), ranges, addrs)
		cmd.Stdin = stdin
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("overlay for node %s: %v, output lacks %q:\n%s", node, err, want, out)
		}
	}
	stdin.Close()

	for _, n := range []string{"a", "b"} {
		if err := Ready(filepath.Join(dir, n)); err != nil {
			t.Errorf("node %s: %v after the overlay said ready", n, err)
		}
	}
	if err := Ready(filepath.Join(dir, "c")); !errors.Is(err, ErrNotReady) {
		t.Errorf("node c (refused): Ready = %v, want ErrNotReady", err)
	}
	for node, want := range map[string]string{"a": podCIDRA, "b": podCIDRB} {
		if got := kube("", "get", "node", node, "-o", "jsonpath={.spec.podCIDR}"); got != want {
			t.Errorf("node %s spec.podCIDR %q, want the appliance's %s", node, got, want)
		}
	}
	for node, want := range map[string]string{"a": nodeAKnown, "b": nodeBAddr} {
		if got := kube("", "get", "node", node, "-o", `jsonpath={.metadata.annotations.flannel\.alpha\.coreos\.com/public-ip}`); got != want {
			t.Errorf("node %s public-ip annotation %q, want its workload-plane address %s", node, got, want)
		}
		if got := kube("", "get", "node", node, "-o", `jsonpath={.status.conditions[?(@.type=="NetworkUnavailable")].status}`); got != "False" {
			t.Errorf("node %s NetworkUnavailable %q, want False", node, got)
		}
	}
	link := nodeA.MustRun("ip", "-d", "link", "show", DeviceName(testVNI))
	for _, want := range []string{"mtu 1450", "vxlan id 1 ", "local " + nodeAKnown + " ", "dstport 4789"} {
		if !strings.Contains(link, want) {
			t.Errorf("%s on node a lacks %q:\n%s", DeviceName(testVNI), want, link)
		}
	}

	labns.StartProbe(t, pb, "listen", podB+":8080")
	eventually(t, "pod a reaches pod b across the router", func() error {
		if got := labns.ProbeOnce(t, pa, "dial", podA, podB+":8080"); got != "open" {
			return fmt.Errorf("dial: %s", got)
		}
		return nil
	})
	if route := nodeA.MustRun("ip", "route", "get", podB); !strings.Contains(route, "dev "+DeviceName(testVNI)) {
		t.Errorf("node a routes pod b's address not over %s: %s", DeviceName(testVNI), route)
	}

	kube("", "delete", "node", "b")
	eventually(t, "node a forgets node b's pod range", func() error {
		if out := nodeA.MustRun("ip", "route", "show", podCIDRB); strings.TrimSpace(out) != "" {
			return fmt.Errorf("route still there: %s", out)
		}
		return nil
	})
	if got := labns.ProbeOnce(t, pa, "dial", podA, podB+":8080"); !strings.HasPrefix(got, "blocked") {
		t.Errorf("pod a still reaches pod b after node b was deleted: %s", got)
	}
}

// eventually polls cond until it returns nil, failing the test with cond's last error after a
// bound that only catches a hang (nothing is asserted about time).
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
