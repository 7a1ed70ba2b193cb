package main

import (
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
)

// enrollKeyPath is where `hostagent enroll` keeps its key by default: under /run, so a reboot (a new
// power-on, a new enrolment) starts with a new key.
const enrollKeyPath = "/run/hostagent/enroll.key"

func newEnrollCommand(logger func(io.Writer) *slog.Logger) *cobra.Command {
	var (
		url, pin, root, keyPath, configOut, caOut, ignitionOut, ignitionVersion, installArgsOut string
		retryFor, pendingFor                                                                    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "enroll",
		Short: "Enrol this BMC-booted machine with the appliance and write its hostagent configuration",
		Long: "enroll is what a machine the appliance network-booted runs first: its boot carries only public data\n" +
			"(the appliance URL and the pin of its CA). It fetches the CA and keeps it only if it matches --pin,\n" +
			"creates (or reuses) an Ed25519 key at --key, and sends the appliance a request signed with it that\n" +
			"carries every NIC's MAC address and the SMBIOS system UUID. The appliance answers only for the node\n" +
			"of its inventory with that MAC (and nodes[].systemUUID, when set) that it powered on within the last\n" +
			"30 minutes, once per power-on. The answer, the node's hostagent configuration with its token, is\n" +
			"written to --config (mode 0600). With --ignition-out it also fetches the node's Ignition config with\n" +
			"the token in the Authorization header and writes it there (0600), for `ignition -platform file`.\n\n" +
			"It prints the key's fingerprint first: the operator compares it with what the appliance shows. Where\n" +
			"the appliance's operator approves enrolments (boot.enrolment.approval: operator), the appliance answers\n" +
			"\"pending\" until `appliance node approve NODE` on the appliance: enroll keeps asking, backing off (at\n" +
			"most 30 s apart), for up to --pending-for.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			start := time.Now()
			ctx := cmd.Context()
			log := logger(cmd.ErrOrStderr())
			ca, err := hostagent.FetchCA(ctx, url, pin)
			if err != nil {
				return err
			}
			if _, err := atomicfile.Write(filepath.Join(root, caOut), ca, 0o644); err != nil {
				return fmt.Errorf("write %s: %w", caOut, err)
			}
			key, created, err := hostagent.LoadOrCreateKey(filepath.Join(root, keyPath))
			if err != nil {
				return err
			}
			log.Debug("enrolment key", "path", keyPath, "created", created)
			// On the machine's console: what the operator compares with the appliance's record.
			fmt.Fprintf(cmd.ErrOrStderr(), "enrolling with key %s\n", agentapi.KeyFingerprint(key.Public().(ed25519.PublicKey)))
			res, err := hostagent.Enroll(ctx, hostagent.EnrollOptions{
				ApplianceURL: url, CAPin: pin, CAPEM: ca, Key: key, RetryFor: retryFor, PendingFor: pendingFor, Log: log,
			})
			if err != nil {
				return err
			}
			if _, err := atomicfile.Write(filepath.Join(root, configOut), []byte(res.Response.HostagentConfig), 0o600); err != nil {
				return fmt.Errorf("write %s: %w", configOut, err)
			}
			if installArgsOut != "" {
				// Public data (root-device hints, static addresses): readable, one line.
				if _, err := atomicfile.Write(filepath.Join(root, installArgsOut), []byte(strings.Join(res.Response.InstallArgs, " ")+"\n"), 0o644); err != nil {
					return fmt.Errorf("write %s: %w", installArgsOut, err)
				}
			}
			if ignitionOut != "" {
				ign, err := hostagent.FetchIgnition(ctx, url, ca, res.Config.Node, res.Config.Token, ignitionVersion)
				if err != nil {
					return err
				}
				if _, err := atomicfile.Write(filepath.Join(root, ignitionOut), ign, 0o600); err != nil {
					return fmt.Errorf("write %s: %w", ignitionOut, err)
				}
			}
			approved := ""
			if res.Pending > 0 {
				approved = fmt.Sprintf(" (approved by the operator after %.0fs)", res.Pending.Seconds())
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "enrolled as node %s (key %s) in %.2fs%s, %d request(s); wrote %s\n",
				res.Config.Node, res.Response.KeyFingerprint, time.Since(start).Seconds(), approved, res.Attempts, configOut)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "", "appliance URL, https://host:port (required; the kernel's appliance.url=)")
	f.StringVar(&pin, "pin", "", "CA public-key pin, sha256:<hex> (required; the kernel's appliance.ca_pin=)")
	f.StringVar(&root, "root", "", "prefix of every file written (e.g. /sysroot)")
	f.StringVar(&keyPath, "key", enrollKeyPath, "the enrolment key (Ed25519, PKCS#8 PEM, 0600); created when missing, reused by a retry")
	f.StringVarP(&configOut, "config", "c", agentapi.ConfigPath, "where to write the hostagent configuration (0600)")
	f.StringVar(&caOut, "ca-out", hostagent.CACertPath, "where to write the pinned CA certificate (0644)")
	f.StringVar(&ignitionOut, "ignition-out", "", "also fetch the node's Ignition config and write it here (0600)")
	f.StringVar(&installArgsOut, "install-args-out", "", "also write the node's install parameters from the answer here (root-device hints, static addresses: kernel-argument words, one line, 0644)")
	f.StringVar(&ignitionVersion, "ignition-version", "3.3.0", "Ignition spec version to ask for (the node's ignition must parse it)")
	f.DurationVar(&retryFor, "retry-for", 5*time.Minute, "how long to retry network errors and 5xx answers")
	f.DurationVar(&pendingFor, "pending-for", agentapi.EnrollWindow, "how long to wait for the operator's approval when the appliance answers that the enrolment is pending")
	_ = cmd.MarkFlagRequired("url")
	_ = cmd.MarkFlagRequired("pin")
	return cmd
}
