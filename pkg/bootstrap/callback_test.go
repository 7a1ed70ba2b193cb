package bootstrap

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestCallbackOverdue: a machine powered on through its BMC that stops calling back fails with a
// reason naming its last contact and what to check; within the window after its last step of
// progress, or once its hostagent reported, it is left alone. The records are written through the
// real nodestate store the power phase, the enrolment and the network boot write (clock replaced).
func TestCallbackOverdue(t *testing.T) {
	const window = 10 * time.Minute
	t0 := time.Date(2026, 11, 28, 5, 0, 0, 0, time.UTC)
	pxe := config.Node{Name: "n1", MAC: "52:54:00:00:00:21", Power: config.Power{Kind: config.PowerIPMI, BootDevice: config.BootPXE}}
	vm := config.Node{Name: "n2", MAC: "52:54:00:00:00:22", Power: config.Power{Kind: config.PowerRedfish, BootDevice: config.BootCDROM, VirtualMediaImage: "https://10.100.0.2:8443/boot/node.iso"}}
	disk := config.Node{Name: "n3", MAC: "52:54:00:00:00:23", Power: config.Power{Kind: config.PowerIPMI, BootDevice: config.BootDisk}}
	type step struct {
		after   time.Duration
		contact string // "" with report false: a Set of the state in detail
		detail  string
		report  bool
	}
	powered := []step{{0, "", agentapi.StatePowering, false}, {2 * time.Second, "", agentapi.StateBooting, false}}
	cases := []struct {
		name  string
		node  config.Node
		steps []step
		at    time.Duration
		want  []string // substrings of the reason; nil: not overdue
	}{
		{"pxe, silent, within the window", pxe, powered, window - time.Second, nil},
		{"pxe, silent", pxe, powered, window, []string{"no call back for 10m0s", "no DHCP request from its MAC 52:54:00:00:00:21", "boot order", "appliance power off n1", "rerun `appliance bootstrap`"}},
		{"pxe, network boot reached, never enrolled", pxe, append(powered[:2:2], step{90 * time.Second, nodestate.ContactNetboot, "network boot: iPXE script served: network boot of the node image", false}),
			window, []string{`got as far as "network boot: iPXE script served: network boot of the node image"`, "never enrolled", "root filesystem"}},
		{"pxe, enrolment refused", pxe, append(powered[:2:2], step{90 * time.Second, nodestate.ContactNetboot, "network boot: DHCP OFFER", false},
			step{3 * time.Minute, nodestate.ContactEnrolRefused, "enrolment refused (key sha256:ab, from 10.100.0.21): timestamp is 2h from the appliance's clock", false}),
			window, []string{"its last enrolment was refused", "timestamp is 2h"}},
		{"pxe, enrolled: its window starts again", pxe, append(powered[:2:2], step{3 * time.Minute, nodestate.ContactEnrolled, "enrolled with key sha256:ab", false}),
			window + time.Minute, nil},
		{"pxe, enrolled, then silent", pxe, append(powered[:2:2], step{3 * time.Minute, nodestate.ContactEnrolled, "enrolled with key sha256:ab", false}),
			3*time.Minute + window, []string{"enrolled at", "neither its install notice nor a report", "nodes[].rootDevice"}},
		{"pxe, installed, then silent", pxe, append(powered[:2:2], step{3 * time.Minute, nodestate.ContactEnrolled, "enrolled", false}, step{5 * time.Minute, nodestate.ContactInstalled, "installed to its disk", false}),
			5*time.Minute + window, []string{"installed to its disk at", "boots its disk"}},
		{"pxe, pending approval: each request is progress", pxe, append(powered[:2:2], step{3 * time.Minute, nodestate.ContactEnrolPending, "enrolment with key sha256:ab from 10.100.0.150 waits for the operator's approval", false},
			step{12 * time.Minute, nodestate.ContactEnrolPending, "enrolment with key sha256:ab from 10.100.0.150 waits for the operator's approval", false}),
			12*time.Minute + window - time.Second, nil},
		{"pxe, pending approval, then silent", pxe, append(powered[:2:2], step{3 * time.Minute, nodestate.ContactEnrolPending, "enrolment with key sha256:ab from 10.100.0.150 waits for the operator's approval", false}),
			3*time.Minute + window, []string{"its enrolment waited for the operator's approval (enrolment with key sha256:ab from 10.100.0.150", "appliance node approve n1", "appliance power off n1"}},
		{"pxe, pending, then refused (its window closed)", pxe, append(powered[:2:2], step{3 * time.Minute, nodestate.ContactEnrolPending, "waits", false},
			step{31 * time.Minute, nodestate.ContactEnrolRefused, "enrolment refused: node n1 was powered on at 05:00:00, more than 30m0s ago", false}),
			3*time.Minute + window + 30*time.Minute, []string{"its last enrolment was refused", "more than 30m0s ago"}},
		{"pxe, reported", pxe, append(powered[:2:2], step{5 * time.Minute, "", "", true}), 3 * window, nil},
		{"virtual media, silent", vm, powered, window, []string{"from virtual media (https://10.100.0.2:8443/boot/node.iso)", "booted the CD"}},
		{"BMC node booting its disk, silent", disk, powered, window, []string{"(power.bootDevice disk)", "hostagent never reported"}},
		{"an old power-on's contacts do not count", pxe, append(powered[:2:2], step{time.Minute, nodestate.ContactEnrolled, "enrolled", false}, step{20 * time.Minute, "", agentapi.StatePowering, false}, step{20*time.Minute + time.Second, "", agentapi.StateBooting, false}),
			20*time.Minute + window, []string{"no DHCP request"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := nodestate.Open(t.TempDir())
			var now time.Time
			store.Now = func() time.Time { return now }
			for _, s := range c.steps {
				now = t0.Add(s.after)
				var err error
				switch {
				case s.report:
					_, _, err = store.Record(c.node.Name, nil, agentapi.Report{BootID: "boot-1", Step: agentapi.StepConfig, Status: "running", Time: now})
				case s.contact != "":
					err = store.NoteContact(c.node.Name, s.contact, s.detail)
				default:
					_, err = store.Set(c.node.Name, s.detail, "")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			st, err := store.Get(c.node.Name)
			if err != nil {
				t.Fatal(err)
			}
			why, recheck, err := callbackOverdue(store, c.node, st, t0.Add(c.at), window)
			if err != nil {
				t.Fatal(err)
			}
			if c.want == nil {
				if why != "" {
					t.Fatalf("overdue: %s", why)
				}
				// Not overdue: the next read is due no earlier than now and no later than a window on.
				if recheck.Before(t0.Add(c.at)) || recheck.After(t0.Add(c.at+window)) {
					t.Errorf("recheck at %s, want within a window of %s", recheck, t0.Add(c.at))
				}
				return
			}
			for _, w := range c.want {
				if !strings.Contains(why, w) {
					t.Errorf("reason lacks %q:\n%s", w, why)
				}
			}
		})
	}
	// An SSH node is never the callback's: it gets hostagent over SSH.
	store := nodestate.Open(t.TempDir())
	if _, err := store.Set("cp1", agentapi.StateBooting, "hostagent installed over SSH"); err != nil {
		t.Fatal(err)
	}
	st, _ := store.Get("cp1")
	if why, _, err := callbackOverdue(store, config.Node{Name: "cp1", Power: config.Power{Kind: config.PowerSSH}}, st, time.Now().Add(time.Hour), window); why != "" || err != nil {
		t.Errorf("ssh node: %q %v", why, err)
	}
}

// TestConvergeFailsSilentMachineAlone: the converge phase fails a BMC-powered machine that stopped
// calling back, recording the reason in its status, while the other node becomes ready; the phase's
// error lists the failed node with that reason.
func TestConvergeFailsSilentMachineAlone(t *testing.T) {
	dir := t.TempDir()
	store := nodestate.Open(statedir.Nodes(dir))
	n1 := config.Node{Name: "n1", MAC: "52:54:00:00:00:21", Power: config.Power{Kind: config.PowerIPMI, BootDevice: config.BootPXE}}
	cp1 := config.Node{Name: "cp1", Power: config.Power{Kind: config.PowerSSH}}
	for _, s := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := store.Set("n1", s, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Set("cp1", agentapi.StateReady, ""); err != nil {
		t.Fatal(err)
	}
	disabled := false
	st := &State{StateDir: dir, Config: &config.BootstrapConfiguration{Nodes: []config.Node{cp1, n1}, Kubernetes: config.Kubernetes{Enabled: &disabled}},
		Options: Options{CallbackTimeout: 300 * time.Millisecond, ConvergeTimeout: time.Minute, Progress: &strings.Builder{}}}
	_, err := convergePhase{}.Run(context.Background(), st)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 nodes failed") || !strings.Contains(err.Error(), "n1: no call back for 300ms") {
		t.Fatalf("converge: %v", err)
	}
	s, err := store.Get("n1")
	if err != nil || s.State != agentapi.StateFailed || !strings.Contains(s.Reason, "no DHCP request from its MAC") {
		t.Errorf("n1's record: %+v %v", s, err)
	}
	if s, _ := store.Get("cp1"); s.State != agentapi.StateReady {
		t.Errorf("cp1's record: %+v", s)
	}
}
