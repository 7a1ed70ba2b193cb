package applianced

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestIngressVIPPreflight: the bootstrap host checks the ingress VIP (issue 13) on its segment before
// the control planes claim it, though it never speaks for it (plan.ApplianceIngressCheck, passed to
// PreflightAhead as a check-only instance). Real namespaces on a bridge (the two-clusters lab's): a
// free ingress VIP passes; a host already holding it is refused with ingress.vip and its MAC named,
// not apiServer.vip; the API VIP's instance checked beside it still names apiServer.vip.
func TestIngressVIPPreflight(t *testing.T) {
	labns.RequireRoot(t)
	l := &tcLab{t: t, fabric: labns.New(t, "tcfab")}
	l.fabric.MustRun("ip", "link", "add", "br0", "type", "bridge")
	l.fabric.MustRun("ip", "link", "set", "br0", "up")
	self := l.host("10.82.0.10")
	l.host("10.82.0.11") // a control plane (peer), answering ARP only
	api := keepalived.Instance{Name: agentapi.VRRPInstanceName, Interface: tcIface, SourceIP: netip.MustParseAddr("10.82.0.10"),
		Peers: addrs("10.82.0.11"), VIP: netip.MustParsePrefix("10.82.0.100/24"), VirtualRouterID: 41}
	ingress := api
	ingress.Name, ingress.VIP, ingress.VirtualRouterID = agentapi.VRRPIngressInstanceName, netip.MustParsePrefix("10.82.0.101/24"), 42
	kc := keepalived.Config{RouterID: "appliance", Instances: []keepalived.Instance{api, ingress}}
	log := slog.New(slog.NewTextHandler(logWriter{t: t, name: "preflight"}, nil))

	if err := preflight(context.Background(), kc, self.Path(), log); err != nil {
		t.Fatalf("pre-flight on a segment where both VIPs are free: %v", err)
	}

	foreign := l.host("10.82.0.30")
	foreign.MustRun("ip", "addr", "add", "10.82.0.101/24", "dev", tcIface)
	err := preflight(context.Background(), kc, self.Path(), log)
	if err == nil {
		t.Fatal("pre-flight passed with another host holding the ingress VIP 10.82.0.101")
	}
	msg := err.Error()
	for _, want := range []string{vipcheck.FieldIngressVIP, "ingress VIP 10.82.0.101", foreignMAC(t, foreign)} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, vipcheck.FieldVIP+" ") {
		t.Errorf("refusal %q names the API VIP's field for the ingress VIP's conflict", msg)
	}

	// The same host on the API VIP instead: the API VIP's field.
	foreign.MustRun("ip", "addr", "del", "10.82.0.101/24", "dev", tcIface)
	foreign.MustRun("ip", "addr", "add", "10.82.0.100/24", "dev", tcIface)
	if err := preflight(context.Background(), kc, self.Path(), log); err == nil || !strings.Contains(err.Error(), vipcheck.FieldVIP) {
		t.Errorf("pre-flight with another host holding the API VIP: %v, want a refusal naming %s", err, vipcheck.FieldVIP)
	}
}

// foreignMAC is eth0's MAC in ns, as ip(8) prints it.
func foreignMAC(t *testing.T, ns *labns.NS) string {
	t.Helper()
	out := ns.MustRun("cat", "/sys/class/net/"+tcIface+"/address")
	return strings.TrimSpace(out)
}
