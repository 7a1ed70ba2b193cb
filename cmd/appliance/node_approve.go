package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

type nodeApproveFlags struct {
	config, stateDir, fingerprint string
	yes                           bool
}

func newNodeApproveCommand() *cobra.Command {
	f := &nodeApproveFlags{}
	cmd := &cobra.Command{
		Use:   "approve NODE --config FILE (--fingerprint sha256:HEX | --yes)",
		Short: "Approve a node's enrolment key after comparing it with the machine's console: a pending enrolment gets its token, an enrolment alarm is settled",
		Long: `approve confirms that the key NODE's enrolment is bound to is the machine's own, as kubectl
certificate approve does for a kubelet's request. Without --fingerprint or --yes it only shows the
enrolment (key fingerprint, source address, MACs, SMBIOS UUID, times) and any alarm: compare the key
with the line "enrolling with key sha256:…" that hostagent enroll printed on the machine's console
(through its BMC), and the address with the one the machine has. Then:

  --fingerprint sha256:HEX   approve only if the bound key is that one (the whole fingerprint as the
                             console shows it, or at least its first 16 hex digits)
  --yes                      approve the key shown

With boot.enrolment.approval: operator the enrolment waits without a token until then (appliance
status lists it as PENDING); the machine asks again at most 30 s apart, so it gets its token within
30 s of the approval, as long as its enrolment window (30 minutes from the power-on) is open.

After an enrolment alarm (appliance status: ALARM, a second machine claimed NODE in one power-on),
approving the bound key says the machine holding the token is NODE: the alarm is settled. If the
console shows another key, do not approve: the machine that enrolled is not NODE. Revoke its token
(appliance node revoke NODE --yes) and enrol NODE anew (appliance node reinstall NODE --yes for a
network-booted node).

The approval is STATE/enrolment/approved/NODE.json (0600); "enrol-approved" goes into the node's
history (appliance status NODE).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runNodeApprove(cmd.ErrOrStderr(), f, args[0], time.Now())
		},
	}
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&f.stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().StringVar(&f.fingerprint, "fingerprint", "", "approve only if the enrolment's key is this one: sha256:HEX as the machine's console shows it, or its first 16 hex digits or more")
	cmd.Flags().BoolVar(&f.yes, "yes", false, "approve the key shown (after comparing it with the machine's console)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func runNodeApprove(out io.Writer, f *nodeApproveFlags, name string, now time.Time) error {
	cfg, warnings, err := config.Load(f.config, config.ValidateOptions{})
	for _, w := range warnings {
		fmt.Fprintf(out, "warning: %s\n", w)
	}
	if err != nil {
		return fmt.Errorf("%s is not valid:\n%w", f.config, err)
	}
	dir := cfg.StateDir
	if f.stateDir != "" {
		dir = f.stateDir
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("state directory %s is not there: run appliance bootstrap first, or name the right one (stateDir, --state-dir)", dir)
	}
	var node *config.Node
	var enrolling []string
	for i, n := range cfg.Nodes {
		if n.MAC == "" || (n.Power.Kind != config.PowerIPMI && n.Power.Kind != config.PowerRedfish) {
			continue
		}
		enrolling = append(enrolling, n.Name)
		if n.Name == name {
			node = &cfg.Nodes[i]
		}
	}
	if node == nil {
		return fmt.Errorf("%s is not a node of %s that enrols (nodes[] with power.kind ipmi or redfish and a mac): name one of %s",
			name, f.config, orNone(enrolling))
	}
	recDir := statedir.Enrolment(dir)
	rec, found, err := server.ReadEnrollRecord(recDir, name)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%s has not enrolled (no %s): nothing to approve; appliance status lists the enrolments that wait", name, recDir)
	}
	store := nodestate.Open(statedir.Nodes(dir))
	hist, err := store.History(name)
	if err != nil {
		return err
	}
	alarm, alarmed := nodestate.ActiveEnrolConflict(hist)
	ap, approvedBefore, err := server.ReadEnrollApproval(recDir, name)
	if err != nil {
		return err
	}
	approvedBefore = approvedBefore && ap.KeyFingerprint == rec.KeyFingerprint && ap.PoweredOn.Equal(rec.PoweredOn)
	pending := rec.Pending && !approvedBefore
	fmt.Fprint(out, describeEnrolment(name, rec, pending))
	if alarmed {
		fmt.Fprintf(out, "ALARM (%s): %s\n", alarm.Time.Local().Format(time.DateTime), alarm.Detail)
	}
	if !pending && !alarmed {
		how := "it needed no approval (boot.enrolment.approval: automatic)"
		if approvedBefore {
			how = "it was approved at " + ap.Approved.Local().Format(time.DateTime)
		}
		fmt.Fprintf(out, "approve %s: nothing to do: %s, and no enrolment alarm is raised\n", name, how)
		return nil
	}
	if closes := rec.PoweredOn.Add(agentapi.EnrollWindow); pending && now.After(closes) {
		return fmt.Errorf("approve %s: its enrolment window closed at %s: the machine no longer asks for its token, and an approval would reach nobody; to enrol it anew, %s",
			name, closes.Local().Format(time.DateTime), reenrolHint(*node, f.config))
	}
	if f.fingerprint == "" && !f.yes {
		return fmt.Errorf("approve %s: compare the key above with the line \"enrolling with key sha256:…\" on %s's console (through its BMC), then run `appliance node approve %s --config %s --fingerprint %s` (or --yes to approve the key shown); if the console shows another key, do not approve: %s",
			name, name, name, f.config, rec.KeyFingerprint, ifNotGenuine(*node, f.config, pending))
	}
	fingerprint := f.fingerprint
	if fingerprint == "" {
		fingerprint = rec.KeyFingerprint // --yes: the key shown, not whatever is bound by now
	}
	if _, err := server.ApproveEnrollment(recDir, name, fingerprint, now); err != nil {
		if errors.Is(err, server.ErrFingerprintMismatch) {
			return fmt.Errorf("approve %s: %w: nothing approved; if the console shows another key than the bound one, %s", name, err, ifNotGenuine(*node, f.config, pending))
		}
		return fmt.Errorf("approve %s: %w", name, err)
	}
	detail := fmt.Sprintf("key %s from %s approved by appliance node approve with %s", rec.KeyFingerprint, orUnknown(rec.Source), f.config)
	if alarmed {
		detail += "; settles the enrolment alarm of " + alarm.Time.UTC().Format(time.RFC3339)
	}
	if err := store.RecordLifecycle(name, nodestate.EnrolApproved, detail); err != nil {
		return fmt.Errorf("approve %s: the approval was written, recording it in the node's history failed: %w", name, err)
	}
	switch {
	case pending:
		fmt.Fprintf(out, "approve %s: approved key %s: the machine gets its token at its next request (within 30 s)\n", name, rec.KeyFingerprint)
	default:
		fmt.Fprintf(out, "approve %s: confirmed key %s as %s's: the enrolment alarm is settled\n", name, rec.KeyFingerprint, name)
	}
	if alarmed {
		fmt.Fprintf(out, "approve %s: another machine claimed %s (see the alarm above): find it on the provisioning network by its address\n", name, name)
	}
	return nil
}

// describeEnrolment is node's enrolment binding rec for people, one field a line.
func describeEnrolment(node string, rec server.EnrollRecord, pending bool) string {
	state := "enrolled"
	if pending {
		state = "waits for approval (no token issued)"
	} else if !rec.Approved.IsZero() {
		state = "enrolled, approved at " + rec.Approved.Local().Format(time.DateTime)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: enrolment %s\n", node, state)
	fmt.Fprintf(&b, "  key          %s\n", rec.KeyFingerprint)
	fmt.Fprintf(&b, "  from         %s\n", orUnknown(rec.Source))
	fmt.Fprintf(&b, "  MACs         %s\n", strings.Join(rec.MACs, ", "))
	fmt.Fprintf(&b, "  system UUID  %s\n", orUnknown(rec.SystemUUID))
	fmt.Fprintf(&b, "  powered on   %s\n", rec.PoweredOn.Local().Format(time.DateTime))
	fmt.Fprintf(&b, "  enrolled     %s (last request %s)\n", rec.Enrolled.Local().Format(time.DateTime), rec.Answered.Local().Format(time.DateTime))
	return b.String()
}

// ifNotGenuine is what the operator does when the bound key is not the machine's.
func ifNotGenuine(n config.Node, cfgPath string, pending bool) string {
	if pending {
		return "no token was issued; the machine that enrolled is not " + n.Name + ": to enrol " + n.Name + " anew, " + reenrolHint(n, cfgPath)
	}
	return fmt.Sprintf("the machine that enrolled holds %s's token: run appliance node revoke %s --config %s --yes now, then %s", n.Name, n.Name, cfgPath, reenrolHint(n, cfgPath))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "(none: no node enrols)"
	}
	return strings.Join(names, ", ")
}
