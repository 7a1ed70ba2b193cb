package power

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"
)

// DefaultTimeout bounds one BMC operation (one ipmitool run or one Redfish exchange) and one SSH
// dial plus handshake when the caller gives none.
const DefaultTimeout = 20 * time.Second

// KindSSH is the Target.Kind of a host already running an OS, driven over SSH (KindIPMI and
// KindRedfish are the BMC kinds).
const KindSSH = "ssh"

// Target is one node as New sees it: where its power is controlled and the credentials to do it
// with, secrets already read by the caller (pkg/bootstrap.PowerTarget converts a node of the
// bootstrap configuration, reading the files that configuration names). Errors from New and
// SSHOptionsFor name the configuration fields ("power.address", "power.hostKey") the values come from.
type Target struct {
	// Name is the node's name (config nodes[].name); it prefixes errors and is logged as "node".
	Name string
	// Kind selects the backend: KindSSH, KindIPMI or KindRedfish (config power.kind). Anything
	// else makes New fail with ErrUnsupported.
	Kind string
	// Address (config power.address): ssh "host" or "host:port" (port 22 when absent); ipmi "host"
	// or "host:port" (UDP port 623 when absent); redfish an https:// URL, "https://host[:port][/...]"
	// (port 443 when absent).
	Address string
	// Username is the login (config power.username): for ssh the remote user ("root" when empty);
	// for ipmi and redfish the BMC user.
	Username string
	// Password is the BMC password (ipmi, redfish), read by the caller from config
	// power.passwordFile with one trailing "\n" or "\r\n" removed. Never logged, never in errors.
	Password string
	// PrivateKey is the SSH client key (ssh), PEM or OpenSSH format, unencrypted, read by the
	// caller from config power.privateKeyFile. Never logged, never in errors.
	PrivateKey []byte
	// HostKey pins the node's SSH host key (ssh), one authorized_keys line ("ssh-ed25519 AAAA...")
	// as in config power.hostKey; parsed by New. Empty → KnownHostsFile alone decides.
	HostKey string
	// KnownHostsFile is the path of an OpenSSH known_hosts file holding the node's host key (ssh;
	// config power.knownHostsFile), read at each dial. ssh needs HostKey or KnownHostsFile: there
	// is no trust on first use.
	KnownHostsFile string
	// CAPEM holds the PEM CA certificates the Redfish BMC's certificate must chain to (redfish),
	// read by the caller from config power.caFile. Empty → the system roots. Ignored for ipmi.
	CAPEM []byte
	// InsecureSkipVerify turns Redfish TLS verification off (config power.insecureSkipVerify;
	// a warning is logged).
	InsecureSkipVerify bool
}

// String names the target without its secrets ("node-0 ipmi 10.0.0.5:623"), so that printing a
// Target with %v or %+v never shows Password or PrivateKey.
func (t Target) String() string { return t.Name + " " + t.Kind + " " + t.Address }

// LogValue logs the target without its secrets.
func (t Target) LogValue() slog.Value {
	return slog.GroupValue(slog.String("node", t.Name), slog.String("kind", t.Kind), slog.String("address", t.Address))
}

// New builds the Controller for a node from its Target (converted from the defaulted, validated
// power configuration by the caller, secrets included): it parses the address and the pinned host
// key. It does not contact the node: the first operation does. Errors name the node, the
// configuration field and what to fix; secrets never appear in them or in log lines.
func New(ctx context.Context, t Target, log *slog.Logger) (Controller, error) {
	_ = ctx // construction is local; kept for symmetry with the backends and future discovery
	log = orDiscard(log).With("node", t.Name, "kind", t.Kind)
	switch t.Kind {
	case KindIPMI, KindRedfish:
		o := BMCOptions{
			Kind:               t.Kind,
			Username:           t.Username,
			Password:           t.Password,
			CAPEM:              t.CAPEM,
			InsecureSkipVerify: t.InsecureSkipVerify,
			Timeout:            DefaultTimeout,
			Log:                log,
		}
		var err error
		if t.Kind == KindIPMI {
			o.Host, o.Port, err = splitHostPort(t.Address, 623)
		} else {
			o.Host, o.Port, err = splitRedfishURL(t.Address)
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: power.address %q: %w", t.Name, t.Address, err)
		}
		return NewBMC(ctx, o)
	case KindSSH:
		o, err := SSHOptionsFor(t, log)
		if err != nil {
			return nil, err
		}
		return NewSSHController(o)
	default:
		return nil, fmt.Errorf("node %s: power.kind %q: %w (use ssh, ipmi or redfish)", t.Name, t.Kind, ErrUnsupported)
	}
}

// SSHOptionsFor builds the SSH options of a node whose power kind is ssh: its private key, the
// pinned host key (HostKey) or known_hosts file, user (default root) and address (default port
// 22). Provisioning dials with it (DialSSH) to install hostagent.
func SSHOptionsFor(t Target, log *slog.Logger) (SSHOptions, error) {
	o := SSHOptions{
		Address:          t.Address,
		User:             t.Username,
		PrivateKey:       t.PrivateKey,
		KnownHostsFile:   t.KnownHostsFile,
		HandshakeTimeout: DefaultTimeout,
		Log:              orDiscard(log).With("node", t.Name),
	}
	if o.User == "" {
		o.User = "root"
	}
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		o.Address = net.JoinHostPort(o.Address, "22")
	}
	if t.HostKey != "" {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(t.HostKey))
		if err != nil {
			return SSHOptions{}, fmt.Errorf("node %s: power.hostKey is not an authorized_keys line (\"ssh-ed25519 AAAA...\"): %w", t.Name, err)
		}
		o.HostKeys = []ssh.PublicKey{k}
	}
	return o, nil
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
