// Package overlay is the pod network of networks.cni flannel: flannel's VXLAN backend
// (github.com/flannel-io/flannel pkg/backend/vxlan) with flannel's Kubernetes subnet manager
// (pkg/subnet/kube), embedded in the appliance's own binary the way k3s embeds them in its agent
// (k3s pkg/agent/flannel) instead of running flanneld. It is the only importer of flannel.
//
// On each node `appliance overlay` (run by the DaemonSet Manifest renders, host network, NET_ADMIN):
//   - picks the node's public address: the one the appliance knows for it
//     (Options.PublicAddressesFile, the first of its configured addresses inside the workload-plane
//     CIDRs, as the appliance resolves it), which must be local; for a node not listed there, the
//     first local IPv4 address inside the workload-plane CIDRs, tried in their order
//     (pkg/netresolve);
//   - gives its Node object the pod range the appliance assigned it (Options.PodRangesFile: the
//     appliance assigns every node's range itself, hostagent's bridge network on cni0 hands out its
//     addresses, and kube-controller-manager runs with --allocate-node-cidrs=false), as
//     spec.podCIDR when that is still empty, and refuses a node whose spec.podCIDR says otherwise;
//   - lets flannel read the node's spec.podCIDR and record its annotations on the node
//     (flannel.alpha.coreos.com/public-ip, backend-data with the VTEP MAC, …);
//   - creates the VXLAN device flannel.<VNI> (VNI 1, UDP port 4789, MTU = link MTU − 50) with the
//     first address of the node's pod range as a /32, and for every other node with those
//     annotations programs a route to its pod range via flannel.<VNI> (onlink), an ARP entry and a
//     forwarding-database entry to its public address: pod traffic crosses subnets and routers as
//     UDP between the nodes' workload-plane addresses;
//   - removes them again when a node object is deleted, and sets the node's NetworkUnavailable
//     condition to False.
//
// It writes nothing else: no masquerade or forward rules (pod traffic leaves unmasqueraded, as with
// the bridge CNI), no CNI configuration (hostagent writes the bridge network on cni0 for the node's
// pod range), no subnet.env; only the net-conf.json flannel's subnet manager reads and ReadyFile, in Options.StateDir,
// and on the API its Node object's spec.podCIDR (once) and flannel's annotations and condition.
package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/flannel-io/flannel/pkg/backend"
	_ "github.com/flannel-io/flannel/pkg/backend/vxlan" // registers the "vxlan" backend
	"github.com/flannel-io/flannel/pkg/subnet/kube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airgap-appliance/appliance/pkg/netresolve"
)

// AnnotationPrefix is the prefix of the node annotations flannel's subnet manager writes and reads:
// flanneld's default (--kube-annotation-prefix), so flannel's own tools and documentation apply.
const AnnotationPrefix = "flannel.alpha.coreos.com"

// NetConfFile is the name of flannel's network configuration in Options.StateDir; ReadyFile the
// file Run writes there once the node is registered (its Lease as JSON) and removes when it stops,
// which Ready checks (the DaemonSet's readiness probe, `appliance overlay ready`).
const (
	NetConfFile = "net-conf.json"
	ReadyFile   = "ready"
)

// ErrNotReady is returned by Ready while the overlay has not registered the node.
var ErrNotReady = errors.New("overlay: not ready")

// Ready reports whether the overlay running with stateDir has registered its node (nil), else an
// error wrapping ErrNotReady.
func Ready(stateDir string) error {
	if _, err := os.Stat(filepath.Join(stateDir, ReadyFile)); err != nil {
		return fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	return nil
}

// DeviceName is the VXLAN device flannel creates for vni: "flannel.<vni>".
func DeviceName(vni int) string { return fmt.Sprintf("flannel.%d", vni) }

// Options configure Run.
type Options struct {
	// Kubeconfig is a kubeconfig file; "" uses the pod's service account (in-cluster).
	Kubeconfig string
	// NodeName is this node's Kubernetes node name (the DaemonSet passes spec.nodeName). Required.
	NodeName string
	// Network is the cluster's pod network (networks.pods, IPv4); every node's spec.podCIDR must lie
	// inside it. Required.
	Network netip.Prefix
	// PublicCIDRs are networks.workloadPlane.cidrs in their order: the node's VXLAN endpoint is its
	// first usable local IPv4 address inside them (netresolve.Resolver.Resolve). At least one IPv4.
	PublicCIDRs []netip.Prefix
	// VNI is the VXLAN network identifier (RFC 7348 §5), 1..16777215; Port the VXLAN UDP
	// destination port, 1..65535.
	VNI, Port int
	// MTU is the workload-plane link MTU in bytes; flannel.<VNI> gets MTU − 50 (VXLAN's IPv4
	// overhead, RFC 7348 §5). 0: the MTU of the interface holding the public address.
	MTU int
	// PodRangesFile, when set, is a JSON object of node name → pod range (the appliance's
	// assignment, PodRangesKey of the manifest's ConfigMap): Run sets its node's spec.podCIDR (and
	// spec.podCIDRs) to its range when empty, and fails when it holds another one or the file has no
	// range for the node while spec.podCIDR is empty. Empty: spec.podCIDR is taken as it is.
	PodRangesFile string
	// PublicAddressesFile, when set, is a JSON object of node name → IPv4 address (the appliance's
	// workload-plane address of each node, PublicAddressesKey of the manifest's ConfigMap): a listed
	// node's VXLAN endpoint is that address, which must be a usable local address; a node not
	// listed resolves PublicCIDRs.
	PublicAddressesFile string
	// StateDir is where NetConfFile is written (made 0755 if missing). Required.
	StateDir string
	// Log receives progress (flannel itself logs through klog). Nil: discard.
	Log *slog.Logger
	// Ready, when set, is called once the VXLAN device exists and the node's lease (pod range and
	// annotations) is recorded, before routes to the other nodes are programmed.
	Ready func(Lease)
}

// Lease is this node's part of the overlay once Run has registered it.
type Lease struct {
	// PodCIDR is the node's pod range (spec.podCIDR) and PublicAddr its VXLAN endpoint, on Interface.
	PodCIDR    netip.Prefix `json:"podCIDR"`
	PublicAddr netip.Addr   `json:"publicAddress"`
	Interface  string       `json:"interface"`
	// MTU is the MTU left to pods (flannel.<VNI>'s MTU).
	MTU int `json:"mtu"`
}

// ErrOptions is wrapped by Run's errors for options it cannot use.
var ErrOptions = errors.New("overlay: invalid options")

// netConf is flannel's net-conf.json (pkg/subnet.Config) with the vxlan backend's configuration
// (pkg/backend/vxlan.VXLANConfig).
type netConf struct {
	Network    string      `json:"Network"`
	EnableIPv4 bool        `json:"EnableIPv4"`
	Backend    backendConf `json:"Backend"`
}

type backendConf struct {
	Type string `json:"Type"`
	VNI  int    `json:"VNI"`
	Port int    `json:"Port"`
	MTU  int    `json:"MTU,omitempty"`
}

// NetConf renders flannel's net-conf.json for o (deterministic JSON): Network, IPv4 only, backend
// vxlan with VNI, Port and (when set) MTU.
func NetConf(o Options) ([]byte, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(netConf{Network: o.Network.Masked().String(), EnableIPv4: true,
		Backend: backendConf{Type: "vxlan", VNI: o.VNI, Port: o.Port, MTU: o.MTU}}, "", "  ")
	return append(b, '\n'), err
}

func (o Options) check() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrOptions}, a...)...))
	}
	if o.NodeName == "" {
		bad("node name: required (the pod's spec.nodeName)")
	}
	if !o.Network.IsValid() || !o.Network.Addr().Is4() {
		bad("network %q: give the IPv4 pod network (networks.pods)", o.Network)
	}
	if publicCIDRs(o.PublicCIDRs) == nil {
		bad("public CIDRs %v: give the workload-plane CIDRs, at least one IPv4", o.PublicCIDRs)
	}
	if o.VNI < 1 || o.VNI > 1<<24-1 {
		bad("VNI %d: give 1..16777215 (RFC 7348 §5)", o.VNI)
	}
	if o.Port < 1 || o.Port > 65535 {
		bad("port %d: give a UDP port, 1..65535", o.Port)
	}
	if o.MTU != 0 && o.MTU < 576+50 {
		bad("MTU %d: give the link MTU (at least 626: 576 for pods plus 50 for VXLAN), or 0 for the interface's", o.MTU)
	}
	if o.StateDir == "" {
		bad("state directory: required (where %s is written)", NetConfFile)
	}
	return errors.Join(errs...)
}

// publicCIDRs returns the valid IPv4 prefixes of cidrs in order (nil when there is none).
func publicCIDRs(cidrs []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if c.IsValid() && c.Addr().Is4() {
			out = append(out, c)
		}
	}
	return out
}

// Run runs the overlay on this node until ctx ends (see the package comment); it returns nil then,
// or the first error that stops it: invalid options (ErrOptions), no local address inside the
// public CIDRs (netresolve.ErrNoMatch), the API server unreachable or the node missing or without
// spec.podCIDR for flannel's 30 s, a pod range outside Network, or the VXLAN device not created.
// It must run in the node's network namespace (host network) with CAP_NET_ADMIN, one Run per
// process: flannel's subnet manager takes the node name from the environment (NODE_NAME, which Run
// sets) and programs the namespace of the whole process.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conf, err := NetConf(o)
	if err != nil {
		return err
	}
	r, err := netresolve.New("")
	if err != nil {
		return err
	}
	pub, err := publicAddress(r, o)
	r.Close()
	if err != nil {
		return fmt.Errorf("overlay: public address: %w", err)
	}
	iface, err := net.InterfaceByName(pub.Interface)
	if err != nil {
		return fmt.Errorf("overlay: interface %s of %s: %w", pub.Interface, pub.Prefix.Addr(), err)
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	readyPath := filepath.Join(o.StateDir, ReadyFile)
	if err := os.Remove(readyPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("overlay: %w", err)
	}
	defer os.Remove(readyPath)
	confPath := filepath.Join(o.StateDir, NetConfFile)
	if err := os.WriteFile(confPath, conf, 0o644); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	if o.PodRangesFile != "" {
		if err := assignPodCIDR(ctx, o, log); err != nil {
			return err
		}
	}
	if err := os.Setenv("NODE_NAME", o.NodeName); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	log.Info("overlay starting", "node", o.NodeName, "publicAddress", pub.Prefix.Addr(), "interface", pub.Interface,
		"cidr", pub.CIDR, "network", o.Network, "vni", o.VNI, "port", o.Port)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait() // flannel's goroutines end with ctx (cancelled first: defers run last-in first-out)
	sm, err := kube.NewSubnetManager(ctx, "", o.Kubeconfig, AnnotationPrefix, confPath, true)
	if err != nil {
		return fmt.Errorf("overlay: flannel's Kubernetes subnet manager: %w", err)
	}
	config, err := sm.GetNetworkConfig(ctx)
	if err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	addr := pub.Prefix.Addr().AsSlice()
	ext := &backend.ExternalInterface{Iface: iface, IfaceName: iface.Name, IfaceAddr: addr, ExtAddr: addr}
	be, err := backend.NewManager(ctx, sm, ext).GetBackend(config.BackendType)
	if err != nil {
		return fmt.Errorf("overlay: flannel backend %q: %w", config.BackendType, err)
	}
	bn, err := be.RegisterNetwork(ctx, &wg, config)
	if err != nil {
		return fmt.Errorf("overlay: register node %s: %w", o.NodeName, err)
	}
	l := Lease{PublicAddr: pub.Prefix.Addr(), Interface: pub.Interface, MTU: bn.MTU()}
	if sn := bn.Lease().Subnet.ToIPNet(); sn != nil {
		if a, ok := netip.AddrFromSlice(sn.IP.To4()); ok {
			ones, _ := sn.Mask.Size()
			l.PodCIDR = netip.PrefixFrom(a, ones)
		}
	}
	log.Info("overlay registered", "node", o.NodeName, "podCIDR", l.PodCIDR, "device", DeviceName(o.VNI), "podMTU", l.MTU)
	if b, err := json.Marshal(l); err != nil {
		return err
	} else if err := os.WriteFile(readyPath, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	if o.Ready != nil {
		o.Ready(l)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		bn.Run(ctx)
	}()
	if err := sm.CompleteLease(ctx, bn.Lease(), &wg); err != nil {
		// flanneld logs this and carries on: the routes work without the condition.
		log.Warn("overlay: setting the node's NetworkUnavailable condition failed", "node", o.NodeName, "error", err)
	}
	<-ctx.Done()
	log.Info("overlay stopping", "node", o.NodeName)
	return nil
}

// nodeWait bounds how long assignPodCIDR waits for the node object (kubelet registers it; the
// DaemonSet's pod only runs once it exists, so this bounds a hang, not a normal wait).
const nodeWait = 2 * time.Minute

// assignPodCIDR gives node o.NodeName the pod range o.PodRangesFile assigns it (see PodRangesFile).
func assignPodCIDR(ctx context.Context, o Options, log *slog.Logger) error {
	b, err := os.ReadFile(o.PodRangesFile)
	if err != nil {
		return fmt.Errorf("overlay: pod ranges: %w", err)
	}
	var ranges map[string]netip.Prefix
	if err := json.Unmarshal(b, &ranges); err != nil {
		return fmt.Errorf("overlay: pod ranges %s: %w", o.PodRangesFile, err)
	}
	want, assigned := ranges[o.NodeName]
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("overlay: kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	var node *corev1.Node
	err = wait.PollUntilContextTimeout(ctx, time.Second, nodeWait, true, func(ctx context.Context) (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
		if err != nil {
			log.Info("overlay: waiting for the node object", "node", o.NodeName, "error", err)
			return false, nil
		}
		node = n
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("overlay: node %s: %w", o.NodeName, err)
	}
	switch have := node.Spec.PodCIDR; {
	case assigned && have == want.String():
		return nil
	case assigned && have != "":
		return fmt.Errorf("overlay: node %s has spec.podCIDR %s but the appliance assigned it %s (its bridge network hands out those addresses): delete the node object and let it register again", o.NodeName, have, want)
	case !assigned && have == "":
		return fmt.Errorf("overlay: node %s has no pod range in %s and no spec.podCIDR: add the node to the appliance's inventory (nodes[]) and rerun bootstrap", o.NodeName, o.PodRangesFile)
	case !assigned:
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": want.String(), "podCIDRs": []string{want.String()}}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, o.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: Name}); err != nil {
		return fmt.Errorf("overlay: set node %s's spec.podCIDR to %s: %w", o.NodeName, want, err)
	}
	log.Info("overlay: node pod range set", "node", o.NodeName, "podCIDR", want)
	return nil
}

// publicAddress is the node's VXLAN endpoint (see Options.PublicAddressesFile and PublicCIDRs).
func publicAddress(r *netresolve.Resolver, o Options) (netresolve.Address, error) {
	if o.PublicAddressesFile != "" {
		b, err := os.ReadFile(o.PublicAddressesFile)
		if err != nil {
			return netresolve.Address{}, err
		}
		var addrs map[string]netip.Addr
		if err := json.Unmarshal(b, &addrs); err != nil {
			return netresolve.Address{}, fmt.Errorf("%s: %w", o.PublicAddressesFile, err)
		}
		if want, ok := addrs[o.NodeName]; ok {
			all, err := r.Addresses()
			if err != nil {
				return netresolve.Address{}, err
			}
			var have []string
			for _, a := range all {
				if a.Prefix.Addr() == want {
					return a, nil
				}
				have = append(have, a.String())
			}
			return netresolve.Address{}, fmt.Errorf("%w: the appliance knows node %s by %s (its workload-plane address in nodes[].addresses), which is not a usable address here (this host has: %s): put it on the node's workload-plane interface, or correct nodes[].addresses",
				netresolve.ErrNoMatch, o.NodeName, want, strings.Join(have, ", "))
		}
	}
	return r.Resolve(publicCIDRs(o.PublicCIDRs))
}
