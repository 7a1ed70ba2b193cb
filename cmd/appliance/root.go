package main

import (
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// globalFlags are the flags every subcommand shares.
type globalFlags struct {
	verbose bool
	output  string
}

func (g *globalFlags) logger(w io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelDebug
	}
	if g.output == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

func newRootCommand() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "appliance",
		Short:         "Bootstrap appliance for air-gapped bare-metal Kubernetes installs",
		Long:          "appliance serves an air-gap bundle (OCI registry mirror, package repo, Ignition configs) over HTTPS with its own CA and drives nodes to a Kubernetes cluster.",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log debug details (never secrets) to stderr")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "text", "progress format: text (for people, stderr) or json (one event per line, stdout)")
	root.AddCommand(
		newBootstrapCommand(g),
		newServeCommand(g),
		newConfigCommand(),
		newStopCommand(),
		newStatusCommand(g),
		newPowerCommand(g),
		newBundleCommand(g),
		newFirstbootCommand(),
		newVersionCommand(),
	)
	root.SetErr(os.Stderr)
	return root
}
