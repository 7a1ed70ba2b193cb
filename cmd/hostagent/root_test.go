package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFlagUsages: hostagent's flags render as written and share the appliance's shorthands
// (-c --config, -v --verbose).
func TestFlagUsages(t *testing.T) {
	shorthands := map[string]string{"config": "c", "verbose": "v"}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backquote, which pflag renders as the placeholder", c.CommandPath(), f.Name, f.Usage)
			}
			if want, ok := shorthands[f.Name]; ok && f.Shorthand != want {
				t.Errorf("%s --%s: shorthand %q, want -%s", c.CommandPath(), f.Name, f.Shorthand, want)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRootCommand())
}

// TestUnknownSubcommand: an unknown command is an error naming it.
func TestUnknownSubcommand(t *testing.T) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"bogus"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), `unknown command "bogus" for "hostagent"`) {
		t.Errorf("hostagent bogus: %v", err)
	}
}
