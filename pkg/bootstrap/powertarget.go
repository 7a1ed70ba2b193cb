package bootstrap

import (
	"fmt"
	"os"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/power"
)

// PowerTarget converts a node of the (defaulted, validated) configuration to the power.Target that
// power.New and power.SSHOptionsFor take, reading the files its power section names: for ipmi and
// redfish the password (power.passwordFile, required; one trailing "\n" or "\r\n" removed) and the CA
// bundle (power.caFile, when set); for ssh the private key (power.privateKeyFile, required). The
// host key and known_hosts path are passed on as they are (pkg/power parses the one and reads the
// other at each dial). A kind other than ssh, ipmi or redfish reads nothing: power.New rejects it.
// Errors name the node and the config field; secrets never appear in them.
func PowerTarget(n config.Node) (power.Target, error) {
	p := n.Power
	t := power.Target{
		Name:               n.Name,
		Kind:               string(p.Kind),
		Address:            p.Address,
		Username:           p.Username,
		HostKey:            p.HostKey,
		KnownHostsFile:     p.KnownHostsFile,
		InsecureSkipVerify: p.InsecureSkipVerify,
	}
	switch p.Kind {
	case config.PowerIPMI, config.PowerRedfish:
		pass, err := readPowerSecret(n.Name, "passwordFile", p.PasswordFile)
		if err != nil {
			return power.Target{}, err
		}
		t.Password = string(pass)
		if p.CAFile != "" {
			if t.CAPEM, err = os.ReadFile(p.CAFile); err != nil {
				return power.Target{}, fmt.Errorf("node %s: power.caFile: %w", n.Name, err)
			}
		}
	case config.PowerSSH:
		key, err := readPowerSecret(n.Name, "privateKeyFile", p.PrivateKeyFile)
		if err != nil {
			return power.Target{}, err
		}
		t.PrivateKey = key
	}
	return t, nil
}

// readPowerSecret reads the secret file named by the node's power.<field>.
func readPowerSecret(node, field, path string) ([]byte, error) {
	if path == "" {
		return nil, fmt.Errorf("node %s: power.%s is empty: name the file holding the secret", node, field)
	}
	b, err := config.ReadSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("node %s: power.%s: %w", node, field, err)
	}
	return b, nil
}
