package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
	"github.com/airgap-appliance/appliance/pkg/version"
)

func newRootCommand() *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:          "hostagent",
		Short:        "Node agent of the bootstrap appliance",
		SilenceUsage: true,
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log debug details (never secrets) to stderr")
	logger := func(w io.Writer) *slog.Logger {
		level := slog.LevelInfo
		if verbose {
			level = slog.LevelDebug
		}
		return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	}
	root.AddCommand(newRunCommand(logger), newFetchCACommand(), newEnrollCommand(logger), newInstallCommand(logger), newCheckAPICommand(), newVersionCommand(), newDocsCommand())
	// The bare command with --config runs the agent, as the first-boot unit invokes it.
	bare := &runOptions{}
	bare.bind(root.Flags())
	root.Args = cobra.NoArgs
	root.RunE = func(cmd *cobra.Command, _ []string) error {
		if !cmd.Flags().Changed("config") {
			return cmd.Help()
		}
		return bare.run(cmd, logger)
	}
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the hostagent version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}
}

// runOptions are the flags of `hostagent run` (also accepted by the bare `hostagent`, which the
// first-boot systemd unit of pkg/ignition invokes as `hostagent --config FILE`).
type runOptions struct {
	configPath, root string
	noFirewall       bool
}

func (o *runOptions) bind(fs *pflag.FlagSet) {
	fs.StringVarP(&o.configPath, "config", "c", agentapi.ConfigPath, "hostagent configuration (node, applianceURL, caPin, token)")
	fs.StringVar(&o.root, "root", "", "prefix of every file read or written on the node (e.g. /sysroot from an initramfs)")
	fs.BoolVar(&o.noFirewall, "no-firewall", false, "do not install the node firewall (reported as skipped)")
}

func (o *runOptions) run(cmd *cobra.Command, logger func(io.Writer) *slog.Logger) error {
	data, err := os.ReadFile(filepath.Join(o.root, o.configPath))
	if err != nil {
		return fmt.Errorf("read hostagent configuration: %w", err)
	}
	cfg, err := agentapi.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", o.configPath, err)
	}
	a, err := hostagent.New(hostagent.Options{
		Config: cfg, Root: o.root, NoFirewall: o.noFirewall, Log: logger(cmd.ErrOrStderr()),
		// keepalived outlives the agent, so restarting or upgrading hostagent never moves the VIP.
		DetachKeepalived: true,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = a.Run(ctx)
	if errors.Is(err, hostagent.ErrRestart) && ctx.Err() == nil {
		// The agent replaced its executable (a self-upgrade): become the new one, same arguments,
		// same PID (systemd's MainPID, the lab kit's init), so nothing restarts around it.
		stop()
		exe, xerr := os.Executable()
		if xerr != nil {
			return fmt.Errorf("restart into the upgraded hostagent: %w", xerr)
		}
		if xerr = syscall.Exec(exe, os.Args, os.Environ()); xerr != nil {
			return fmt.Errorf("restart into the upgraded hostagent %s: %w", exe, xerr)
		}
	}
	if err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

func newRunCommand(logger func(io.Writer) *slog.Logger) *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Configure this node from the appliance and keep it configured",
		Long: "run reads the hostagent configuration (node, appliance URL, CA pin, token), trusts only the pinned\n" +
			"appliance CA, fetches the node config and applies it in steps (config, firewall, containerd,\n" +
			"keepalived and api on control planes, ready), reporting each to the appliance. It keeps running:\n" +
			"it notifies systemd when configured, re-checks every minute and restarts keepalived if it dies.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd, logger) },
	}
	o.bind(cmd.Flags())
	return cmd
}

func newFetchCACommand() *cobra.Command {
	var url, pin, out string
	cmd := &cobra.Command{
		Use:   "fetch-ca",
		Short: "Download the appliance CA and keep it only if it matches the pin",
		Long: "fetch-ca downloads URL/ca.crt without trusting anything, accepts the CA only if the SHA-256 of its\n" +
			"public key equals --pin (kubeadm's --discovery-token-ca-cert-hash format) and the server's\n" +
			"certificate was issued by it, and writes it (mode 0644).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ca, err := hostagent.FetchCA(cmd.Context(), url, pin)
			if err != nil {
				return err
			}
			if _, err := atomicfile.Write(out, ca, 0o644); err != nil {
				return fmt.Errorf("write %s: %w", out, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote the appliance CA (%s) to %s\n", pin, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "", "appliance URL, https://host:port (required)")
	cmd.Flags().StringVar(&pin, "pin", "", "CA public-key pin, sha256:<hex> (required)")
	cmd.Flags().StringVar(&out, "out", hostagent.CACertPath, "where to write the CA certificate")
	_ = cmd.MarkFlagRequired("url")
	_ = cmd.MarkFlagRequired("pin")
	return cmd
}

func newCheckAPICommand() *cobra.Command {
	return &cobra.Command{
		Use:    "check-api URL",
		Short:  "Exit 0 when the local API health endpoint answers ok (keepalived track script)",
		Args:   cobra.ExactArgs(1),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return hostagent.CheckAPI(ctx, args[0])
		},
	}
}
