package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

// nodeLab is a lab whose node namespaces are real hosts (test/lab/nodes.sh): cp1..cp3 are
// systemd-nspawn Debian hosts reached over SSH, w1 and w2 QEMU VMs behind ipmi_sim BMCs.
type nodeLab struct {
	*lab
	labDir string
	env    []string
}

func (n *nodeLab) script(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot, "test", "lab", name), args...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func newNodeLab(t *testing.T, prefix string) *nodeLab {
	t.Helper()
	l := newLab(t, prefix)
	l.skip = nil
	n := &nodeLab{lab: l, labDir: filepath.Join(l.dir, "lab")}
	n.env = append(os.Environ(), "LAB_PREFIX="+prefix, "LAB_DIR="+n.labDir, "LAB_WORKERS=2",
		"LAB_HOSTAGENT="+filepath.Join(binDir, "hostagent"),
		"LAB_RENDERED_DIR="+filepath.Join(l.state, "rendered"))
	// Two workers: w2's BMC exists but the configuration gives it a wrong password.
	n.script(t, "lab.sh", "up", "3", "2")
	n.script(t, "creds.sh")
	t.Cleanup(func() {
		if t.Failed() {
			for _, node := range []string{"w1", "cp1"} {
				b, _ := os.ReadFile(filepath.Join(n.labDir, "nodes", node, "console.log"))
				if len(b) > 6000 {
					b = b[len(b)-6000:]
				}
				t.Logf("console of %s (tail):\n%s", node, b)
			}
			if b, err := os.ReadFile(filepath.Join(l.state, "serve", "serve.log")); err == nil {
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("appliance serve log (tail):\n%s", b)
			}
		}
		cmd := exec.Command(filepath.Join(repoRoot, "test", "lab", "nodes.sh"), "down")
		cmd.Env = n.env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("nodes.sh down: %v\n%s", err, out)
		}
	})
	n.script(t, "nodes.sh", "up")
	mustWrite(t, filepath.Join(l.dir, "wrong-password"), "not-the-bmc-password\n")
	n.writeConfig(t, true)
	return n
}

func (n *nodeLab) writeConfig(t *testing.T, withBadNode bool) {
	var buf bytes.Buffer
	if err := nodeConfigTemplate.Execute(&buf, map[string]any{
		"Bundle": bundlePath, "BundleKey": bundleKey, "State": n.state, "Lab": n.labDir, "Name": n.prefix, "Dir": n.dir, "Bad": withBadNode, "K8s": false,
	}); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, n.config, buf.String())
}

var nodeConfigTemplate = template.Must(template.New("cfg").Parse(`apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: {{.Name}}
{{- if .K8s}}
# The cluster's DNS zone <clusterName>.lab.test, served by CoreDNS on the control planes (e2e_dns_test.go).
baseDomain: lab.test
kubernetes:
  # systemd-nspawn nodes: kubeadm cannot read the host kernel's config (SystemVerification).
  ignorePreflightErrors: [SystemVerification]
{{- else}}
# Hosts only: the BMC-booted VM worker runs hostagent from an initramfs and cannot run kubelet; the
# Kubernetes cluster, the VIP hand-off to a real kube-apiserver and its failover are the e2e's
# (e2e_test.go, make e2e).
kubernetes: {enabled: false}
{{- end}}
{{- if not .K8s}}
# w1 has a mac, so network boot would default to proxy DHCP; the lab boots the VM's kit directly.
boot: {dhcp: "off"}
{{- end}}
networks:
  controlPlane: {cidrs: [10.100.0.0/24]}
{{- if .WL2}}
  # The two-subnet lab (lab.sh LAB_WL_SUBNETS=2): the workers' workload-plane subnet is behind a router.
  workloadPlane: {cidrs: [10.200.0.0/24, 10.201.0.0/24]{{if .CNI}}, mtu: 1500{{end}}}
{{- else}}
  workloadPlane: {cidrs: [10.200.0.0/24]{{if .CNI}}, mtu: 1500{{end}}}
{{- end}}
  services: 10.96.0.0/16
{{- if .CNI}}
  cni: {{.CNI}}
{{- end}}
apiServer:
  vip: 10.100.0.100
{{- if .K8s}}
# The ingress VIP (e2e_ingress_test.go): *.apps.<clusterName>.lab.test, balanced to the routers on the workers.
ingress: {vip: 10.100.0.101}
{{- end}}
bundle:
  path: {{.Bundle}}
  publicKeyFiles: [{{.BundleKey}}]
stateDir: {{.State}}
nodes:
- name: cp1
  roles: [control-plane]
  addresses: [10.100.0.11, 10.200.0.11]
  power: {kind: ssh, privateKeyFile: {{.Lab}}/ssh/id_ed25519, knownHostsFile: {{.Lab}}/ssh/known_hosts}
- name: cp2
  roles: [control-plane]
  addresses: [10.100.0.12, 10.200.0.12]
  power: {kind: ssh, privateKeyFile: {{.Lab}}/ssh/id_ed25519, knownHostsFile: {{.Lab}}/ssh/known_hosts}
- name: cp3
  roles: [control-plane]
  addresses: [10.100.0.13, 10.200.0.13]
  power: {kind: ssh, privateKeyFile: {{.Lab}}/ssh/id_ed25519, knownHostsFile: {{.Lab}}/ssh/known_hosts}
- name: w1
  roles: [worker]
  addresses: [10.100.0.21, {{if .WL2}}10.201.0.21{{else}}10.200.0.21{{end}}]
{{- if .K8s}}
  power: {kind: ssh, privateKeyFile: {{.Lab}}/ssh/id_ed25519, knownHostsFile: {{.Lab}}/ssh/known_hosts}
{{- else}}
  # The VM's boot NIC and SMBIOS UUID (test/lab/vm/chassis.sh): what w1 proves when it enrols.
  mac: 52:54:00:01:64:00
  systemUUID: 52540001-6400-4000-8000-525400016400
  power: {kind: ipmi, address: 10.100.0.121, username: admin, passwordFile: {{.Lab}}/bmc/w1.password}
{{- end}}
{{- if .Bad}}
- name: w2
  roles: [worker]
  addresses: [10.100.0.22, 10.200.0.22]
  mac: 52:54:00:01:64:01
  power: {kind: ipmi, address: 10.100.0.122, username: admin, passwordFile: {{.Dir}}/wrong-password}
{{- end}}
`))

// statuses reads `appliance status -o json`.
func (n *nodeLab) statuses(t *testing.T) map[string]agentapi.NodeStatus {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "appliance"), "status", "--config", n.config, "-o", "json").Output()
	if err != nil {
		t.Fatalf("appliance status: %v", err)
	}
	var list []agentapi.NodeStatus
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("appliance status -o json: %v\n%s", err, out)
	}
	m := map[string]agentapi.NodeStatus{}
	for _, s := range list {
		m[s.Node] = s
	}
	return m
}

// vipHolders lists the lab hosts whose namespace carries the VIP.
func (n *nodeLab) vipHolders() []string {
	var out []string
	for _, h := range []string{"boot", "cp1", "cp2", "cp3"} {
		o, _ := n.run(h, "ip", "-o", "addr", "show")
		if strings.Contains(o, " 10.100.0.100/") {
			out = append(out, h)
		}
	}
	return out
}

// singleHolder samples the VIP every 50 ms for d and fails on two holders at once; it returns
// the last holder.
func (n *nodeLab) singleHolder(t *testing.T, d time.Duration) string {
	t.Helper()
	var last string
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		h := n.vipHolders()
		if len(h) > 1 {
			t.Fatalf("two VIP holders at once: %v", h)
		}
		if len(h) == 1 {
			last = h[0]
		}
	}
	return last
}

// TestNodesConverge powers every node on (SSH for the pre-installed hosts, IPMI for the VM), waits
// for every hostagent to report ready (hosts only: kubernetes.enabled false), checks the VIP stays on
// the bootstrap host while no API answers, a node with wrong BMC
// credentials failing alone, and that hostagent restarts, appliance restarts and node reboots all
// converge again without manual steps.
func TestNodesConverge(t *testing.T) {
	labns.NotInShort(t, "boots a TCG VM behind ipmi_sim beside three SSH hosts")
	n := newNodeLab(t, "in")
	ctx := context.Background()

	start := time.Now()
	r := n.bootstrap(ctx, "", 0, "--converge-timeout", "150s")
	t.Logf("racked → ready (4 nodes, plus 1 with a wrong BMC password) in %.1fs", time.Since(start).Seconds())
	if r.err == nil {
		t.Fatalf("bootstrap succeeded although w2 has a wrong BMC password")
	}
	conv, _ := r.phase("converge")
	if !strings.Contains(conv.Error, "w2") || strings.Contains(conv.Error, "cp1") {
		t.Fatalf("converge should fail for w2 alone: %+v\nstderr:\n%s", conv, r.stderr)
	}
	st := n.statuses(t)
	for _, node := range []string{"cp1", "cp2", "cp3", "w1"} {
		if st[node].State != agentapi.StateReady {
			t.Errorf("%s: %s (%s), want ready", node, st[node].State, st[node].Reason)
		}
	}
	if s := st["w2"]; s.State != agentapi.StateFailed || !strings.Contains(strings.ToLower(s.Reason), "auth") {
		t.Errorf("w2: %s %q, want failed with an authentication reason", s.State, s.Reason)
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("w1 booted with public data only, enrolled once, and a second machine claiming w1 is refused", func(t *testing.T) {
		testW1Enrolment(t, n)
	})

	t.Run("hostagent runs under systemd, told it ready (sd_notify), and applied the node firewall", func(t *testing.T) {
		if out := strings.TrimSpace(n.script(t, "nodes.sh", "ssh", "cp1", "systemctl is-active hostagent")); out != "active" {
			t.Errorf("hostagent.service on cp1: %q, want active (Type=notify: READY=1 was sent)", out)
		}
		table := n.script(t, "nodes.sh", "ssh", "cp1", "nft list table inet appliance")
		for _, want := range []string{"2379-2380", "6443", "10250"} {
			if !strings.Contains(table, want) {
				t.Errorf("cp1's firewall lacks %q:\n%s", want, table)
			}
		}
		// VRRP (IP protocol 112) from the peers: nft prints the protocol's name when the node has
		// /etc/protocols (netbase, in the node rootfs since v3), its number otherwise.
		if !strings.Contains(table, "saddr @vrrp_peers_v4 meta l4proto vrrp accept") && !strings.Contains(table, "saddr @vrrp_peers_v4 meta l4proto 112 accept") {
			t.Errorf("cp1's firewall lacks the VRRP rule (IP protocol 112 from @vrrp_peers_v4):\n%s", table)
		}
	})

	t.Run("appliance power status reads every BMC and host", func(t *testing.T) {
		cmd := exec.Command("ip", "netns", "exec", n.ns("boot"), filepath.Join(binDir, "appliance"), "power", "status", "w1", "cp1", "--config", n.config, "-o", "json")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("appliance power status: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `"w1"`) || !strings.Contains(string(out), `"on"`) {
			t.Errorf("power status: %s", out)
		}
	})

	t.Run("without Kubernetes the VIP stays with the bootstrap host", func(t *testing.T) {
		// Nothing answers on a control plane's API port, so their track scripts keep them below the
		// appliance's priority and no hand-off is recorded.
		if got := n.singleHolder(t, 2*time.Second); got != "boot" {
			t.Errorf("VIP holder %q, want the bootstrap host", got)
		}
		if _, err := os.Stat(filepath.Join(n.state, "keepalived", "handed-off")); err == nil {
			t.Errorf("a hand-off was recorded although no control plane runs an API")
		}
	})

	// From here on the inventory is the healthy nodes only.
	n.writeConfig(t, false)

	t.Run("a second bootstrap changes nothing", func(t *testing.T) {
		n.mustBootstrap(ctx) // applies the inventory change (w2 removed)
		r := n.mustBootstrap(ctx)
		for _, name := range n.phases() {
			if ev, _ := r.phase(name); ev.Changed {
				t.Errorf("phase %s changed something: %s", name, ev.Detail)
			}
		}
	})

	t.Run("a hostagent killed on a node comes back and reports", func(t *testing.T) {
		before := n.statuses(t)["cp2"].Updated
		n.script(t, "nodes.sh", "ssh", "cp2", "kill -9 $(systemctl show -p MainPID --value hostagent)")
		if err := waitFor(60*time.Second, func() error {
			s := n.statuses(t)["cp2"]
			if s.State == agentapi.StateReady && s.Updated.After(before) {
				return nil
			}
			return fmt.Errorf("cp2: %s since %v", s.State, s.Updated)
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a rebooted node converges with a new boot", func(t *testing.T) {
		before := n.statuses(t)["cp3"].BootID
		n.script(t, "nodes.sh", "reboot", "cp3")
		if err := waitFor(90*time.Second, func() error {
			s := n.statuses(t)["cp3"]
			if s.State == agentapi.StateReady && s.BootID != before {
				return nil
			}
			return fmt.Errorf("cp3: %s boot %s", s.State, s.BootID)
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a newer appliance upgrades every hostagent: over SSH on the hosts, pulled by the BMC-booted w1 without a reboot", func(t *testing.T) {
		nodes := []string{"cp1", "cp2", "cp3", "w1"}
		before := n.statuses(t)
		oldSum := fileSum(t, filepath.Join(binDir, "hostagent"))
		for _, node := range nodes {
			if s := before[node]; s.State != agentapi.StateReady || s.AgentSHA256 != oldSum {
				t.Fatalf("before the upgrade %s is %s with hostagent %.12s, want ready with %.12s", node, s.State, s.AgentSHA256, oldSum)
			}
		}
		restore := swapBinaries(t, buildUpgrade(t))
		defer restore()
		newSum := fileSum(t, filepath.Join(binDir, "hostagent"))
		start := time.Now()
		r := n.mustBootstrap(ctx)
		up, _ := r.phase("upgrade")
		t.Logf("upgrade phase (%.1fs of a %.1fs bootstrap): %s", up.Duration, time.Since(start).Seconds(), up.Detail)
		if !up.Changed || !strings.Contains(up.Detail, "on 4 nodes") || !strings.Contains(up.Detail, "w1 ") {
			t.Errorf("upgrade phase: %+v, want the 4 nodes upgraded, w1 among them", up)
		}
		after := n.statuses(t)
		for _, node := range nodes {
			if s := after[node]; s.State != agentapi.StateReady || s.AgentSHA256 != newSum || !strings.HasPrefix(s.AgentVersion, upgradeVersion) {
				t.Errorf("after the upgrade %s is %s with hostagent %s %.12s, want ready with %s %.12s", node, s.State, s.AgentVersion, s.AgentSHA256, upgradeVersion, newSum)
			}
		}
		// w1 pulled it: its own (old) agent reported the upgrade starting, in the same boot (no
		// power cycle, no reinstall), and the appliance's record of the pull is gone.
		if after["w1"].BootID != before["w1"].BootID {
			t.Errorf("w1 booted again (%s → %s): the upgrade must not power-cycle it", before["w1"].BootID, after["w1"].BootID)
		}
		evs, err := nodestate.Open(statedir.Nodes(n.state)).Events("w1")
		if err != nil {
			t.Fatal(err)
		}
		pulled := false
		for _, ev := range evs {
			if ev.Step == agentapi.StepConfig && ev.Status == agentapi.StatusRunning && strings.HasPrefix(ev.Detail, "upgrading hostagent from ") && ev.Time.After(start) {
				pulled = true
				t.Logf("w1 reported: %s", ev.Detail)
			}
		}
		if !pulled {
			t.Error("w1's agent never reported pulling the upgrade")
		}
		if _, err := os.Stat(statedir.AgentUpgrade(n.state)); !os.IsNotExist(err) {
			t.Errorf("the pull record %s is still there (%v)", statedir.AgentUpgrade(n.state), err)
		}
		// A rerun finds every node on the served build.
		r = n.mustBootstrap(ctx)
		if up, _ := r.phase("upgrade"); up.Changed {
			t.Errorf("a rerun after the upgrade: upgrade phase %+v, want nothing to do", up)
		}
	})

	t.Run("on a systemd host the appliance runs as appliance.service", func(t *testing.T) {
		// The appliance itself on cp2 (a Debian host booted with systemd): binary, bundle and a
		// one-node configuration copied into its root; the serve phase must install and start the unit.
		root := filepath.Join(n.labDir, "nodes", "cp2", "root")
		copyFile(t, filepath.Join(binDir, "appliance"), filepath.Join(root, "usr/local/bin/appliance"))
		if err := os.Chmod(filepath.Join(root, "usr/local/bin/appliance"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "srv/bundle"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", bundlePath+"/.", filepath.Join(root, "srv/bundle")).CombinedOutput(); err != nil {
			t.Fatalf("copy bundle: %v %s", err, out)
		}
		pub, _ := os.ReadFile(filepath.Join(n.labDir, "ssh", "host_ed25519.pub"))
		bundlePub, err := os.ReadFile(bundleKey)
		if err != nil {
			t.Fatalf("the fixture bundle's public key: %v", err)
		}
		mustWriteMode(t, filepath.Join(root, "root/sd.yaml"), `apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: sd
kubernetes: {enabled: false}
networks: {controlPlane: {cidrs: [10.100.0.0/24]}, services: 10.96.0.0/16}
apiServer: {keepalived: {enabled: false}}
bundle: {path: /srv/bundle, publicKeys: ["`+strings.TrimSpace(string(bundlePub))+`"]}
stateDir: /var/lib/appliance
nodes:
- name: n1
  roles: [control-plane]
  addresses: [10.100.0.50]
  power: {kind: ssh, privateKeyFile: /etc/ssh/ssh_host_ed25519_key, hostKey: "`+strings.Join(strings.Fields(string(pub))[:2], " ")+`"}
`, 0o600)
		run := "appliance bootstrap --config /root/sd.yaml --skip-phases firewall,power,converge --hostagent-binary /usr/local/bin/appliance 2>&1"
		out := n.script(t, "nodes.sh", "ssh", "cp2", run)
		if !strings.Contains(out, "serve: started appliance.service") {
			t.Fatalf("serve phase did not use systemd:\n%s", out)
		}
		if st := strings.TrimSpace(n.script(t, "nodes.sh", "ssh", "cp2", "systemctl is-active appliance")); st != "active" {
			t.Fatalf("appliance.service: %s", st)
		}
		if out := n.script(t, "nodes.sh", "ssh", "cp2", run); !strings.Contains(out, "serve: already serving") || !strings.Contains(out, "nothing changed") {
			t.Fatalf("second run on the systemd host:\n%s", out)
		}
		n.script(t, "nodes.sh", "ssh", "cp2", "appliance stop --config /root/sd.yaml")
		if st := strings.TrimSpace(n.script(t, "nodes.sh", "ssh", "cp2", "systemctl is-active appliance || true")); st == "active" {
			t.Fatalf("appliance.service still active after appliance stop")
		}
	})

	t.Run("a restarted appliance converges again", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(binDir, "appliance"), "stop", "--config", n.config).CombinedOutput()
		if err != nil {
			t.Fatalf("appliance stop: %v %s", err, out)
		}
		n.mustBootstrap(ctx)
		for node, s := range n.statuses(t) {
			if s.State != agentapi.StateReady {
				t.Errorf("%s: %s after the appliance restarted", node, s.State)
			}
		}
		if err := waitFor(15*time.Second, func() error {
			if h := n.vipHolders(); len(h) != 1 || h[0] != "boot" {
				return fmt.Errorf("VIP holders %v", h)
			}
			return nil
		}); err != nil {
			t.Errorf("after the appliance restart: %v, want the bootstrap host alone", err)
		}
	})
}

// testW1Enrolment checks issue 12 item 5 on the BMC-booted VM w1: neither its rendered kernel command
// line nor the one it booted with (its console) holds its token; it enrolled (the console's
// `hostagent enroll` line, the appliance's record of the key, w1's events); and a second enrolment
// for w1 (its MAC and UUID) signed by another key, sent from the bootstrap namespace over the pinned
// HTTPS, is refused with a 4xx that is recorded in w1's events.
func testW1Enrolment(t *testing.T, n *nodeLab) {
	tok, err := os.ReadFile(filepath.Join(statedir.PKI(n.state), "tokens", "w1"))
	if err != nil || len(bytes.TrimSpace(tok)) == 0 {
		t.Fatalf("w1's token: %v", err)
	}
	token := string(bytes.TrimSpace(tok))
	cmdline, err := os.ReadFile(filepath.Join(statedir.RenderedNode(n.state, "w1"), statedir.KernelCmdlineFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cmdline), token) || strings.Contains(string(cmdline), "token") || strings.Contains(string(cmdline), "ignition.config.url") {
		t.Errorf("w1's rendered kernel command line holds a secret: %s", cmdline)
	}
	console, err := os.ReadFile(filepath.Join(n.labDir, "nodes", "w1", "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	var booted, enrolled string
	for _, line := range strings.Split(string(console), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "=== power on ") {
			booted = line
		}
		if strings.HasPrefix(line, "enrolled as node ") {
			enrolled = line
		}
		if strings.Contains(line, "LAB-INIT: enroll") || strings.Contains(line, "LAB-INIT: enrolled") {
			t.Logf("w1 console: %s", line)
		}
	}
	if booted == "" || !strings.Contains(booted, "appliance.ca_pin=") || strings.Contains(booted, token) || strings.Contains(booted, "token") {
		t.Errorf("w1's kernel command line (console) %q: want the CA pin and no token", booted)
	}
	if !strings.HasPrefix(enrolled, "enrolled as node w1 (key sha256:") {
		t.Fatalf("w1's console shows no enrolment as w1: %q", enrolled)
	}
	t.Logf("w1: %s", enrolled)
	recPath := filepath.Join(n.state, "enrolment", "w1.json")
	st, err := os.Stat(recPath)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("enrolment record %s: %v %v, want mode 0600", recPath, st, err)
	}
	var rec struct {
		KeyFingerprint string    `json:"keyFingerprint"`
		PoweredOn      time.Time `json:"poweredOn"`
		Enrolled       time.Time `json:"enrolled"`
		MACs           []string  `json:"macs"`
		SystemUUID     string    `json:"systemUUID"`
	}
	b, _ := os.ReadFile(recPath)
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(enrolled, rec.KeyFingerprint) || rec.SystemUUID != "52540001-6400-4000-8000-525400016400" || !slices.Contains(rec.MACs, "52:54:00:01:64:00") {
		t.Errorf("record %+v, want the key w1 printed (%s), its UUID and MAC", rec, enrolled)
	}
	t.Logf("w1 enrolled %.1fs after the appliance powered it on", rec.Enrolled.Sub(rec.PoweredOn).Seconds())

	// A second machine claims w1: its MAC and UUID, another key, a valid signature.
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	cfgData, err := os.ReadFile(filepath.Join(statedir.RenderedNode(n.state, "w1"), statedir.AgentConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := agentapi.Parse(cfgData)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	req := agentapi.EnrollRequest{MACs: []string{"52:54:00:01:64:00"}, SystemUUID: rec.SystemUUID, Timestamp: time.Now().UTC(),
		Nonce: base64.RawURLEncoding.EncodeToString(nonce), CAPin: cfg.CAPin}
	req.Sign(key)
	body, _ := json.Marshal(req)
	bodyFile := filepath.Join(n.dir, "enroll-impostor.json")
	mustWrite(t, bodyFile, string(body))
	out, err := n.run("boot", "curl", "-sS", "--cacert", filepath.Join(statedir.PKI(n.state), "ca.crt"), "-H", "Content-Type: application/json",
		"--data-binary", "@"+bodyFile, "-w", "\nHTTP %{http_code}", cfg.ApplianceURL+agentapi.EnrollPathV1)
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	t.Logf("second enrolment for w1: %s", out)
	if !strings.Contains(out, "HTTP 409") || !strings.Contains(out, "node w1 is already enrolled") || strings.Contains(out, token) {
		t.Errorf("a second enrolment for w1 with another key: %s, want 409 already enrolled and no token", out)
	}
	evs, err := nodestate.Open(statedir.Nodes(n.state)).Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	var sawEnrolled, sawRefused bool
	for _, ev := range evs {
		sawEnrolled = sawEnrolled || strings.HasPrefix(ev.Detail, "enrolled with key "+rec.KeyFingerprint)
		sawRefused = sawRefused || strings.HasPrefix(ev.Detail, "enrolment refused")
	}
	if !sawEnrolled || !sawRefused {
		t.Errorf("w1's events: enrolled %v, refusal %v; want both recorded", sawEnrolled, sawRefused)
	}
}
