package power

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// DefaultTimeout bounds one BMC operation (one ipmitool run or one Redfish exchange) and one SSH
// dial plus handshake when the caller gives none.
const DefaultTimeout = 20 * time.Second

// New builds the Controller for a node from its (defaulted, validated) power configuration: it
// reads the password, private key and CA files the configuration names, and parses the pinned host
// key. It does not contact the node: the first operation does. Errors name the node, the field and
// what to fix; secrets never appear in them or in log lines.
func New(ctx context.Context, n config.Node, log *slog.Logger) (Controller, error) {
	_ = ctx // construction is local; kept for symmetry with the backends and future discovery
	log = orDiscard(log).With("node", n.Name, "kind", string(n.Power.Kind))
	p := n.Power
	switch p.Kind {
	case config.PowerIPMI, config.PowerRedfish:
		pass, err := readSecret(n.Name, "passwordFile", p.PasswordFile)
		if err != nil {
			return nil, err
		}
		o := BMCOptions{
			Kind:               string(p.Kind),
			Username:           p.Username,
			Password:           string(pass),
			InsecureSkipVerify: p.InsecureSkipVerify,
			Timeout:            DefaultTimeout,
			Log:                log,
		}
		if p.Kind == config.PowerIPMI {
			o.Host, o.Port, err = splitHostPort(p.Address, 623)
		} else {
			o.Host, o.Port, err = splitRedfishURL(p.Address)
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: power.address %q: %w", n.Name, p.Address, err)
		}
		if p.CAFile != "" {
			if o.CAPEM, err = os.ReadFile(p.CAFile); err != nil {
				return nil, fmt.Errorf("node %s: power.caFile: %w", n.Name, err)
			}
		}
		return NewBMC(ctx, o)
	case config.PowerSSH:
		o, err := SSHOptionsFor(n, log)
		if err != nil {
			return nil, err
		}
		return NewSSHController(o)
	default:
		return nil, fmt.Errorf("node %s: power.kind %q: %w (use ssh, ipmi or redfish)", n.Name, p.Kind, ErrUnsupported)
	}
}

// SSHOptionsFor builds the SSH options of a node whose power kind is ssh: the private key read from
// power.privateKeyFile, the pinned host key (power.hostKey) or known_hosts file, user (default root)
// and address (default port 22). Provisioning dials with it (DialSSH) to install hostagent.
func SSHOptionsFor(n config.Node, log *slog.Logger) (SSHOptions, error) {
	p := n.Power
	key, err := readSecret(n.Name, "privateKeyFile", p.PrivateKeyFile)
	if err != nil {
		return SSHOptions{}, err
	}
	o := SSHOptions{
		Address:          p.Address,
		User:             p.Username,
		PrivateKey:       key,
		KnownHostsFile:   p.KnownHostsFile,
		HandshakeTimeout: DefaultTimeout,
		Log:              orDiscard(log).With("node", n.Name),
	}
	if o.User == "" {
		o.User = "root"
	}
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		o.Address = net.JoinHostPort(o.Address, "22")
	}
	if p.HostKey != "" {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(p.HostKey))
		if err != nil {
			return SSHOptions{}, fmt.Errorf("node %s: power.hostKey is not an authorized_keys line (\"ssh-ed25519 AAAA...\"): %w", n.Name, err)
		}
		o.HostKeys = []ssh.PublicKey{k}
	}
	return o, nil
}

func readSecret(node, field, path string) ([]byte, error) {
	if path == "" {
		return nil, fmt.Errorf("node %s: power.%s is empty: name the file holding the secret", node, field)
	}
	b, err := config.ReadSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("node %s: power.%s: %w", node, field, err)
	}
	return b, nil
}

// splitHostPort splits "host" or "host:port" ("[v6]:port"), defaulting the port.
func splitHostPort(addr string, def int) (string, int, error) {
	if addr == "" {
		return "", 0, fmt.Errorf("is empty: give the BMC's host or host:port")
	}
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, def, nil //nolint:nilerr // no port: the whole string is the host
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not 1-65535", ps)
	}
	return host, port, nil
}

// splitRedfishURL takes "https://host[:port][/...]" and returns host and port (default 443).
func splitRedfishURL(raw string) (string, int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0, err
	}
	if u.Scheme != "https" || u.Hostname() == "" {
		return "", 0, fmt.Errorf("is not an https:// URL with a host (Redfish is HTTPS only)")
	}
	port := 443
	if ps := u.Port(); ps != "" {
		if port, err = strconv.Atoi(ps); err != nil || port < 1 || port > 65535 {
			return "", 0, fmt.Errorf("port %q is not 1-65535", ps)
		}
	}
	return u.Hostname(), port, nil
}
