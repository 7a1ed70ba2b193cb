package applianced

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/power"
)

// ejectPoll is how often a virtual-media node's record is read while its CD waits to be ejected.
const ejectPoll = 2 * time.Second

// installNotices takes the install notices (agentapi.InstalledPathV1) that the agent API
// authenticated: server.AgentAPI.Installed.
type installNotices struct {
	ctx   context.Context // serve's: the eject watches end with it
	cfg   *config.BootstrapConfiguration
	nb    *netboot.Server // nil: boot.dhcp off
	store *nodestate.Store
	log   *slog.Logger
	// newVM opens the node's BMC as a virtual-media booter (power.New on the node's power target).
	newVM func(ctx context.Context, n config.Node) (power.VirtualMediaBooter, func(), error)
}

func newInstallNotices(ctx context.Context, cfg *config.BootstrapConfiguration, nb *netboot.Server, store *nodestate.Store, log *slog.Logger) *installNotices {
	return &installNotices{ctx: ctx, cfg: cfg, nb: nb, store: store, log: log,
		newVM: func(ctx context.Context, n config.Node) (power.VirtualMediaBooter, func(), error) {
			return openVirtualMedia(ctx, n, log)
		}}
}

// note handles one notice of node (the one its token names):
//   - a virtual-media node (nodes[].power.virtualMediaImage): its BMC replaces the boot from the CD
//     with a one-time boot from the disk now (power.VirtualMediaBooter.ClearVirtualMediaBoot: the
//     live system still runs from the CD, which stays in), so that the reboot boots the disk, and
//     ejects the CD (EjectVirtualMedia) once the installed system has reported from its disk (a
//     report with a boot ID other than the notice's), or after agentapi.EnrollWindow anyway;
//   - a network-booted node: pkg/netboot marks it installed (netboot.Server.NoteInstalled);
//   - anything else: agentapi.ErrInstallNoticeNotServed (404).
//
// A BMC that cannot be reached or refuses is an error (503: the machine retries, then stops before
// rebooting and says so). A notice that was acted on is recorded in the node's events
// (nodestate.ContactInstalled).
func (h *installNotices) note(node string, n agentapi.InstallNotice, remote string) error {
	err := h.act(node, n, remote)
	if err == nil {
		// The contact the converge phase reads to say how far a silent machine got.
		if nerr := h.store.NoteContact(node, nodestate.ContactInstalled, "installed to its disk (install notice from "+remote+"); it boots its disk next"); nerr != nil {
			h.log.Warn("install notice not recorded in the node's events", "node", node, "err", nerr)
		}
	}
	return err
}

// act is what note does for the notice: see note.
func (h *installNotices) act(node string, n agentapi.InstallNotice, remote string) error {
	var cn *config.Node
	for i := range h.cfg.Nodes {
		if h.cfg.Nodes[i].Name == node {
			cn = &h.cfg.Nodes[i]
		}
	}
	switch {
	case cn != nil && cn.Power.VirtualMediaImage != "":
		return h.virtualMedia(*cn, n, remote)
	case h.nb != nil && n.MAC != "":
		return h.nb.NoteInstalled(node, n, remote)
	case h.nb != nil:
		return fmt.Errorf("%w: node %s booted without a boot NIC (the node image's ISO) and has no nodes[].power.virtualMediaImage: nothing to change in its boot", agentapi.ErrInstallNoticeNotServed, node)
	default:
		return fmt.Errorf("%w: this appliance network-boots no machine (boot.dhcp off) and node %s has no nodes[].power.virtualMediaImage", agentapi.ErrInstallNoticeNotServed, node)
	}
}

func (h *installNotices) virtualMedia(n config.Node, notice agentapi.InstallNotice, remote string) error {
	vb, closeVB, err := h.newVM(h.ctx, n)
	if err != nil {
		return fmt.Errorf("node %s's BMC: %w", n.Name, err)
	}
	changed, err := vb.ClearVirtualMediaBoot(h.ctx)
	if err != nil {
		closeVB()
		h.log.Warn("virtual media: the boot from the CD was not replaced with the disk; the installed node may boot the CD again", "node", n.Name, "error", err)
		return fmt.Errorf("node %s's BMC did not take the CD out of the boot: %w", n.Name, err)
	}
	h.log.Info("virtual media: node installed; its BMC boots the disk next, the CD is ejected once the installed system reports", "node", n.Name, "overrideReplaced", changed, "remote", remote)
	since := time.Now()
	go func() {
		defer closeVB()
		h.ejectAfterDiskBoot(vb, n.Name, notice.BootID, since)
	}()
	return nil
}

// ejectAfterDiskBoot waits until node reports from a boot other than installBoot (after since),
// then ejects its virtual CD; after agentapi.EnrollWindow without such a report it ejects anyway
// (the live system has long rebooted or failed). Serve ending stops the wait: the CD then stays in,
// logged, and the next power action's boot override still names the disk.
func (h *installNotices) ejectAfterDiskBoot(vb power.VirtualMediaBooter, node, installBoot string, since time.Time) {
	deadline := time.NewTimer(agentapi.EnrollWindow)
	defer deadline.Stop()
	tick := time.NewTicker(ejectPoll)
	defer tick.Stop()
	why := "the installed system reported"
wait:
	for {
		select {
		case <-h.ctx.Done():
			h.log.Warn("virtual media: serve stopped before the installed node reported; the CD stays inserted (eject it on the BMC, or it is ejected at the node's next install notice)", "node", node)
			return
		case <-deadline.C:
			why = "no report from the installed system within the enrolment window"
			break wait
		case <-tick.C:
			st, err := h.store.Get(node)
			if err == nil && st.BootID != "" && st.BootID != installBoot && st.Updated.After(since) {
				break wait
			}
		}
	}
	ctx, cancel := context.WithTimeout(h.ctx, 2*time.Minute)
	defer cancel()
	if err := vb.EjectVirtualMedia(ctx); err != nil {
		h.log.Warn("virtual media: eject failed; eject the CD on the BMC's virtual media page", "node", node, "error", err)
		return
	}
	h.log.Info("virtual media: CD ejected", "node", node, "after", why)
}

// openVirtualMedia opens node n's Redfish BMC (nodes[].power) as a power.VirtualMediaBooter, reading
// its password and CA files as pkg/bootstrap.PowerTarget does.
func openVirtualMedia(ctx context.Context, n config.Node, log *slog.Logger) (power.VirtualMediaBooter, func(), error) {
	p := n.Power
	t := power.Target{Name: n.Name, Kind: string(p.Kind), Address: p.Address, Username: p.Username, InsecureSkipVerify: p.InsecureSkipVerify}
	pass, err := config.ReadSecretFile(p.PasswordFile)
	if err != nil {
		return nil, nil, fmt.Errorf("power.passwordFile: %w", err)
	}
	t.Password = string(pass)
	if p.CAFile != "" {
		if t.CAPEM, err = os.ReadFile(p.CAFile); err != nil {
			return nil, nil, fmt.Errorf("power.caFile: %w", err)
		}
	}
	c, err := power.New(ctx, t, log)
	if err != nil {
		return nil, nil, err
	}
	vb, ok := c.(power.VirtualMediaBooter)
	if !ok {
		_ = c.Close()
		return nil, nil, fmt.Errorf("power.kind %s has no virtual media (%w)", p.Kind, power.ErrUnsupported)
	}
	return vb, func() { _ = c.Close() }, nil
}
