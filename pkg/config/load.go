package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"syscall"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds the configuration file Load reads (a real one is a few KiB).
const MaxFileSize = 4 << 20

// Load reads the file at path (a regular file: a FIFO, device or directory is refused before it is
// read, so that Load never blocks on one), strictly decodes it (Decode), applies SetDefaults and runs Validate.
// It returns the defaulted configuration and Validate's warnings. The error is either a read error
// (wrapping the *fs.PathError) or an ErrorList (errors.Is(err, ErrInvalid)) holding every decoding
// and validation problem at once, in document order; then the configuration is nil, and warnings
// found so far are still returned.
func Load(path string, opts ValidateOptions) (*BootstrapConfiguration, []*FieldError, error) {
	data, err := readRegularFile(path, MaxFileSize)
	switch {
	case errors.Is(err, errNotRegular), errors.Is(err, errTooLarge):
		return nil, nil, ErrorList{{Msg: fmt.Sprintf("%s %v: name the configuration file (bootstrap.yaml)", path, err)}}
	case err != nil:
		return nil, nil, fmt.Errorf("read configuration: %w", err)
	}
	c, warnings, errs := load(data, opts)
	if len(errs) > 0 {
		return nil, warnings, errs
	}
	return c, warnings, nil
}

var (
	errNotRegular = errors.New("is not a regular file")
	errTooLarge   = errors.New("is too large")
)

// readRegularFile reads the regular file name, at most limit bytes. Anything else is refused without
// reading from it: os.Stat first, then the file is opened with O_NONBLOCK (opening a FIFO without a
// writer would block) and checked again with fstat, so a file swapped for a FIFO or device between the
// two is refused too. Errors: errNotRegular and errTooLarge (wrapped with what the file is or its
// size), else the *fs.PathError of the open or read.
func readRegularFile(name string, limit int64) ([]byte, error) {
	st, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(st.Mode())
	}
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(st.Mode())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: larger than %d bytes", errTooLarge, limit)
	}
	return data, nil
}

// withName prefixes the file name to readRegularFile's own errors (its *fs.PathError errors carry it).
func withName(name string, err error) error {
	if errors.Is(err, errNotRegular) || errors.Is(err, errTooLarge) {
		return fmt.Errorf("%s %w", name, err)
	}
	return err
}

// notRegular says what a non-regular file is.
func notRegular(m fs.FileMode) error {
	what := "a special file"
	switch {
	case m.IsDir():
		what = "a directory"
	case m&fs.ModeNamedPipe != 0:
		what = "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		what = "a socket"
	case m&fs.ModeCharDevice != 0:
		what = "a character device"
	case m&fs.ModeDevice != 0:
		what = "a block device"
	}
	return fmt.Errorf("%w (it is %s)", errNotRegular, what)
}

// load is Load on bytes: decode, default, validate, and merge the errors. A validation error on a
// field whose value could not be decoded is dropped (the decode error already says what is wrong).
func load(data []byte, opts ValidateOptions) (*BootstrapConfiguration, []*FieldError, ErrorList) {
	c, r := decode(data)
	if c == nil {
		return nil, nil, r.Errors
	}
	SetDefaults(c)
	warnings, verrs := Validate(c, opts)
	return c, warnings, r.Merge(verrs)
}

// Marshal renders c as YAML: keys in the order of the struct fields, two-space indentation, empty
// optional fields left out, so the same configuration always renders to the same bytes and
// Decode(Marshal(c)) gives c back.
func Marshal(c *BootstrapConfiguration) ([]byte, error) {
	if c == nil {
		return nil, fmt.Errorf("marshal configuration: %w", ErrInvalid)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("marshal configuration: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("marshal configuration: %w", err)
	}
	return buf.Bytes(), nil
}

// Example returns a complete, defaulted configuration that passes Validate (without CheckFiles):
// three ssh-powered control planes, an IPMI worker and a Redfish worker on a lab network. `appliance
// config defaults` prints it.
func Example() *BootstrapConfiguration {
	sshPower := func() Power {
		return Power{
			Kind:           PowerSSH,
			PrivateKeyFile: "/etc/appliance/ssh/id_ed25519",
			KnownHostsFile: "/etc/appliance/ssh/known_hosts",
		}
	}
	cp := func(name, addr, wlAddr, mac string) Node {
		return Node{
			Name:      name,
			Roles:     []Role{RoleControlPlane},
			Addresses: []netip.Addr{netip.MustParseAddr(addr), netip.MustParseAddr(wlAddr)},
			MAC:       mac,
			Power:     sshPower(),
		}
	}
	c := &BootstrapConfiguration{
		ClusterName: "lab",
		Networks: Networks{
			ControlPlane:  NetworkPlane{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/24")}},
			WorkloadPlane: NetworkPlane{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")}},
			// DefaultServicesCIDR (10.96.0.0/12) spans 10.96.0.0-10.111.255.255 and so overlaps
			// 10.100.0.0/24: keep the kubeadm base address, narrow the range.
			Services: netip.MustParsePrefix("10.96.0.0/16"),
		},
		APIServer: APIServer{VIP: netip.MustParseAddr("10.100.0.100")},
		Bundle:    Bundle{Path: "/var/cache/appliance/bundle", PublicKeys: []string{"ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U="}},
		Server:    Server{Names: []string{"appliance.lab"}},
		Nodes: []Node{
			cp("cp1", "10.100.0.11", "10.200.0.11", "52:54:00:00:00:11"),
			cp("cp2", "10.100.0.12", "10.200.0.12", "52:54:00:00:00:12"),
			cp("cp3", "10.100.0.13", "10.200.0.13", "52:54:00:00:00:13"),
			{
				Name:      "w1",
				Roles:     []Role{RoleWorker},
				Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.21"), netip.MustParseAddr("10.200.0.21")},
				MAC:       "52:54:00:00:00:21",
				Power: Power{
					Kind:         PowerIPMI,
					Address:      "10.100.0.121",
					Username:     "admin",
					PasswordFile: "/etc/appliance/bmc/w1.password",
				},
			},
			{
				Name:      "w2",
				Roles:     []Role{RoleWorker},
				Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.22"), netip.MustParseAddr("10.200.0.22")},
				MAC:       "52:54:00:00:00:22",
				Power: Power{
					Kind:         PowerRedfish,
					Address:      "https://10.100.0.122",
					Username:     "admin",
					PasswordFile: "/etc/appliance/bmc/w2.password",
					CAFile:       "/etc/appliance/bmc/ca.pem",
				},
			},
		},
	}
	SetDefaults(c)
	return c
}
