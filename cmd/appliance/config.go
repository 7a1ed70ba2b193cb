package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/strictyaml"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
)

func newConfigCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Validate a BootstrapConfiguration or print the defaulted example",
	}
	cmd.AddCommand(newConfigValidateCommand(g), newConfigDefaultsCommand())
	return cmd
}

// validateResult is the `config validate -o json` document.
type validateResult struct {
	File  string `json:"file"`
	Valid bool   `json:"valid"`
	// ClusterName and the node counts are set when Valid.
	ClusterName       string `json:"clusterName,omitempty"`
	ControlPlaneNodes int    `json:"controlPlaneNodes"`
	WorkerNodes       int    `json:"workerNodes"`
	// NetworkBoot says what network boot serve runs (config.BootstrapConfiguration.BootSummary).
	NetworkBoot string `json:"networkBoot,omitempty"`
	// Warnings and Errors are never null: each {"path", "line", "message"}; a file that cannot be
	// read is one error without a path.
	Warnings []*config.FieldError `json:"warnings"`
	Errors   []*config.FieldError `json:"errors"`
}

func newConfigValidateCommand(g *globalFlags) *cobra.Command {
	var offline bool
	cmd := &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check bootstrap.yaml files: every error at once, each with its field path; warn when two of them collide on one segment (a JSON document with -o json)",
		Long: `Check each BootstrapConfiguration: every error at once, each with its field path and line.

Given several files, also warn (without failing) when two clusters would collide on one network: the same
apiServer.vip, or the same apiServer.keepalived.virtualRouterID with overlapping control-plane CIDRs (the
same L2 segment). Each warning names both files and fields.

With -o json, one file prints one {file, valid, clusterName, controlPlaneNodes, workerNodes, warnings,
errors} document; several files print a JSON array of them.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			results := make([]validateResult, len(args))
			cfgs := make([]*config.BootstrapConfiguration, len(args))
			errs := make([]error, len(args))
			for i, file := range args {
				var warnings []*config.FieldError
				cfgs[i], warnings, errs[i] = config.Load(file, config.ValidateOptions{CheckFiles: !offline})
				results[i] = newValidateResult(file, cfgs[i], warnings, errs[i])
			}
			for _, c := range collisions(args, cfgs) {
				results[c.i].Warnings = append(results[c.i].Warnings, c.w[0])
				results[c.j].Warnings = append(results[c.j].Warnings, c.w[1])
			}
			if g.output == outputJSON {
				return printValidateJSON(cmd, results)
			}
			var invalid []string
			for i, file := range args {
				for _, w := range results[i].Warnings {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s%s\n", prefix(len(args), file), w)
				}
				if errs[i] != nil {
					if len(args) == 1 {
						return fmt.Errorf("%s is not valid:\n%w", file, errs[i])
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "%s is not valid:\n%v\n", file, errs[i])
					invalid = append(invalid, file)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s is valid: cluster %q, %d control-plane and %d worker nodes\n",
					file, cfgs[i].ClusterName, len(cfgs[i].ControlPlaneNodes()), len(cfgs[i].WorkerNodes()))
				fmt.Fprintf(cmd.OutOrStdout(), "  network boot: %s\n", cfgs[i].BootSummary())
			}
			if len(invalid) > 0 {
				return fmt.Errorf("%d of %d files are not valid: %s", len(invalid), len(args), strings.Join(invalid, ", "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&offline, "offline", false, "do not check that referenced files (bundle, credentials, snippets) exist")
	return cmd
}

func prefix(n int, file string) string {
	if n == 1 {
		return ""
	}
	return file + ": "
}

// newValidateResult is config.Load's result for one file as a validateResult.
func newValidateResult(file string, cfg *config.BootstrapConfiguration, warnings []*config.FieldError, err error) validateResult {
	r := validateResult{File: file, Valid: err == nil, Warnings: warnings, Errors: []*config.FieldError{}}
	if r.Warnings == nil {
		r.Warnings = []*config.FieldError{}
	}
	var list config.ErrorList
	switch {
	case errors.As(err, &list):
		r.Errors = list
	case err != nil:
		r.Errors = []*config.FieldError{{Msg: err.Error()}}
	default:
		r.ClusterName, r.ControlPlaneNodes, r.WorkerNodes = cfg.ClusterName, len(cfg.ControlPlaneNodes()), len(cfg.WorkerNodes())
		r.NetworkBoot = cfg.BootSummary()
	}
	return r
}

// printValidateJSON prints the results on stdout (one document for one file, an array for several)
// and returns an error (for the exit status) when a file is not valid.
func printValidateJSON(cmd *cobra.Command, results []validateResult) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	var werr error
	if len(results) == 1 {
		werr = enc.Encode(results[0])
	} else {
		werr = enc.Encode(results)
	}
	if werr != nil {
		return werr
	}
	var bad []string
	n := 0
	for _, r := range results {
		if !r.Valid {
			bad = append(bad, r.File)
			n += len(r.Errors)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s is not valid: %d errors (listed in the JSON output)", strings.Join(bad, ", "), n)
	}
	return nil
}

// collision is a warning for files[i] (w[0]) and one for files[j] (w[1]).
type collision struct {
	i, j int
	w    [2]*config.FieldError
}

// collisions returns, for every pair of valid configurations files[i] and files[j] (i < j) that would
// collide on one network, a warning for each of them naming the other file: the same apiServer.vip
// (both clusters would answer ARP for it), or the same apiServer.keepalived.virtualRouterID with
// overlapping control-plane CIDRs (one L2 segment: each cluster's keepalived would take the other's
// advertisements for its own group). Clusters without keepalived are left out.
func collisions(files []string, cfgs []*config.BootstrapConfiguration) []collision {
	lines := make([]strictyaml.Lines, len(files))
	for i, c := range cfgs {
		if c != nil {
			lines[i] = fieldLines(files[i])
		}
	}
	// warn makes the pair of warnings; format's first verb receives the other file's reference.
	warn := func(i, j int, path, format string, a ...any) [2]*config.FieldError {
		var w [2]*config.FieldError
		for k, pair := range [2][2]int{{i, j}, {j, i}} {
			me, other := pair[0], pair[1]
			ref := fmt.Sprintf("%s (cluster %q, %s", files[other], cfgs[other].ClusterName, path)
			switch l, ok := lines[other][path]; {
			case ok:
				ref += fmt.Sprintf(" at line %d", l)
			case path == vipcheck.FieldVRID && cfgs[other].VirtualRouterIDDerived():
				ref += " derived by default"
			}
			ref += ")"
			w[k] = &config.FieldError{Path: path, Line: lines[me].Line(path), Msg: fmt.Sprintf(format, append([]any{ref}, a...)...)}
		}
		return w
	}
	var out []collision
	for i := range cfgs {
		for j := i + 1; j < len(cfgs); j++ {
			a, b := cfgs[i], cfgs[j]
			if a == nil || b == nil || !a.APIServer.Keepalived.IsEnabled() || !b.APIServer.Keepalived.IsEnabled() {
				continue
			}
			if a.APIServer.VIP.IsValid() && a.APIServer.VIP == b.APIServer.VIP {
				out = append(out, collision{i, j, warn(i, j, vipcheck.FieldVIP,
					"%s has the same VIP %s: both clusters would answer ARP for it; give one of them another apiServer.vip",
					a.APIServer.VIP)})
			}
			if a.APIServer.Keepalived.VirtualRouterID != b.APIServer.Keepalived.VirtualRouterID {
				continue
			}
			if pa, pb, ok := overlap(a.Networks.ControlPlane.CIDRs, b.Networks.ControlPlane.CIDRs); ok {
				out = append(out, collision{i, j, warn(i, j, vipcheck.FieldVRID,
					"%s has the same VRRP virtual router ID %d and an overlapping control-plane network (%s and %s: one L2 segment); set apiServer.keepalived.virtualRouterID explicitly in one of them to a VRID the other does not use",
					a.APIServer.Keepalived.VirtualRouterID, pa, pb)})
			}
		}
	}
	return out
}

// overlap returns the first pair of overlapping prefixes of a and b.
func overlap(a, b []netip.Prefix) (netip.Prefix, netip.Prefix, bool) {
	for _, p := range a {
		for _, q := range b {
			if p.Overlaps(q) {
				return p, q, true
			}
		}
	}
	return netip.Prefix{}, netip.Prefix{}, false
}

// fieldLines maps the field paths of the configuration file to their lines (nil when the file cannot
// be read again), for warnings that config.Load does not make itself.
func fieldLines(file string) strictyaml.Lines {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	dec := &strictyaml.Decoder{APIVersion: config.APIVersion, Kind: config.Kind, Empty: "empty"}
	return dec.Decode(b, &config.BootstrapConfiguration{}).Lines
}

func newConfigDefaultsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "defaults",
		Short: "Print a complete example BootstrapConfiguration with every default filled in",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := config.Marshal(config.Example())
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
}
