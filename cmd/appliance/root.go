package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// Output formats of --output.
const (
	outputText = "text"
	outputJSON = "json"
)

// globalFlags are the flags every subcommand shares.
type globalFlags struct {
	verbose bool
	output  string
}

// check refuses an --output other than text or json.
func (g *globalFlags) check() error {
	if g.output != outputText && g.output != outputJSON {
		return fmt.Errorf("--output %q is not supported: use text or json", g.output)
	}
	return nil
}

func (g *globalFlags) logger(w io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelDebug
	}
	if g.output == outputJSON {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// newRootCommand builds the command tree. Flags shared by several commands have the same shorthand on
// every one: -c --config, -s --state-dir, -o --output, -v --verbose (TestFlagUsages checks it).
func newRootCommand() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "appliance",
		Short:         "Bootstrap appliance for air-gapped bare-metal Kubernetes installs",
		Long:          "appliance serves an air-gap bundle (OCI registry mirror, package repo, Ignition configs) over HTTPS with its own CA and drives nodes to a Kubernetes cluster.",
		SilenceUsage:  true,
		SilenceErrors: false,
		// Runs before every command (none defines its own PersistentPreRunE).
		PersistentPreRunE: func(*cobra.Command, []string) error { return g.check() },
	}
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log debug details (never secrets) to stderr")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", outputText, "progress format: text (for people, stderr) or json (one event per line, stdout)")
	root.AddCommand(
		newBootstrapCommand(g),
		newServeCommand(g),
		newConfigCommand(g),
		newStopCommand(),
		newStatusCommand(g),
		newDNSCommand(g),
		newPowerCommand(g),
		newNodeCommand(g),
		newHandoffCommand(g),
		newCSRApproveCommand(g),
		newBundleCommand(g),
		newFirstbootCommand(),
		newClusterMirrorCommand(g),
		newIngressRouterCommand(g),
		newOverlayCommand(g),
		newVersionCommand(g),
		newDocsCommand(),
	)
	walkCommands(root, requireKnownSubcommand)
	root.SetErr(os.Stderr)
	return root
}

// walkCommands calls f for c and every command under it.
func walkCommands(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, s := range c.Commands() {
		walkCommands(s, f)
	}
}

// requireKnownSubcommand makes a command that only groups subcommands refuse an unknown one (cobra
// prints the help of such a command and exits 0 for any argument): with no argument it prints its
// help; with one, it fails naming it, with the likely command if there is one.
func requireKnownSubcommand(c *cobra.Command) {
	if !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // cobra's default, which only its own lookup applies
		}
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return errors.New(msg + " (run '" + cmd.CommandPath() + " --help' for the commands)")
	}
	c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
}
