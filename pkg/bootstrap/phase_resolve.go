package bootstrap

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/airgap-appliance/appliance/pkg/netresolve"
)

// resolvePhase finds this host's control-plane and workload-plane addresses: the first local
// address inside each configured CIDR list, in order, never the VIP.
type resolvePhase struct{}

func (resolvePhase) Name() string { return "resolve" }

func (resolvePhase) Run(_ context.Context, st *State) (Result, error) {
	r, err := netresolve.New(st.Options.NetNSPath)
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	var exclude []netip.Addr
	if vip := st.Config.APIServer.VIP; vip.IsValid() {
		exclude = append(exclude, vip)
	}
	cp, err := r.Resolve(st.Config.Networks.ControlPlane.CIDRs, exclude...)
	if err != nil {
		return Result{}, fmt.Errorf("networks.controlPlane.cidrs: %w", err)
	}
	wl, err := r.Resolve(st.Config.Networks.WorkloadPlane.CIDRs, exclude...)
	if err != nil {
		return Result{}, fmt.Errorf("networks.workloadPlane.cidrs: %w", err)
	}
	st.ControlPlane, st.WorkloadPlane = cp, wl
	st.ApplianceURL = "https://" + netip.AddrPortFrom(cp.Prefix.Addr(), st.Config.Server.Port).String()
	if cp.Prefix.Addr().Is6() {
		st.ApplianceURL = "https://[" + cp.Prefix.Addr().String() + "]:" + strconv.Itoa(int(st.Config.Server.Port))
	}
	return Result{Detail: fmt.Sprintf("control plane %s on %s, workload plane %s on %s",
		cp.Prefix, cp.Interface, wl.Prefix, wl.Interface)}, nil
}

// Load, for a skipped resolve phase: resolving only reads the host's addresses, so it runs as usual.
func (p resolvePhase) Load(ctx context.Context, st *State) error {
	_, err := p.Run(ctx, st)
	return err
}
