package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// writeConfig writes c (Marshal) to a file in a temporary directory and returns its path.
func writeConfig(t *testing.T, c *config.BootstrapConfiguration) string {
	t.Helper()
	b, err := config.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUnknownOutputFormat: -o takes text or json; anything else is refused by every command before
// it runs.
func TestUnknownOutputFormat(t *testing.T) {
	path := writeConfig(t, config.Example())
	for _, args := range [][]string{{"version"}, {"-o", "yaml", "status", "-c", path}, {"config", "validate", "--offline", path}, {"bundle", "inspect", "/nonexistent"}} {
		if args[0] != "-o" {
			args = append(args, "--output", "yaml")
		}
		out, _, err := runCLI(args...)
		if err == nil || !strings.Contains(err.Error(), `--output "yaml" is not supported: use text or json`) {
			t.Errorf("%q: error %v, want the --output refusal", args, err)
		}
		if out != "" {
			t.Errorf("%q printed %q before refusing", args, out)
		}
	}
}

// TestUnknownSubcommand: an unknown command exits non-zero at every level, naming it, with the
// likely command when there is one.
func TestUnknownSubcommand(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "appliance"`},
		{[]string{"config", "bogus"}, `unknown command "bogus" for "appliance config"`},
		{[]string{"config", "valdate", "x.yaml"}, `did you mean validate?`},
		{[]string{"bundle", "bogus"}, `unknown command "bogus" for "appliance bundle"`},
		{[]string{"power", "bogus"}, `unknown command "bogus" for "appliance power"`},
	}
	for _, tt := range tests {
		_, _, err := runCLI(tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%q: error %v, want one containing %q", tt.args, err, tt.msg)
		}
	}
	// Without a subcommand, a group prints its help and succeeds.
	if out, _, err := runCLI("config"); err != nil || !strings.Contains(out, "Available Commands") {
		t.Errorf("appliance config: %v, %q", err, out)
	}
}

// validateJSON is `config validate -o json` output.
type validateJSON struct {
	File              string               `json:"file"`
	Valid             bool                 `json:"valid"`
	ClusterName       string               `json:"clusterName"`
	ControlPlaneNodes int                  `json:"controlPlaneNodes"`
	WorkerNodes       int                  `json:"workerNodes"`
	Warnings          []*config.FieldError `json:"warnings"`
	Errors            []*config.FieldError `json:"errors"`
}

func TestConfigValidateJSON(t *testing.T) {
	valid := writeConfig(t, config.Example())
	out, _, err := runCLI("config", "validate", "--offline", "-o", "json", valid)
	var v validateJSON
	if err != nil || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("valid: %v, output %q", err, out)
	}
	if !v.Valid || v.File != valid || v.ClusterName != "lab" || v.ControlPlaneNodes != 3 || v.WorkerNodes != 2 || v.Errors == nil || len(v.Errors) != 0 {
		t.Errorf("valid: %+v", v)
	}

	bad := config.Example()
	bad.Server.Port = 6443
	bad.Nodes = append(bad.Nodes[:1], bad.Nodes[2:]...) // two control planes: a warning
	out, _, err = runCLI("config", "validate", "--offline", "-o", "json", writeConfig(t, bad))
	v = validateJSON{}
	if err == nil || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("invalid: %v, output %q", err, out)
	}
	if v.Valid || len(v.Errors) != 1 || v.Errors[0].Path != "server.port" || v.Errors[0].Line == 0 || !strings.Contains(v.Errors[0].Msg, "kube-apiserver") {
		t.Errorf("invalid: %+v", v)
	}
	if len(v.Warnings) != 1 || v.Warnings[0].Path != "nodes" {
		t.Errorf("warnings: %+v", v.Warnings)
	}

	out, _, err = runCLI("config", "validate", "-o", "json", "/nonexistent/bootstrap.yaml")
	v = validateJSON{}
	if err == nil || json.Unmarshal([]byte(out), &v) != nil || v.Valid || len(v.Errors) != 1 || !strings.Contains(v.Errors[0].Msg, "no such file") {
		t.Errorf("unreadable: %v, %+v, output %q", err, v, out)
	}
}

// TestStatusMissingStateDir: the status of a state directory that does not exist is an error, not a
// table of pending nodes.
func TestStatusMissingStateDir(t *testing.T) {
	c := config.Example()
	c.StateDir = filepath.Join(t.TempDir(), "nope")
	path := writeConfig(t, c)
	for _, args := range [][]string{{"status", "-c", path}, {"status", "-c", path, "-s", filepath.Join(t.TempDir(), "other")}} {
		out, _, err := runCLI(args...)
		if err == nil || !strings.Contains(err.Error(), "does not exist") || out != "" {
			t.Errorf("%q: %v, output %q", args, err, out)
		}
	}
}

// walk calls f for every command of the tree under c.
func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, s := range c.Commands() {
		walk(s, f)
	}
}

// TestFlagUsages: every flag's help renders as written (pflag takes a `backquoted` word of the usage
// for the value's placeholder), and flags of the same name have the same shorthand on every command.
func TestFlagUsages(t *testing.T) {
	shorthands := map[string]string{"config": "c", "state-dir": "s", "output": "o", "verbose": "v"}
	root := newRootCommand()
	walk(root, func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backquote, which pflag renders as the placeholder", c.CommandPath(), f.Name, f.Usage)
			}
			if want, ok := shorthands[f.Name]; ok && f.Shorthand != want {
				t.Errorf("%s --%s: shorthand %q, want -%s as on every other command", c.CommandPath(), f.Name, f.Shorthand, want)
			}
		})
	})
}

// TestBootstrapTimeoutsPositive: a zero or negative --converge-timeout or --callback-timeout is
// refused before anything runs (no state directory is made), naming the flag and what to give.
//
// appliance handoff runs the same phases with its own flags (--timeout for the waits): its refusal
// names that flag, and with no flag given it is not refused (its defaults are positive: a handoff
// whose unset callback timeout read as zero was refused at once, which the e2e hand-off caught).
func TestBootstrapTimeoutsPositive(t *testing.T) {
	path := writeConfig(t, config.Example())
	for _, c := range []struct{ cmd, flag string }{
		{"bootstrap", "--converge-timeout"}, {"bootstrap", "--callback-timeout"},
		{"handoff", "--timeout"}, {"handoff", "--callback-timeout"},
	} {
		state := filepath.Join(t.TempDir(), "state")
		_, _, err := runCLI(c.cmd, "--config", path, "--state-dir", state, c.flag, "-1m")
		if err == nil || !strings.Contains(err.Error(), c.flag+" -1m0s: give a positive duration") {
			t.Errorf("%s %s -1m: %v", c.cmd, c.flag, err)
		}
		if _, err := os.Stat(state); err == nil {
			t.Errorf("%s %s -1m made the state directory", c.cmd, c.flag)
		}
	}
	// With the default timeouts both go on to the load phase (which refuses the example's missing files).
	for _, cmd := range []string{"bootstrap", "handoff"} {
		state := filepath.Join(t.TempDir(), "state")
		_, _, err := runCLI(cmd, "--config", path, "--state-dir", state, "--dry-run")
		if err == nil || !strings.Contains(err.Error(), "phase load:") {
			t.Errorf("appliance %s with its default timeouts: %v, want the load phase's refusal of the example's missing files", cmd, err)
		}
	}
}
