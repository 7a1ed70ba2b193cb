package hostagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestAgentKeepalivedPreflightRefuses (issue 14): a control plane whose VIP is already answered for
// by a host that is not one of its VRRP peers (a real kernel holding the address in a linked
// namespace) does not start keepalived: the keepalived step fails, and the node report's detail names
// the VIP, the answering host's MAC and the field to change.
func TestAgentKeepalivedPreflightRefuses(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	labns.RequireTool(t, "nft")
	ns := labns.New(t, "hagt")
	foreign := labns.New(t, "hfor")
	ifc, fifc := labns.Link(t, ns, "10.79.0.2/24", foreign, "10.79.0.50/24")
	nc := cpNodeConfig("10.79.0", 43)
	vip := nc.APIServerVIP
	foreign.MustRun("ip", "addr", "add", vip.String()+"/24", "dev", fifc)
	foreignMAC := strings.TrimSpace(foreign.MustRun("cat", "/sys/class/net/"+fifc+"/address"))

	app := newAppliance(t, nc)
	root := startControlPlaneAgent(t, app, ns, []string{"/bin/true"})

	var detail string
	waitFor(t, "the keepalived step to fail", func() bool {
		st, _ := app.store.Get("cp1")
		r := st.Steps[agentapi.StepKeepalived]
		detail = r.Detail
		return r.Status == agentapi.StatusFailed
	})
	t.Logf("keepalived step detail: %s", detail)
	for _, want := range []string{vip.String(), foreignMAC, vipcheck.FieldVIP} {
		if !strings.Contains(detail, want) {
			t.Errorf("the keepalived step's detail does not name %q: %s", want, detail)
		}
	}
	if _, err := os.Stat(filepath.Join(root, KeepalivedDir, "keepalived.pid")); err == nil {
		t.Errorf("keepalived was started although the pre-flight refused the claim")
	}
	if held, err := keepalived.Holds(ns.Path(), ifc, vip); err != nil || held {
		t.Errorf("the node claimed the VIP anyway (held %v, err %v)", held, err)
	}
}
