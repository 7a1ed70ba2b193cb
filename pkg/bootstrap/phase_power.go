package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/airgap-appliance/appliance/pkg/bundle"

	"github.com/cenkalti/backoff/v5"
	"golang.org/x/sync/errgroup"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/pkg/provision"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// powerConcurrency bounds how many nodes are powered or provisioned at once.
const powerConcurrency = 16

// powerPhase brings every node under hostagent, concurrently and independently (one bad node never
// blocks the others):
//   - ssh nodes (pre-installed hosts): over SSH with the pinned host key, install the CA, the apt
//     source for /repo/, hostagent with its config and unit, and start it (pkg/provision; files
//     compared by hash first, so a rerun changes nothing);
//   - ipmi/redfish nodes: set the configured boot device (read back) and power on — unless the node
//     is already on, which is left alone (a running node is never power-cycled by a rerun).
//
// A node whose agent already reported configured or ready is skipped. A node that fails (unreachable,
// wrong credentials, host key mismatch…) is marked failed with the reason (`appliance status`) and
// named in the phase's detail; the phase itself succeeds so that converge waits for the others and
// then fails, listing the failed nodes.
type powerPhase struct{}

func (powerPhase) Name() string { return "power" }

func (powerPhase) Run(ctx context.Context, st *State) (Result, error) {
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	// The join token the nodes brought up below carry (renewed by the pki phase) must be in the
	// cluster before they run kubeadm join. Not fatal: converge reports nodes that cannot join,
	// and a run that repairs nodes while the API is down must still reach them.
	token, tokenChanged, err := ensureJoinToken(ctx, st)
	if err != nil {
		token = "join token not checked: " + err.Error()
	}
	withToken := func(r Result) Result {
		if token != "" {
			r.Detail = strings.TrimPrefix(r.Detail+"; "+token, "; ")
		}
		r.Changed = r.Changed || tokenChanged
		return r
	}
	if st.Options.DryRun {
		return withToken(powerCheck(st, store)), nil
	}
	hostagentBin, err := os.ReadFile(st.Options.HostagentBinary)
	if err != nil {
		return Result{}, fmt.Errorf("hostagent binary: %w", err)
	}
	var (
		mu      sync.Mutex
		lines   []string
		failed  []string
		changed bool
	)
	var g errgroup.Group // errors are per node (note), never the group's
	g.SetLimit(powerConcurrency)
	note := func(node, what string, ch bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", node, err))
			_, _ = store.Set(node, agentapi.StateFailed, err.Error())
			return
		}
		changed = changed || ch
		lines = append(lines, node+" "+what)
	}
	for _, n := range st.Config.Nodes {
		if s, err := store.Get(n.Name); err == nil && (s.State == agentapi.StateReady || s.State == agentapi.StateConfigured) {
			note(n.Name, "up", false, nil)
			continue
		}
		g.Go(func() error {
			var what string
			var ch bool
			var err error
			if n.Power.Kind == config.PowerSSH {
				what, ch, err = provisionSSHRetried(ctx, st, store, n, hostagentBin)
			} else {
				what, ch, err = powerBMC(ctx, st, store, n)
			}
			note(n.Name, what, ch, err)
			return nil
		})
	}
	_ = g.Wait()
	sort.Strings(lines)
	detail := strings.Join(lines, ", ")
	if len(failed) > 0 {
		// The others proceed: converge waits for them and then reports these as failed.
		sort.Strings(failed)
		if detail != "" {
			detail += "; "
		}
		detail += fmt.Sprintf("%d FAILED: %s", len(failed), strings.Join(failed, "; "))
	}
	return withToken(Result{Changed: changed, Detail: detail}), nil
}

// powerCheck is the dry run: which nodes the phase would provision over SSH or power on through
// their BMC (those not yet configured or ready), contacting none of them.
func powerCheck(st *State, store *nodestate.Store) Result {
	var would []string
	for _, n := range st.Config.Nodes {
		if s, err := store.Get(n.Name); err == nil && (s.State == agentapi.StateReady || s.State == agentapi.StateConfigured) {
			continue
		}
		if n.Power.Kind == config.PowerSSH {
			would = append(would, n.Name+" (install hostagent over SSH)")
		} else if err := canEnrol(st.Config, n); err != nil {
			would = append(would, fmt.Sprintf("%s (refused: %v)", n.Name, err))
		} else if n.Power.VirtualMediaImage != "" {
			would = append(would, fmt.Sprintf("%s (virtual media %s, boot once from it and power on, %s)", n.Name, n.Power.VirtualMediaImage, n.Power.Kind))
		} else {
			would = append(would, fmt.Sprintf("%s (boot device and power on, %s)", n.Name, n.Power.Kind))
		}
	}
	if len(would) == 0 {
		return Result{Detail: fmt.Sprintf("all %d nodes up", len(st.Config.Nodes))}
	}
	return Result{Changed: true, Detail: "would bring up " + strings.Join(would, ", ")}
}

// provisionSSHRetried retries provisionSSH with backoff (3 attempts within about 10 s: a host whose
// sshd is still starting), except for errors a retry cannot fix: a host key that is unknown or
// changed, refused credentials.
func provisionSSHRetried(ctx context.Context, st *State, store *nodestate.Store, n config.Node, bin []byte) (string, bool, error) {
	type out struct {
		what    string
		changed bool
	}
	o, err := backoff.Retry(ctx, func() (out, error) {
		what, ch, err := provisionSSH(ctx, st, store, n, bin)
		if errors.Is(err, power.ErrHostKeyMismatch) || errors.Is(err, power.ErrHostKeyUnknown) || errors.Is(err, power.ErrAuth) {
			return out{}, backoff.Permanent(err)
		}
		return out{what, ch}, err
	}, backoff.WithMaxTries(3), backoff.WithBackOff(backoff.NewExponentialBackOff()))
	return o.what, o.changed, err
}

// provisionSSH installs hostagent on a pre-installed host and, when that changed anything and store
// is not nil, sets the node's record to booting.
func provisionSSH(ctx context.Context, st *State, store *nodestate.Store, n config.Node, hostagentBin []byte) (string, bool, error) {
	t, err := PowerTarget(n)
	if err != nil {
		return "", false, err
	}
	o, err := power.SSHOptionsFor(t, st.Options.Logger)
	if err != nil {
		return "", false, err
	}
	client, err := power.DialSSH(ctx, o)
	if err != nil {
		return "", false, err
	}
	defer client.Close()
	if st.Plan == nil {
		return "", false, errors.New("no plan: the render phase did not run (run without --skip-phases render)")
	}
	a, ok := st.Plan.Node(n.Name)
	if !ok {
		return "", false, fmt.Errorf("no rendered hostagent config for %s (render phase)", n.Name)
	}
	agentCfg := a.AgentConfig
	b, err := bundle.Open(st.Config.Bundle.Path)
	if err != nil {
		return "", false, fmt.Errorf("bundle.path: %w", err)
	}
	keyring, err := b.RepoKeyring() // covered by the bundle's signature, checked by the bundle phase
	if err != nil {
		return "", false, fmt.Errorf("bundle.path: %w", err)
	}
	res, err := provision.Provision(ctx, client, provision.Host{
		ApplianceURL: st.ApplianceURL, CAPEM: st.CA.CertPEM, Hostagent: hostagentBin, HostagentConfig: agentCfg,
		RepoKeyring: keyring,
	})
	if err != nil {
		return "", false, err
	}
	if len(res.Changed) == 0 {
		return "hostagent installed (ssh)", false, nil
	}
	if store != nil { // nil: the upgrade phase set the record before installing
		_, _ = store.Set(n.Name, agentapi.StateBooting, "hostagent installed over SSH")
	}
	return fmt.Sprintf("hostagent installed over SSH (%d changes)", len(res.Changed)), true, nil
}

// powerBMC sets the boot device and powers the node on through its BMC.
func powerBMC(ctx context.Context, st *State, store *nodestate.Store, n config.Node) (string, bool, error) {
	if err := canEnrol(st.Config, n); err != nil {
		return "", false, err
	}
	t, err := PowerTarget(n)
	if err != nil {
		return "", false, err
	}
	ctrl, err := power.New(ctx, t, st.Options.Logger)
	if err != nil {
		return "", false, err
	}
	defer ctrl.Close()
	if s, err := ctrl.PowerState(ctx); err != nil {
		return "", false, err
	} else if s == power.StateOn {
		return "already on", false, nil
	}
	_, _ = store.Set(n.Name, agentapi.StatePowering, "")
	if n.Power.VirtualMediaImage != "" {
		return bootVirtualMedia(ctx, st, store, n, ctrl)
	}
	results := power.RunAll(ctx, map[string]power.Controller{n.Name: ctrl}, 1, power.RetryPolicy{},
		func(ctx context.Context, c power.Controller) error {
			dev := power.BootDevice(n.Power.BootDevice)
			if dev == "" {
				dev = power.BootPXE
			}
			if err := c.SetBootDevice(ctx, dev, false); err != nil && !errors.Is(err, power.ErrUnsupported) {
				return err
			}
			return c.PowerOn(ctx)
		})
	if err := results[0].Err; err != nil {
		return "", false, err
	}
	_, _ = store.Set(n.Name, agentapi.StateBooting, "powered on by its BMC")
	return "powered on (" + string(n.Power.Kind) + ")", true, nil
}

// bootVirtualMedia has the node's Redfish BMC insert nodes[].power.virtualMediaImage as its virtual
// CD, boot it once and power on (power.VirtualMediaBooter). The BMC verifies the image server with the
// appliance CA when the image is the appliance's own (same host and port as the appliance URL);
// another server's image is fetched with the BMC's own trust. A BMC without virtual media, or one
// that cannot fetch the image, fails this node with the reason; the others go on.
func bootVirtualMedia(ctx context.Context, st *State, store *nodestate.Store, n config.Node, ctrl power.Controller) (string, bool, error) {
	vb, ok := ctrl.(power.VirtualMediaBooter)
	if !ok {
		return "", false, fmt.Errorf("power.virtualMediaImage: the %s backend has no virtual media (%w): use power.kind redfish", n.Power.Kind, power.ErrUnsupported)
	}
	o := power.VirtualMediaOptions{Image: n.Power.VirtualMediaImage}
	if img, err := url.Parse(o.Image); err == nil && st.CA != nil {
		if app, err := url.Parse(st.ApplianceURL); err == nil && app.Host == img.Host && img.Scheme == "https" {
			o.CAPEM = st.CA.CertPEM
		}
	}
	r, err := vb.BootVirtualMedia(ctx, o)
	if err != nil {
		return "", false, err
	}
	_, _ = store.Set(n.Name, agentapi.StateBooting, "booted from virtual media by its BMC")
	return "powered on from " + r.String(), true, nil
}

// canEnrol refuses to power on a BMC-booted node without nodes[].mac: its boot carries no secret, and
// it gets its node credential only by enrolling (agentapi.EnrollPathV1), which the appliance matches
// by that MAC, so powered on it would boot and wait forever. The error names the field path and says
// what to write; nothing is contacted.
func canEnrol(c *config.BootstrapConfiguration, n config.Node) error {
	if n.MAC != "" {
		return nil
	}
	node := "nodes[]"
	for i, o := range c.Nodes {
		if o.Name == n.Name {
			node = fmt.Sprintf("nodes[%d]", i)
		}
	}
	return fmt.Errorf("%s.mac is not set: a BMC-booted machine gets its node credential only by enrolling with its MAC (POST %s), so it was not powered on; write its boot NIC's MAC address there (and %s.systemUUID when known) and rerun",
		node, agentapi.EnrollPathV1, node)
}
