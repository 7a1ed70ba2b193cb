package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

type nodeReinstallFlags struct {
	config, stateDir string
	yes, noPower     bool
}

func newNodeReinstallCommand() *cobra.Command {
	f := &nodeReinstallFlags{}
	cmd := &cobra.Command{
		Use:   "reinstall NODE --config FILE --yes",
		Short: "Install a network-booted node's disk again from the node image (everything on the disk is lost)",
		Long: `reinstall makes a node that installed itself from the network (nodes[].mac, power.kind ipmi or
redfish, power.bootDevice pxe) install again at its next boot. An installed node boots its disk,
keeping its state across reboots (the appliance's iPXE script for it boots the local disk); reinstalling
is only ever this explicit command:

  token   NODE's token is replaced (STATE/pki/tokens/NODE, 0600): a running appliance serve refuses the
          old one at once, so the installed system (and anyone holding a copy of its token) stops
          authenticating; the node gets a new token when it enrols ("token-rotated" in its history)
  mark    the appliance forgets that NODE is installed (STATE/netboot/installed/NODE.json): its next
          network boot loads the node image, which enrols and writes the disk chosen by
          nodes[].rootDevice again
  power   unless --no-power: the BMC sets a one-time PXE boot and power-cycles NODE (powered off:
          on), and the power-on is recorded so that its enrolment is accepted (as the power phase does)

With --no-power the node reinstalls the next time it boots from the network.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runNodeReinstall(cmd.Context(), cmd.ErrOrStderr(), f, args[0])
		},
	}
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&f.stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().BoolVar(&f.yes, "yes", false, "do it: the node's disk is written anew and everything on it is lost")
	cmd.Flags().BoolVar(&f.noPower, "no-power", false, "only forget the install; do not power-cycle the node")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func runNodeReinstall(ctx context.Context, out io.Writer, f *nodeReinstallFlags, name string) error {
	cfg, err := loadNodeConfig(out, f.config)
	if err != nil {
		return err
	}
	idx := slices.IndexFunc(cfg.Nodes, func(n config.Node) bool { return n.Name == name })
	if idx < 0 {
		return fmt.Errorf("%s is not in nodes[] of %s: name a node of the configuration", name, f.config)
	}
	n := cfg.Nodes[idx]
	if !n.NetworkBootable() {
		return fmt.Errorf("nodes[%d] (%s) does not install from the network (it needs mac, power.kind ipmi or redfish and power.bootDevice pxe): there is nothing to reinstall", idx, name)
	}
	if !f.yes {
		return fmt.Errorf("reinstalling %s writes its disk anew (everything on it is lost): pass --yes to do it", name)
	}
	dir, err := existingStateDir(cfg, f.stateDir)
	if err != nil {
		return err
	}
	// The token first: whatever follows fails, the installed system's token is already worthless.
	if _, err := pki.RotateNodeToken(statedir.PKI(dir), name); err != nil {
		return fmt.Errorf("reinstall %s: %w", name, err)
	}
	store := nodestate.Open(statedir.Nodes(dir))
	if err := store.RecordLifecycle(name, nodestate.TokenRotated, "appliance node reinstall with "+f.config); err != nil {
		return fmt.Errorf("reinstall %s: the token was replaced, recording it in the node's history failed: %w", name, err)
	}
	fmt.Fprintf(out, "reinstall %s: replaced its token; the old one is refused from now on, the node gets the new one when it enrols\n", name)
	had, err := netboot.ClearInstalled(filepath.Join(dir, "netboot"), name)
	if err != nil {
		return fmt.Errorf("forget %s's install: %w", name, err)
	}
	if had {
		fmt.Fprintf(out, "reinstall %s: the appliance forgot its install; its next network boot installs it again\n", name)
	} else {
		fmt.Fprintf(out, "reinstall %s: it was not marked installed; its next network boot installs it\n", name)
	}
	if f.noPower {
		fmt.Fprintf(out, "reinstall %s: not powered (--no-power): boot it from the network (appliance power cycle %s) to reinstall\n", name, name)
		return nil
	}
	t, err := bootstrap.PowerTarget(n)
	if err != nil {
		return err
	}
	ctrl, err := power.New(ctx, t, nil)
	if err != nil {
		return fmt.Errorf("nodes[%d].power: %w", idx, err)
	}
	defer ctrl.Close()
	// The enrolment is accepted only within the window after a recorded power-on.
	if _, err := store.Set(name, agentapi.StatePowering, "reinstall"); err != nil {
		return err
	}
	if err := ctrl.SetBootDevice(ctx, power.BootPXE, false); err != nil {
		return fmt.Errorf("reinstall %s: set a one-time PXE boot through nodes[%d].power: %w", name, idx, err)
	}
	if err := ctrl.PowerCycle(ctx); err != nil {
		return fmt.Errorf("reinstall %s: power-cycle through nodes[%d].power: %w", name, idx, err)
	}
	fmt.Fprintf(out, "reinstall %s: one-time PXE boot set and power cycled through its BMC (%s)\n", name, n.Power.Kind)
	return nil
}
