package applianced

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/mdlayher/packet"
	"github.com/pin/tftp/v3"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodeiso"
	"github.com/airgap-appliance/appliance/pkg/nodeiso/nodeisotest"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

// The serve-level network-boot test runs the real `appliance serve` (Serve, as a child process of
// this test binary started with `ip netns exec`, so every socket it opens is in the lab namespace)
// over a state directory and bundle made here, and real clients in a second namespace joined by a
// veth pair: insomniacslk's nclient4 (raw-socket DHCP client, as a PXE ROM asks), pin/tftp's client
// and net/http.

// serveConfigEnv names the configuration file when the test binary runs as TestHelperServe.
const serveConfigEnv = "APPLIANCED_SERVE_CONFIG"

// serveReadyLine is what TestHelperServe prints on stderr once Serve accepts connections.
const serveReadyLine = "APPLIANCED-SERVE-READY"

// TestHelperServe is not a test: started by TestLabServeNetboot inside a lab namespace, it runs
// Serve with the configuration in $APPLIANCED_SERVE_CONFIG until SIGTERM, then exits 0 if Serve
// returned without error.
func TestHelperServe(t *testing.T) {
	path := os.Getenv(serveConfigEnv)
	if path == "" {
		t.Skip("helper process for TestLabServeNetboot")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ready := make(chan struct{})
	go func() {
		select {
		case <-ready:
			fmt.Fprintln(os.Stderr, serveReadyLine)
		case <-ctx.Done():
		}
	}()
	err := Serve(ctx, ServeOptions{ConfigPath: path, Ready: ready,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "serve returned")
	os.Exit(0)
}

// serveProc is a running TestHelperServe.
type serveProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	log    bytes.Buffer
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

func (p *serveProc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// stop sends SIGTERM and waits (at most 30 s, then SIGKILL) for the process; it returns Wait's error.
func (p *serveProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return p.err
}

func startServe(t *testing.T, ns *labns.NS, configPath string) *serveProc {
	t.Helper()
	cmd := ns.Command(os.Args[0], "-test.run=^TestHelperServe$")
	cmd.Env = append(os.Environ(), serveConfigEnv+"="+configPath)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if sc.Text() == serveReadyLine {
				once.Do(func() { close(ready) })
			}
		}
	}()
	go func() {
		<-scanned
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.stop()
		t.Logf("appliance serve log (pid %d):\n%s", cmd.Process.Pid, p.Log())
	})
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("appliance serve exited before it was ready: %v\n%s", p.err, p.Log())
	case <-time.After(60 * time.Second):
		t.Fatalf("appliance serve not ready after 60 s:\n%s", p.Log())
	}
	return p
}

// dhcpReplyFilter is a BPF program for a datagram packet socket that accepts only DHCP replies
// (UDP port 68) whose chaddr (RFC 2131 §2, offset 28 of the BOOTP message) is mac, as that
// machine's NIC would see them.
func dhcpReplyFilter(mac net.HardwareAddr) []bpf.RawInstruction {
	hi := uint32(mac[0])<<24 | uint32(mac[1])<<16 | uint32(mac[2])<<8 | uint32(mac[3])
	lo := uint32(mac[4])<<8 | uint32(mac[5])
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 9, Size: 1}, // IP protocol
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 17, SkipFalse: 9},
		bpf.LoadAbsolute{Off: 6, Size: 2}, // flags + fragment offset
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 7},
		bpf.LoadMemShift{Off: 0},          // X = IP header length
		bpf.LoadIndirect{Off: 2, Size: 2}, // UDP destination port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 68, SkipFalse: 4},
		bpf.LoadIndirect{Off: 8 + 28, Size: 4}, // chaddr[0:4]
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: hi, SkipFalse: 2},
		bpf.LoadIndirect{Off: 8 + 32, Size: 2}, // chaddr[4:6]
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: lo, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 0xffff},
	})
	if err != nil {
		panic(err)
	}
	return raw
}

// pxeDHCPClient is an nclient4 client for the machine with mac on iface in ns.
func pxeDHCPClient(t *testing.T, ns *labns.NS, iface string, mac net.HardwareAddr, opts ...nclient4.ClientOpt) *nclient4.Client {
	t.Helper()
	var c *nclient4.Client
	err := labns.InNamespace(ns.Path(), func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		raw, err := packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, &packet.Config{Filter: dhcpReplyFilter(mac)})
		if err != nil {
			return err
		}
		conn := nclient4.NewBroadcastUDPConn(raw, &net.UDPAddr{Port: dhcpv4.ClientPort})
		c, err = nclient4.NewWithConn(conn, mac, append([]nclient4.ClientOpt{nclient4.WithTimeout(2 * time.Second), nclient4.WithRetry(2)}, opts...)...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pxeROM are the options a PXE ROM sends (PXE 2.1 §2.2.1, RFC 4578): vendor class PXEClient,
// client architecture arch, client machine identifier; plus extra.
func pxeROM(arch iana.Arch, extra ...dhcpv4.Modifier) []dhcpv4.Modifier {
	return append([]dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, bytes.Repeat([]byte{0xab}, 16)...)),
	}, extra...)
}

// TestLabServeNetboot: `appliance serve` with boot.dhcp: proxy starts the network-boot service on the
// control-plane interface it resolves, for the network-bootable nodes only, and stops it when it
// stops. A machine of the inventory (w1: ipmi, bootDevice pxe, a mac) gets the proxyDHCP offer (no
// address) with undionly.kpxe from the appliance's control-plane address, reads it by TFTP (the
// bytes of Debian's ipxe package), as iPXE gets its script's URL, and the script names the node and
// carries the appliance URL and CA pin and no token; the kernel served is the bundle's node-image
// kernel (the default boot.kernel). An unknown MAC, and a node of the inventory that does not boot
// from the network (cp1: bootDevice disk), get nothing. All of it through the appliance's own
// firewall (plan.ApplianceFirewall, applied by the real nftables backend). SIGTERM ends serve cleanly.
func TestLabServeNetboot(t *testing.T) {
	labns.RequireRoot(t)
	bios, err := os.ReadFile(filepath.Join(netboot.DefaultIPXEDir, netboot.BootFileBIOS))
	if err != nil {
		t.Fatalf("Debian's ipxe package is missing (%v): make deps", err)
	}
	srvNS, cliNS := labns.New(t, "nbs"), labns.New(t, "nbc")
	srvIf, cliIf := labns.Link(t, srvNS, "10.79.0.1/24", cliNS, "10.79.0.2/24")
	const (
		serverIP = "10.79.0.1"
		macW1    = "52:54:00:4e:53:21"
		macCP1   = "52:54:00:4e:53:11"
	)

	kernel := []byte("node image kernel " + time.Now().String())
	sl := newServeLab(t, kernel)
	cfgPath := sl.config(t, "10.79", `- name: cp1
  roles: [control-plane]
  addresses: [10.79.0.11, 10.80.0.11]
  mac: "`+macCP1+`"
  power: {kind: ipmi, address: 10.79.0.211, username: admin, passwordFile: `+sl.password+`, bootDevice: disk}
- name: w1
  roles: [worker]
  addresses: [10.79.0.21, 10.80.0.21]
  mac: "`+macW1+`"
  power: {kind: ipmi, address: 10.79.0.221, username: admin, passwordFile: `+sl.password+`}
boot:
  dhcp: proxy
  kernelArgs: [console=ttyS0]
`)
	caPEM := sl.caPEM

	// The appliance's own firewall, as the firewall phase applies it (policy drop): the network-boot
	// rows must let every step below through.
	applyApplianceFirewall(t, srvNS, cfgPath)
	serve := startServe(t, srvNS, cfgPath)
	if !strings.Contains(serve.Log(), "netboot: serving") || !strings.Contains(serve.Log(), "interface="+srvIf) {
		t.Errorf("serve did not log the network-boot service on %s:\n%s", srvIf, serve.Log())
	}
	ctx := context.Background()
	w1, _ := net.ParseMAC(macW1)

	// 1. The PXE ROM's DHCP: a proxy offer, no address, the BIOS iPXE from the appliance.
	lease, err := pxeDHCPClient(t, cliNS, cliIf, w1).Request(ctx, pxeROM(iana.INTEL_X86PC)...)
	if err != nil {
		t.Fatalf("w1's PXE DISCOVER/REQUEST: %v\n%s", err, serve.Log())
	}
	for _, m := range []*dhcpv4.DHCPv4{lease.Offer, lease.ACK} {
		if !m.YourIPAddr.IsUnspecified() {
			t.Errorf("%s offers address %s: proxy mode gives none", m.MessageType(), m.YourIPAddr)
		}
		if m.BootFileName != netboot.BootFileBIOS || m.ServerIPAddr.String() != serverIP {
			t.Errorf("%s: boot file %q from %s, want %q from %s", m.MessageType(), m.BootFileName, m.ServerIPAddr, netboot.BootFileBIOS, serverIP)
		}
	}

	// 2. TFTP of the boot file.
	tc, err := tftp.NewClient(serverIP + ":69")
	if err != nil {
		t.Fatal(err)
	}
	tc.SetTimeout(5 * time.Second)
	var got bytes.Buffer
	err = labns.InNamespace(cliNS.Path(), func() error {
		wt, err := tc.Receive(netboot.BootFileBIOS, "octet")
		if err != nil {
			return err
		}
		_, err = wt.WriteTo(&got)
		return err
	})
	if err != nil || !bytes.Equal(got.Bytes(), bios) {
		t.Fatalf("TFTP %s: %d bytes, err %v; want the %d bytes of %s", netboot.BootFileBIOS, got.Len(), err, len(bios), filepath.Join(netboot.DefaultIPXEDir, netboot.BootFileBIOS))
	}

	// 3. iPXE's DHCP: the boot file is now the script's URL.
	ipxe := dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))
	lease, err = pxeDHCPClient(t, cliNS, cliIf, w1).Request(ctx, pxeROM(iana.INTEL_X86PC, ipxe)...)
	if err != nil {
		t.Fatalf("w1's iPXE DISCOVER/REQUEST: %v", err)
	}
	scriptURL := "http://" + serverIP + ":8080/ipxe/" + macW1
	if lease.ACK.BootFileName != scriptURL {
		t.Fatalf("iPXE boot file %q, want %q", lease.ACK.BootFileName, scriptURL)
	}

	// 4. The script and the kernel over the boot port.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := labns.InNamespace(cliNS.Path(), func() (err error) {
			c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	get := func(url string) (int, []byte) {
		t.Helper()
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	blk, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	code, script := get(scriptURL)
	for _, want := range []string{"appliance.node=w1", "appliance.url=https://" + serverIP + ":8443", "appliance.ca_pin=" + agentapi.PinOf(ca), "console=ttyS0",
		"kernel http://" + serverIP + ":8080" + netboot.KernelPath} {
		if code != http.StatusOK || !strings.Contains(string(script), want) {
			t.Errorf("GET %s: %d, script lacks %q:\n%s", scriptURL, code, want, script)
		}
	}
	if strings.Contains(string(script), "token") {
		t.Errorf("the script carries a token:\n%s", script)
	}
	if code, b := get("http://" + serverIP + ":8080" + netboot.KernelPath); code != http.StatusOK || !bytes.Equal(b, kernel) {
		t.Errorf("GET %s: %d, %d bytes; want the kernel inside the bundle's node ISO (%d bytes)", netboot.KernelPath, code, len(b), len(kernel))
	}
	if code, b := get("http://" + serverIP + ":8080" + netboot.RootFSPath); code != http.StatusOK || string(b) != "node image root filesystem" {
		t.Errorf("GET %s: %d %q; want the root filesystem inside the bundle's node ISO", netboot.RootFSPath, code, b)
	}

	// 4b. The node image ISO (the bundle's netboot/node-amd64.iso, the default boot.nodeISO) over
	// HTTPS, verified with the appliance CA, through the firewall: the served image carries this
	// appliance's URL and CA pin in its embed area, read back by xorriso; the file is unchanged.
	hcTLS := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: hc.Transport.(*http.Transport).DialContext,
		TLSClientConfig: &tls.Config{RootCAs: certPool(t, caPEM)}}}
	resp, err := hcTLS.Get("https://" + serverIP + ":8443" + nodeiso.Path)
	if err != nil {
		t.Fatalf("GET %s: %v\n%s", nodeiso.Path, err, serve.Log())
	}
	servedISO, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", nodeiso.Path, resp.Status)
	}
	wantArea, _ := nodeiso.Area("appliance.url=https://" + serverIP + ":8443 appliance.ca_pin=" + agentapi.PinOf(ca))
	if got := isoFile(t, servedISO, "/boot/grub/appliance-args.cfg"); !bytes.Equal(got, wantArea) {
		t.Errorf("the served node ISO's appliance-args.cfg begins %q, want this appliance's URL and pin", got[:min(len(got), 200)])
	}
	if onDisk, _ := os.ReadFile(sl.nodeISO); !bytes.Equal(isoFile(t, onDisk, "/boot/grub/appliance-args.cfg"), sl.nodeISOArea) {
		t.Error("the node ISO on disk changed")
	}

	// 5. Nothing for a MAC outside the inventory, nor for a node that boots from its disk.
	short := []nclient4.ClientOpt{nclient4.WithTimeout(time.Second), nclient4.WithRetry(2)}
	for _, mac := range []string{"52:54:00:99:99:99", macCP1} {
		hw, _ := net.ParseMAC(mac)
		if o, err := pxeDHCPClient(t, cliNS, cliIf, hw, short...).DiscoverOffer(ctx, pxeROM(iana.INTEL_X86PC)...); err == nil {
			t.Errorf("%s got an offer: %s", mac, o.Summary())
		}
		if code, _ := get("http://" + serverIP + ":8080/ipxe/" + mac); code != http.StatusNotFound {
			t.Errorf("script of %s: %d, want 404", mac, code)
		}
	}

	if !strings.Contains(serve.Log(), "node=cp1") {
		t.Errorf("cp1's PXE request was not logged by name:\n%s", serve.Log())
	}

	// 5b. w1's contacts are in its events (what converge says of a machine that goes silent): its
	// DHCP answers and its script, each once however often it asked within a minute; none for cp1.
	store := nodestate.Open(statedir.Nodes(sl.state))
	evs, err := store.Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, ev := range evs {
		if ev.Contact == nodestate.ContactNetboot {
			seen[ev.Detail]++
		}
	}
	for _, want := range []string{"network boot: DHCP OFFER to w1 (undionly.kpxe)", "network boot: DHCP ACK to w1 (undionly.kpxe)", "network boot: iPXE script served: network boot of the node image"} {
		if seen[want] != 1 {
			t.Errorf("w1's events hold %q %d times, want once; its network-boot contacts: %v", want, seen[want], seen)
		}
	}
	if evs, _ := store.Events("cp1"); len(evs) > 0 {
		t.Errorf("cp1, which boots from its disk, got events: %+v", evs)
	}

	// 6. serve stops the service with itself, cleanly.
	if err := serve.stop(); err != nil {
		t.Errorf("serve after SIGTERM: %v\n%s", err, serve.Log())
	}
	if !strings.Contains(serve.Log(), "serve returned") {
		t.Errorf("serve did not return after SIGTERM:\n%s", serve.Log())
	}
}

// serveLab is the state directory the bootstrap phases would have left for `appliance serve`: CA,
// serving certificate, a token per node (of the configuration written by config), and a bundle
// whose node image ISO (netboot/node-amd64.iso) holds kernel, a small initramfs and root filesystem.
type serveLab struct {
	dir, state, bundleDir string
	password              string // a BMC password file
	caPEM                 []byte
	nodeISO               string // the bundle's netboot/node-amd64.iso
	nodeISOArea           []byte // its embed area as built
}

func newServeLab(t *testing.T, kernel []byte) *serveLab {
	t.Helper()
	dir := t.TempDir()
	sl := &serveLab{dir: dir, state: filepath.Join(dir, "state"), bundleDir: filepath.Join(dir, "bundle"), password: filepath.Join(dir, "bmc.password")}
	pkiDir := statedir.PKI(sl.state)
	// For the HTTPS front as the nodes reach it: the appliance's address on the control-plane
	// networks the tests use (config's NET.0.1).
	caPEM, leaf := pkitest.Issue(t, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.79.0.1"), netip.MustParseAddr("10.81.0.1"))
	sl.caPEM = caPEM
	certFile, keyFile := pkitest.WritePEM(t, dir, leaf)
	for src, dst := range map[string]string{certFile: "serving.crt", keyFile: "serving.key"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(pkiDir, dst), b)
	}
	writeFile(t, filepath.Join(pkiDir, pki.CACertFile), caPEM)
	meta, err := bundle.MarshalMetadata(bundle.Metadata{APIVersion: bundle.APIVersion, Kind: bundle.Kind, Name: "netboot-test",
		KubernetesVersion: "v1.37.2", Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(sl.bundleDir, bundle.MetadataFile), meta)
	sl.nodeISO = filepath.Join(sl.bundleDir, bundle.NetbootNodeISO)
	sl.nodeISOArea = makeNodeISO(t, sl.nodeISO, kernel)
	writeFile(t, sl.password, []byte("secret\n"))
	return sl
}

// makeNodeISO writes at path an ISO 9660 image (Debian's xorriso) in the node image's layout as far
// as pkg/nodeiso cares: /boot/grub/appliance-args.cfg, the embed area with no arguments (what
// iso/build-node-image.sh writes without --iso-args), beside /live/vmlinuz (kernel), initrd.img and rootfs.squashfs. It returns the area.
func makeNodeISO(t *testing.T, path string, kernel []byte) []byte {
	t.Helper()
	area, err := nodeiso.Area("")
	if err != nil {
		t.Fatal(err)
	}
	nodeisotest.Make(t, path, map[string][]byte{
		"boot/grub/appliance-args.cfg": area,
		"live/vmlinuz":                 kernel,
		"live/initrd.img":              []byte("node image initramfs"),
		"live/rootfs.squashfs":         []byte("node image root filesystem"),
	})
	return area
}

// isoFile reads the file at path inside the ISO image iso with xorriso.
func isoFile(t *testing.T, iso []byte, path string) []byte {
	t.Helper()
	img := filepath.Join(t.TempDir(), "image.iso")
	writeFile(t, img, iso)
	return nodeisotest.Extract(t, img, path)
}

// config writes bootstrap.yaml with the control-plane network NET.0.0/24 (VIP NET.0.100), the
// workload-plane network 10.80.0.0/24, the nodes and the boot section in tail (YAML from "- name:"
// of the first node on), and a node token for every node named in tail.
func (sl *serveLab) config(t *testing.T, net, tail string) string {
	t.Helper()
	for _, l := range strings.Split(tail, "\n") {
		if n, ok := strings.CutPrefix(l, "- name: "); ok {
			writeFile(t, filepath.Join(statedir.PKI(sl.state), "tokens", n), []byte("token-of-"+n+"\n"))
		}
	}
	path := filepath.Join(sl.dir, "bootstrap.yaml")
	writeFile(t, path, []byte(`apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: nbtest
kubernetes: {enabled: false}
networks:
  controlPlane: {cidrs: [`+net+`.0.0/24]}
  workloadPlane: {cidrs: [10.80.0.0/24]}
  services: 10.96.0.0/16
apiServer: {vip: `+net+`.0.100}
bundle:
  path: `+sl.bundleDir+`
  publicKeys: ["ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U="]
stateDir: `+sl.state+`
nodes:
`+tail))
	return path
}

// applyApplianceFirewall applies the appliance's own firewall for the configuration at cfgPath
// (plan.ApplianceFirewall, as the firewall phase does: policy drop) in ns with the nftables backend.
func applyApplianceFirewall(t *testing.T, ns *labns.NS, cfgPath string) {
	t.Helper()
	cfg, _, err := config.Load(cfgPath, config.ValidateOptions{CheckFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&firewall.NFTables{NetNSPath: ns.Path()}).Apply(t.Context(), plan.ApplianceFirewall(cfg)); err != nil {
		t.Fatalf("apply the appliance firewall in %s: %v", ns.Name, err)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// certPool is a pool holding only the certificates in caPEM.
func certPool(t *testing.T, caPEM []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(caPEM) {
		t.Fatal("no certificate in the CA PEM")
	}
	return p
}
