package bootstrap

import (
	"fmt"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// DefaultCallbackTimeout is how long the converge phase waits for a machine the power phase
// powered on through its BMC to make its next step of progress (enrol after the power-on, send its
// install notice after enrolling, report from its installed system after that) before it fails that
// node (Options.CallbackTimeout). A server's firmware takes 2 to 5 minutes to POST, and a
// network-booted node POSTs twice (the install, then its disk); ironic's deploy callback timeout is
// 30 minutes for the whole deployment.
const DefaultCallbackTimeout = 10 * time.Minute

// callback is what the appliance knows of a BMC-booted machine since its last power-on by the power
// phase, read from its events (nodestate): the contacts it made before its hostagent reports.
type callback struct {
	poweredOn time.Time // the power phase's last "powering" record; zero: never powered by it
	reported  bool      // a hostagent report after poweredOn
	// The last contact of each kind after poweredOn (zero time: none).
	netboot, refused, pending, enrolled, installed nodestate.Event
}

// readCallback reads node's callback record from its events.
func readCallback(store *nodestate.Store, node string) (callback, error) {
	evs, err := store.Events(node)
	if err != nil && len(evs) == 0 {
		return callback{}, err
	}
	var c callback
	for _, ev := range evs {
		switch {
		case ev.Step == "" && ev.Contact == "" && ev.State == agentapi.StatePowering:
			c = callback{poweredOn: ev.Time}
		case c.poweredOn.IsZero():
		case ev.Step != "":
			c.reported = true
		case ev.Contact == nodestate.ContactNetboot:
			c.netboot = ev
		case ev.Contact == nodestate.ContactEnrolRefused:
			c.refused = ev
		case ev.Contact == nodestate.ContactEnrolPending:
			c.pending = ev
		case ev.Contact == nodestate.ContactEnrolled:
			c.enrolled = ev
		case ev.Contact == nodestate.ContactInstalled:
			c.installed = ev
		}
	}
	return c, nil
}

// callbackOverdue returns why node n, which the power phase powered on through its BMC and whose
// record s is still booting, has stopped calling back, or "" while it is within window of its last
// step of progress (power-on, enrolment, a pending enrolment's request while it waits for the
// operator's approval, install notice; a network-boot answer only tells how far it got) or is not
// such a node. The reason names the last contact and what to check on the machine,
// then how to start over (a rerun leaves a machine that is on alone). recheck is when the answer can
// next change without the record's state changing: the deadline (progress only moves it later), so
// the converge loop reads the node's events once per deadline, not at every poll; zero when the
// events were not read.
func callbackOverdue(store *nodestate.Store, n config.Node, s agentapi.NodeStatus, now time.Time, window time.Duration) (why string, recheck time.Time, err error) {
	if n.Power.Kind == config.PowerSSH || (s.State != agentapi.StatePowering && s.State != agentapi.StateBooting) {
		return "", time.Time{}, nil
	}
	c, err := readCallback(store, n.Name)
	if err != nil || c.poweredOn.IsZero() || c.reported {
		return "", now.Add(window), err
	}
	last := c.poweredOn
	for _, ev := range []nodestate.Event{c.pending, c.enrolled, c.installed} {
		if ev.Time.After(last) {
			last = ev.Time
		}
	}
	if due := last.Add(window); now.Before(due) {
		return "", due, nil
	}
	return overdueReason(n, c, window), time.Time{}, nil
}

// overdueReason is callbackOverdue's reason for a machine whose callback record c is overdue.
func overdueReason(n config.Node, c callback, window time.Duration) string {
	at := func(t time.Time) string { return t.Local().Format("15:04:05") }
	restart := fmt.Sprintf("then switch it off (`appliance power off %s`) and rerun `appliance bootstrap`, whose power phase powers it on again", n.Name)
	head := fmt.Sprintf("no call back for %s: powered on by its BMC at %s", window, at(c.poweredOn))
	switch {
	case !c.installed.Time.IsZero():
		return fmt.Sprintf("%s, installed to its disk at %s, but its installed system has not reported: check on its console that it boots its disk (the BMC's boot order: the disk before the network and the CD) and that hostagent reaches the appliance; %s",
			head, at(c.installed.Time), restart)
	case !c.enrolled.Time.IsZero():
		return fmt.Sprintf("%s, enrolled at %s, but neither its install notice nor a report came: check on its console the install to disk (nodes[].rootDevice hints, the disks it saw) and its network to the appliance; %s",
			head, at(c.enrolled.Time), restart)
	case !c.pending.Time.IsZero() && !c.refused.Time.After(c.pending.Time):
		return fmt.Sprintf("%s; its enrolment waited for the operator's approval (%s), last asked at %s, and stopped asking unapproved: compare the key on its console with `appliance status` and approve it (`appliance node approve %s`) while it asks; %s",
			head, c.pending.Detail, at(c.pending.Time), n.Name, restart)
	case !c.refused.Time.IsZero():
		return fmt.Sprintf("%s; its last enrolment was refused at %s: %s; fix that, %s",
			head, at(c.refused.Time), c.refused.Detail, restart)
	case !c.netboot.Time.IsZero():
		return fmt.Sprintf("%s; its network boot got as far as %q at %s, but it never enrolled: check on its console the kernel, initramfs and root filesystem downloads (boot.httpPort) and `hostagent enroll` (its clock, its network to the appliance); %s",
			head, c.netboot.Detail, at(c.netboot.Time), restart)
	case n.Power.VirtualMediaImage != "":
		return fmt.Sprintf("%s from virtual media (%s), it never enrolled: check on its console through the BMC that it booted the CD (the node image's GRUB, then `hostagent enroll`) and that its live system gets an address (boot.dhcp server leases it one; otherwise the datacenter's DHCP server must) and reaches the appliance; %s",
			head, n.Power.VirtualMediaImage, restart)
	case n.NetworkBootable():
		return fmt.Sprintf("%s, no DHCP request from its MAC %s reached the appliance's network boot: check on its console through the BMC that it boots from the network on that NIC (boot order, PXE enabled on the NIC, the NIC on the control-plane network; nodes[].mac); %s",
			head, n.MAC, restart)
	default:
		return fmt.Sprintf("%s (power.bootDevice %s), its hostagent never reported: check on its console that it booted and that hostagent reaches the appliance; %s",
			head, n.Power.BootDevice, restart)
	}
}
