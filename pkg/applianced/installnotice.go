package applianced

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/power"
)

// ejectPoll is how often a virtual-media node's record is read while its CD waits to be ejected.
const ejectPoll = 2 * time.Second

// bmcCallTimeout bounds one BMC session (open, one call, close) made for an install notice or its
// eject: a Redfish BMC answers a PATCH of its boot override in seconds, an InsertMedia task in under
// a minute; two minutes is the power phase's own bound for one BMC call.
const bmcCallTimeout = 2 * time.Minute

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

	mu      sync.Mutex
	busy    map[string]bool               // nodes whose notice is being acted on
	watches map[string]context.CancelFunc // node → its eject watch (one per node)
}

func newInstallNotices(ctx context.Context, cfg *config.BootstrapConfiguration, nb *netboot.Server, store *nodestate.Store, log *slog.Logger) *installNotices {
	return &installNotices{ctx: ctx, cfg: cfg, nb: nb, store: store, log: log,
		newVM: func(ctx context.Context, n config.Node) (power.VirtualMediaBooter, func(), error) {
			return openVirtualMedia(ctx, n, log)
		}, busy: map[string]bool{}, watches: map[string]context.CancelFunc{}}
}

// note handles one notice of node (the one its token names), ctx being the request's:
//   - a virtual-media node (nodes[].power.virtualMediaImage): its BMC replaces the boot from the CD
//     with a one-time boot from the disk now (power.VirtualMediaBooter.ClearVirtualMediaBoot: the
//     live system still runs from the CD, which stays in), so that the reboot boots the disk, and
//     ejects the CD (EjectVirtualMedia) once the installed system has reported from its disk (a
//     report with a boot ID other than the notice's), or after agentapi.EnrollWindow anyway;
//   - a network-booted node: pkg/netboot marks it installed (netboot.Server.NoteInstalled);
//   - anything else: agentapi.ErrInstallNoticeNotServed (404).
//
// One notice per node at a time: a notice of a node whose previous one is still being acted on is
// agentapi.ErrInstallNoticeBusy (429; the machine sends it again), so a machine resending in a loop
// opens one BMC session at a time. The BMC call runs on the request's context (bounded by
// bmcCallTimeout) in a session of its own, closed before the answer: a client that goes away
// cancels it. A node has one eject watch: a new notice replaces the previous one's.
//
// A BMC that cannot be reached or refuses is an error (503: the machine retries, then stops before
// rebooting and says so). A notice that was acted on is recorded in the node's events
// (nodestate.ContactInstalled).
func (h *installNotices) note(ctx context.Context, node string, n agentapi.InstallNotice, remote string) error {
	h.mu.Lock()
	if h.busy[node] {
		h.mu.Unlock()
		return fmt.Errorf("%w: node %s's previous install notice is still being acted on (its BMC call): send it again in a few seconds", agentapi.ErrInstallNoticeBusy, node)
	}
	h.busy[node] = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.busy, node)
		h.mu.Unlock()
	}()
	err := h.act(ctx, node, n, remote)
	if err == nil {
		// The contact the converge phase reads to say how far a silent machine got.
		if nerr := h.store.NoteContact(node, nodestate.ContactInstalled, "installed to its disk (install notice from "+remote+"); it boots its disk next"); nerr != nil {
			h.log.Warn("install notice not recorded in the node's events", "node", node, "err", nerr)
		}
	}
	return err
}

// act is what note does for the notice: see note.
func (h *installNotices) act(ctx context.Context, node string, n agentapi.InstallNotice, remote string) error {
	var cn *config.Node
	for i := range h.cfg.Nodes {
		if h.cfg.Nodes[i].Name == node {
			cn = &h.cfg.Nodes[i]
		}
	}
	switch {
	case cn != nil && cn.Power.VirtualMediaImage != "":
		return h.virtualMedia(ctx, *cn, n, remote)
	case h.nb != nil && n.MAC != "":
		return h.nb.NoteInstalled(node, n, remote)
	case h.nb != nil:
		return fmt.Errorf("%w: node %s booted without a boot NIC (the node image's ISO) and has no nodes[].power.virtualMediaImage: nothing to change in its boot", agentapi.ErrInstallNoticeNotServed, node)
	default:
		return fmt.Errorf("%w: this appliance network-boots no machine (boot.dhcp off) and node %s has no nodes[].power.virtualMediaImage", agentapi.ErrInstallNoticeNotServed, node)
	}
}

func (h *installNotices) virtualMedia(ctx context.Context, n config.Node, notice agentapi.InstallNotice, remote string) error {
	ctx, cancel := context.WithTimeout(ctx, bmcCallTimeout)
	defer cancel()
	vb, closeVB, err := h.newVM(ctx, n)
	if err != nil {
		return fmt.Errorf("node %s's BMC: %w", n.Name, err)
	}
	changed, err := vb.ClearVirtualMediaBoot(ctx)
	closeVB()
	if err != nil {
		h.log.Warn("virtual media: the boot from the CD was not replaced with the disk; the installed node may boot the CD again", "node", n.Name, "error", err)
		return fmt.Errorf("node %s's BMC did not take the CD out of the boot: %w", n.Name, err)
	}
	h.log.Info("virtual media: node installed; its BMC boots the disk next, the CD is ejected once the installed system reports", "node", n.Name, "overrideReplaced", changed, "remote", remote)
	h.watchEject(n, notice.BootID, time.Now())
	return nil
}

// watchEject starts node n's eject watch (ejectAfterDiskBoot), ending the one an earlier notice
// started.
func (h *installNotices) watchEject(n config.Node, installBoot string, since time.Time) {
	wctx, cancel := context.WithCancel(h.ctx)
	h.mu.Lock()
	if prev := h.watches[n.Name]; prev != nil {
		prev()
	}
	h.watches[n.Name] = cancel
	h.mu.Unlock()
	go func() {
		h.ejectAfterDiskBoot(wctx, n, installBoot, since)
		h.mu.Lock()
		if h.watches[n.Name] != nil && wctx.Err() == nil {
			delete(h.watches, n.Name)
		}
		h.mu.Unlock()
		cancel()
	}()
}

// ejectAfterDiskBoot waits until node n reports from a boot other than installBoot (after since),
// then ejects its virtual CD through a BMC session of its own; after agentapi.EnrollWindow without
// such a report it ejects anyway (the live system has long rebooted or failed). ctx ending (serve
// stopping, or a newer notice of the node) stops the wait: the CD then stays in, and the next power
// action's boot override still names the disk.
func (h *installNotices) ejectAfterDiskBoot(ctx context.Context, n config.Node, installBoot string, since time.Time) {
	node := n.Name
	deadline := time.NewTimer(agentapi.EnrollWindow)
	defer deadline.Stop()
	tick := time.NewTicker(ejectPoll)
	defer tick.Stop()
	why := "the installed system reported"
wait:
	for {
		select {
		case <-ctx.Done():
			if h.ctx.Err() != nil {
				h.log.Warn("virtual media: serve stopped before the installed node reported; the CD stays inserted (eject it on the BMC, or it is ejected at the node's next install notice)", "node", node)
			}
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
	ctx, cancel := context.WithTimeout(ctx, bmcCallTimeout)
	defer cancel()
	vb, closeVB, err := h.newVM(ctx, n)
	if err != nil {
		h.log.Warn("virtual media: eject failed, the BMC could not be opened; eject the CD on the BMC's virtual media page", "node", node, "error", err)
		return
	}
	defer closeVB()
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
