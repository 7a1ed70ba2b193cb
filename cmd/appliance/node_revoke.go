package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

type nodeRevokeFlags struct {
	config, stateDir string
	yes              bool
}

func newNodeRevokeCommand() *cobra.Command {
	f := &nodeRevokeFlags{}
	cmd := &cobra.Command{
		Use:   "revoke NODE --config FILE --yes",
		Short: "Revoke a node's token: nothing authenticates as the node until it is enrolled or installed again",
		Long: `revoke makes NODE's bearer token worthless, for a node whose token may have leaked (a lost disk, a
decommissioned machine, a second machine that claimed its identity):

  token   STATE/pki/tokens/NODE is removed: a running appliance serve refuses the token at once on
          every endpoint (agent API, /ignition/), config watches opened with it end, and a retry of
          the node's last enrolment gets no token back
  record  "token-revoked" in the node's history, and the node failed with the reason (appliance
          status NODE shows both)

The node's hostagent stops at its next request (401: revoked). To bring the node back it needs a new
token, which only the appliance hands out:

  network-booted node   appliance node reinstall NODE --yes (it enrols anew and gets a new token)
  SSH node              appliance bootstrap (the pki phase makes a new token, the power phase installs
                        hostagent over SSH with it, as the node is failed)
  other BMC node        power it off, then appliance bootstrap (its power phase powers it on to enrol)

Revoking a node that has no token changes nothing but says so.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runNodeRevoke(cmd.ErrOrStderr(), f, args[0])
		},
	}
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&f.stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().BoolVar(&f.yes, "yes", false, "do it: the node's hostagent stops talking to the appliance until it is enrolled or installed again")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func runNodeRevoke(out io.Writer, f *nodeRevokeFlags, name string) error {
	cfg, err := loadNodeConfig(out, f.config)
	if err != nil {
		return err
	}
	dir, err := existingStateDir(cfg, f.stateDir)
	if err != nil {
		return err
	}
	idx := slices.IndexFunc(cfg.Nodes, func(n config.Node) bool { return n.Name == name })
	pkiDir := statedir.PKI(dir)
	_, hasToken, err := pki.ReadNodeToken(pkiDir, name)
	if err != nil && idx < 0 {
		return fmt.Errorf("%s is not in nodes[] of %s: name a node of the configuration (%w)", name, f.config, err)
	}
	if idx < 0 && !hasToken {
		return fmt.Errorf("%s is not in nodes[] of %s and has no token in %s: name a node of the configuration", name, f.config, pkiDir)
	}
	if !f.yes {
		return fmt.Errorf("revoking %s's token stops its hostagent talking to the appliance until it is enrolled or installed again: pass --yes to do it", name)
	}
	had, err := pki.RevokeNodeToken(pkiDir, name)
	if err != nil {
		return err
	}
	again := "remove it from nodes[] (it is no longer in the configuration, so nothing issues it a token)"
	if idx >= 0 {
		again = reenrolHint(cfg.Nodes[idx], f.config)
	}
	if !had {
		fmt.Fprintf(out, "revoke %s: it has no token (already revoked, or never issued): nothing authenticates as it; to bring it back, %s\n", name, again)
		return nil
	}
	store := nodestate.Open(statedir.Nodes(dir))
	if err := store.RecordLifecycle(name, nodestate.TokenRevoked, "appliance node revoke with "+f.config); err != nil {
		return fmt.Errorf("revoke %s: the token was removed, recording it in the node's history failed: %w", name, err)
	}
	if idx >= 0 {
		reason := fmt.Sprintf("token revoked by appliance node revoke at %s; to bring it back, %s", time.Now().UTC().Format(time.RFC3339), again)
		if _, err := store.Set(name, agentapi.StateFailed, reason); err != nil {
			return fmt.Errorf("revoke %s: the token was removed, marking the node failed failed: %w", name, err)
		}
	}
	fmt.Fprintf(out, "revoke %s: removed its token; a running appliance serve refuses it from now on and nothing authenticates as %s; to bring it back, %s\n", name, name, again)
	return nil
}

// reenrolHint is what gives n a new token after a revocation, as the operator runs it.
func reenrolHint(n config.Node, cfgPath string) string {
	switch {
	case n.NetworkBootable():
		return fmt.Sprintf("run appliance node reinstall %s --config %s --yes (it enrols anew and gets a new token)", n.Name, cfgPath)
	case n.Power.Kind == config.PowerSSH:
		return fmt.Sprintf("run appliance bootstrap --config %s (it installs hostagent over SSH with a new token)", cfgPath)
	default:
		return fmt.Sprintf("power it off (appliance power off %s --config %s), then run appliance bootstrap --config %s (its power phase powers it on to enrol)", n.Name, cfgPath, cfgPath)
	}
}
