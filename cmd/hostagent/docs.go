package main

import (
	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/clidoc"
)

// newDocsCommand writes hostagent's CLI reference, one Markdown page per command, into DIR
// (docs/reference/cli: `make docs`). Hidden: it is for the repository, not for nodes.
func newDocsCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "docs DIR",
		Short:  "Write the CLI reference pages (Markdown, one per command) into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			// A fresh tree: the running one has cobra's completion command, added by Execute.
			return clidoc.Write(newRootCommand(), args[0])
		},
	}
}
