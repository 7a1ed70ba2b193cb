package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Paths of the cluster's DNS on a node (issue 13), each prefixed with Options.Root.
const (
	// CoreDNSManifest is a control plane's CoreDNS static pod manifest (kubeadm's manifest
	// directory); its Corefile and zone file are agentapi.CoreDNSCorefile and CoreDNSZoneFile.
	CoreDNSManifest = "/etc/kubernetes/manifests/appliance-dns.yaml"
	// CoreDNSPodName is the static pod's name (the mirror pod is appliance-dns-<node>).
	CoreDNSPodName = "appliance-dns"
	// ResolvConfPath is the stub resolver's configuration (resolv.conf(5)), used when
	// systemd-resolved does not run.
	ResolvConfPath = "/etc/resolv.conf"
	// ResolvedDropIn is the systemd-resolved drop-in (resolved.conf(5)) used when it runs.
	ResolvedDropIn = "/etc/systemd/resolved.conf.d/appliance-dns.conf"
	// ResolvedRunDir exists while systemd-resolved runs: it creates it, with its stub-resolv.conf,
	// under /run at start.
	ResolvedRunDir = "/run/systemd/resolve"
)

// The markers around the nameserver lines hostagent puts at the top of ResolvConfPath: what lies
// between them is replaced on every run, everything else is the file's own and kept.
const (
	resolvBegin = "# BEGIN appliance-dns: written by hostagent, the control planes' CoreDNS for the cluster's zone; the servers after it are this file's own, kept for every other name"
	resolvEnd   = "# END appliance-dns"
)

// maxNameservers is how many nameserver lines a glibc stub resolver reads (resolv.h MAXNS); the
// rest are ignored.
const maxNameservers = 3

// stepDNS does the node's part of the cluster's DNS (nc.DNS): on a control plane it writes CoreDNS's
// Corefile and zone file and its static pod, then waits until CoreDNS answers the zone's SOA
// authoritatively on the node's first listen address; on every node it points the resolver at the
// control planes (ResolverConfig). It runs after kubeadm: kubeadm init's preflight wants an empty
// manifest directory.
func (a *Agent) stepDNS(ctx context.Context) (string, error) {
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	d := nc.DNS
	if d == nil {
		return "unchanged: no DNS zone", nil
	}
	if d.Zone == "" || len(d.Nameservers) == 0 {
		return "", errors.New("node config dns: zone and nameservers are required")
	}
	var done []string
	changed := false
	if s := d.Server; s != nil {
		c, err := a.writeCoreDNS(s)
		if err != nil {
			return "", err
		}
		changed = c
		if err := a.waitCoreDNS(ctx, netip.AddrPortFrom(s.Listen[0], agentapi.DNSPort), d.Zone, coreDNSWait); err != nil {
			return "", &waitError{"waiting for the CoreDNS static pod to answer: " + err.Error()}
		}
		done = append(done, fmt.Sprintf("CoreDNS serving %s on %s port %d", d.Zone, joinAddrs(s.Listen), agentapi.DNSPort))
	}
	c, detail, err := a.writeResolver(ctx, d)
	if err != nil {
		return "", err
	}
	changed = changed || c
	done = append(done, detail)
	if !changed {
		return "unchanged: " + strings.Join(done, "; "), nil
	}
	return strings.Join(done, "; "), nil
}

// writeCoreDNS writes the Corefile and zone file (0644, in a 0755 directory: the CoreDNS image runs
// as a non-root user) and the static pod manifest (0600); it reports whether any changed.
func (a *Agent) writeCoreDNS(s *agentapi.DNSServer) (bool, error) {
	if s.Image == "" || s.Corefile == "" || s.ZoneFile == "" || len(s.Listen) == 0 || s.HealthPort == 0 {
		return false, errors.New("node config dns.server: image, corefile, zoneFile, listen and healthPort are required")
	}
	dir := a.path(agentapi.CoreDNSConfigDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return false, err
	}
	changed := false
	for _, f := range []struct {
		path, data string
		mode       os.FileMode
	}{
		{agentapi.CoreDNSCorefile, s.Corefile, 0o644},
		{agentapi.CoreDNSZoneFile, s.ZoneFile, 0o644},
		{CoreDNSManifest, string(CoreDNSPod(s)), 0o600},
	} {
		c, err := atomicfile.Write(a.path(f.path), []byte(f.data), f.mode)
		if err != nil {
			return false, fmt.Errorf("write %s: %w", a.path(f.path), err)
		}
		changed = changed || c
	}
	return changed, nil
}

// CoreDNSPod is the control plane's CoreDNS static pod manifest (JSON, which kubelet reads as the
// YAML it is): host network (port 53 of the node's addresses, before and without any CNI), priority
// class system-node-critical, CoreDNS reading agentapi.CoreDNSCorefile from the read-only config
// directory, the security context kubeadm gives the cluster DNS (every capability dropped but
// NET_BIND_SERVICE, read-only root), and a liveness probe on the health plugin's 127.0.0.1 port.
func CoreDNSPod(s *agentapi.DNSServer) []byte {
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": map[string]any{
			"name": CoreDNSPodName, "namespace": "kube-system",
			"labels": map[string]string{"app.kubernetes.io/name": CoreDNSPodName, "app.kubernetes.io/part-of": "airgap-appliance"},
		},
		"spec": map[string]any{
			"hostNetwork":       true,
			"dnsPolicy":         "Default",
			"priorityClassName": "system-node-critical",
			"containers": []any{map[string]any{
				"name":            "coredns",
				"image":           s.Image,
				"imagePullPolicy": "IfNotPresent",
				"args":            []string{"-conf", agentapi.CoreDNSCorefile},
				"volumeMounts":    []any{map[string]any{"name": "config", "mountPath": agentapi.CoreDNSConfigDir, "readOnly": true}},
				"livenessProbe": map[string]any{
					"httpGet":             map[string]any{"scheme": "HTTP", "host": "127.0.0.1", "port": s.HealthPort, "path": "/health"},
					"initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 5,
				},
				"securityContext": map[string]any{
					"allowPrivilegeEscalation": false,
					"readOnlyRootFilesystem":   true,
					"capabilities":             map[string]any{"add": []string{"NET_BIND_SERVICE"}, "drop": []string{"ALL"}},
				},
				"resources": map[string]any{"requests": map[string]string{"cpu": "10m", "memory": "32Mi"}},
			}},
			"volumes": []any{
				map[string]any{"name": "config", "hostPath": map[string]string{"path": agentapi.CoreDNSConfigDir, "type": "Directory"}},
			},
		},
	}
	b, _ := json.MarshalIndent(pod, "", "  ") // maps of strings and numbers: cannot fail
	return append(b, '\n')
}

// coreDNSWait bounds how long the dns step asks CoreDNS itself, every coreDNSPoll, before it reports
// a wait and the agent's loop tries the step again (2 s later): kubelet starts the static pod within
// about a second of its manifest, and a control plane's dns step, the last before it is ready, used
// to take 2.0 s in the e2e because the first check came before the pod and the next one only at the
// loop's retry.
const (
	coreDNSWait = 3 * time.Second
	coreDNSPoll = 100 * time.Millisecond
)

// waitCoreDNS asks addr for zone's SOA (coreDNSAnswers) every coreDNSPoll until it answers or limit
// has passed, and returns the last check's error then.
func (a *Agent) waitCoreDNS(ctx context.Context, addr netip.AddrPort, zone string, limit time.Duration) error {
	if a.nsPath() != "" {
		return a.coreDNSAnswers(ctx, addr, zone) // refused at once: nothing to wait for
	}
	deadline := time.Now().Add(limit)
	for {
		err := a.coreDNSAnswers(ctx, addr, zone)
		if err == nil || time.Now().Add(coreDNSPoll).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(coreDNSPoll):
		}
	}
}

// coreDNSAnswers asks addr for zone's SOA over UDP and accepts only an authoritative answer
// carrying it: the static pod runs and has loaded the zone.
func (a *Agent) coreDNSAnswers(ctx context.Context, addr netip.AddrPort, zone string) error {
	if a.nsPath() != "" {
		return errors.New("the dns step's CoreDNS check acts on the host itself, not in a network namespace")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(zone), dns.TypeSOA)
	m.RecursionDesired = false
	r, _, err := (&dns.Client{Net: "udp"}).ExchangeContext(ctx, m, addr.String())
	if err != nil {
		return err
	}
	if r.Rcode != dns.RcodeSuccess || !r.Authoritative || len(r.Answer) == 0 || r.Answer[0].Header().Rrtype != dns.TypeSOA {
		return fmt.Errorf("%s answered %s for %s SOA (authoritative %t, %d records): the zone is not loaded", addr, dns.RcodeToString[r.Rcode], zone, r.Authoritative, len(r.Answer))
	}
	return nil
}

// writeResolver points the node's resolver at d.Nameservers without losing the servers it had:
// with systemd-resolved running (ResolvedRunDir exists) a drop-in routes only d.Zone to them
// (Domains=~zone; resolved keeps every other server and route) and resolved is restarted; otherwise
// ResolvConfPath gets them first (ResolvConf). It returns whether it changed anything and a detail.
func (a *Agent) writeResolver(ctx context.Context, d *agentapi.DNSConfig) (bool, string, error) {
	if _, err := os.Stat(a.path(ResolvedRunDir)); err == nil {
		body := fmt.Sprintf("# Written by hostagent: names in the cluster's zone %s are asked of the control planes' CoreDNS.\n[Resolve]\nDNS=%s\nDomains=~%s\n",
			d.Zone, joinAddrs(d.Nameservers), d.Zone)
		c, err := atomicfile.Write(a.path(ResolvedDropIn), []byte(body), 0o644)
		if err != nil {
			return false, "", fmt.Errorf("write %s: %w", a.path(ResolvedDropIn), err)
		}
		detail := fmt.Sprintf("systemd-resolved asks %s for ~%s (%s)", joinAddrs(d.Nameservers), d.Zone, ResolvedDropIn)
		switch {
		case !c:
		case a.opts.Root != "":
			detail += "; restart systemd-resolved to apply"
		default:
			if err := restartUnit(ctx, "systemd-resolved.service"); err != nil {
				return false, "", err
			}
			detail += "; restarted systemd-resolved"
		}
		return c, detail, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, "", err
	}
	path := a.path(ResolvConfPath)
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, "", fmt.Errorf("read %s: %w", path, err)
	}
	data, r := ResolvConf(old, d.Nameservers)
	c, err := atomicfile.Write(path, data, 0o644)
	if err != nil {
		return false, "", fmt.Errorf("write %s: %w", path, err)
	}
	detail := fmt.Sprintf("%s: nameservers %s, then its own %s", ResolvConfPath, joinAddrs(r.Ours), joinAddrs(r.Kept))
	if len(r.Kept) == 0 {
		detail = fmt.Sprintf("%s: nameservers %s (it had no others)", ResolvConfPath, joinAddrs(r.Ours))
	}
	if len(r.Ours)+len(r.Kept) > maxNameservers {
		detail += fmt.Sprintf(" (a glibc resolver reads the first %d)", maxNameservers)
	}
	return c, detail, nil
}

// ResolvResult says what ResolvConf put first and what it kept.
type ResolvResult struct {
	// Ours are the control planes' addresses written first; Kept the file's own nameservers after them.
	Ours, Kept []netip.Addr
}

// ResolvConf returns the resolv.conf(5) old becomes: a block of nameserver lines between two
// marker comments at the top, then every line of old but the block a previous run wrote (nothing of
// the file's own is dropped, so removing the block restores it). The block holds as many of nameservers (in order)
// as leave room for at least one of old's own within glibc's first three (MAXNS), at least one:
// the control planes answer REFUSED outside the cluster's zone, so the resolver moves on to those.
// search, options and comments of old are kept as they are. Running it on its own output with the
// same nameservers gives the same bytes.
func ResolvConf(old []byte, nameservers []netip.Addr) ([]byte, ResolvResult) {
	var rest []string
	var kept []netip.Addr
	inBlock := false
	var lines []string
	if len(old) > 0 {
		lines = strings.Split(strings.TrimSuffix(string(old), "\n"), "\n")
	}
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "# BEGIN appliance-dns"):
			inBlock = true
			continue
		case inBlock && line == resolvEnd:
			inBlock = false
			continue
		case inBlock:
			continue
		}
		rest = append(rest, line)
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				kept = append(kept, a)
			}
		}
	}
	n := min(len(nameservers), max(1, maxNameservers-len(kept)))
	ours := slices.Clone(nameservers[:n])
	var b strings.Builder
	b.WriteString(resolvBegin + "\n")
	for _, a := range ours {
		b.WriteString("nameserver " + a.String() + "\n")
	}
	b.WriteString(resolvEnd + "\n")
	for _, line := range rest {
		b.WriteString(line + "\n")
	}
	return []byte(b.String()), ResolvResult{Ours: ours, Kept: kept}
}

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, " ")
}
