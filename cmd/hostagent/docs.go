package main

import (
	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/clidoc"
)

// newDocsCommand is the hidden `hostagent docs DIR`: the CLI reference pages (docs/reference/cli, `make docs`).
func newDocsCommand() *cobra.Command { return clidoc.Command(newRootCommand) }
