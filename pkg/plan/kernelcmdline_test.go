package plan

import (
	"strings"
	"testing"
)

// TestKernelCmdlineCarriesNoSecret: the kernel command line rendered for a BMC-booted node holds the
// appliance URL and the CA pin and nothing secret (issue 12 item 5): not the node's token, no
// Ignition URL (which used to carry ?token=), no argument whose key looks like a secret.
func TestKernelCmdlineCarriesNoSecret(t *testing.T) {
	in := labInputs(t)
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	bmc := 0
	for _, n := range p.Nodes {
		if n.KernelCmdline == nil {
			continue
		}
		bmc++
		line := string(n.KernelCmdline)
		if tok := in.Tokens[n.Name]; tok == "" || strings.Contains(line, tok) {
			t.Errorf("%s: the kernel command line carries the node token (or the fixture has none): %q", n.Name, line)
		}
		args := strings.Fields(line)
		if len(args) != 2 || !strings.HasPrefix(args[0], "appliance.url=https://") || !strings.HasPrefix(args[1], "appliance.ca_pin=sha256:") {
			t.Errorf("%s: kernel command line %q, want appliance.url= and appliance.ca_pin= only", n.Name, line)
		}
		for _, bad := range []string{"token", "ignition.config.url", "secret", "passw"} {
			if strings.Contains(strings.ToLower(line), bad) {
				t.Errorf("%s: kernel command line has %q: %q", n.Name, bad, line)
			}
		}
	}
	if bmc == 0 {
		t.Fatal("the lab plan has no BMC-booted node: nothing was checked")
	}
}
