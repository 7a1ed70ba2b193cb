// Package power turns nodes on and off: through their BMC (IPMI v2.0 over RMCP+ via ipmitool, or DMTF
// Redfish over HTTPS), both driven by bmclib v2, or, for hosts already running an OS, over SSH with a
// pinned host key.
//
// It is the only package that imports bmclib. Every backend implements Controller; New builds the
// right one from a node's Target; PowerOnAll fans PowerOn out over many nodes with bounded
// concurrency and per-node retries. The Redfish Controller also implements VirtualMediaBooter: the
// BMC inserts an ISO it fetches itself and the node boots it once (vmedia.go).
//
// Errors wrap one of the sentinels below when the cause is known, so callers can test them with
// errors.Is. Secrets (BMC passwords, private keys) are never logged and never appear in errors.
package power

import (
	"context"
	"errors"
	"log/slog"
	"strings"
)

// State is a node's power state, normalised across backends.
type State string

const (
	// StateOn: the chassis is powered (IPMI "Chassis Power is on", Redfish "On"), or for SSH the
	// host's sshd answers.
	StateOn State = "on"
	// StateOff: the chassis is off (IPMI "Chassis Power is off", Redfish "Off"), or for SSH the
	// host refuses or does not answer connections.
	StateOff State = "off"
	// StateUnknown: the state could not be read, or is transitional (Redfish "PoweringOn",
	// "PoweringOff", "Paused").
	StateUnknown State = "unknown"
)

// ParseState normalises a backend's power-state text: ipmitool's "Chassis Power is off", Redfish's
// PowerState values ("On", "Off", "PoweringOn", ...), bmclib's lower-case "on"/"off". Case and
// surrounding space are ignored; anything else is StateUnknown.
func ParseState(s string) State {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "chassis power is ")
	switch strings.TrimSpace(s) {
	case "on":
		return StateOn
	case "off":
		return StateOff
	default:
		return StateUnknown
	}
}

// BootDevice is the boot override a BMC applies at the next boot (or every boot, when persistent).
type BootDevice string

const (
	// BootDisk boots from the local disk (IPMI "disk"/hard drive, Redfish "Hdd").
	BootDisk BootDevice = "disk"
	// BootPXE boots from the network (IPMI "pxe", Redfish "Pxe").
	BootPXE BootDevice = "pxe"
	// BootCDROM boots from (virtual) optical media (IPMI "cdrom", Redfish "Cd").
	BootCDROM BootDevice = "cdrom"
)

func (d BootDevice) valid() bool { return d == BootDisk || d == BootPXE || d == BootCDROM }

// Sentinel errors. Returned errors wrap them (errors.Is) together with the underlying cause.
var (
	// ErrUnsupported: the backend cannot do this (SetBootDevice over SSH, an unknown power kind).
	ErrUnsupported = errors.New("not supported by this power backend")
	// ErrAuth: the peer answered but refused the credentials (BMC user/password, SSH key).
	ErrAuth = errors.New("authentication failed")
	// ErrUnreachable: nothing answered at the address (connection refused, timeout, no route).
	ErrUnreachable = errors.New("unreachable")
	// ErrHostKeyUnknown: the SSH host presented a key that is neither pinned nor in known_hosts.
	ErrHostKeyUnknown = errors.New("SSH host key unknown")
	// ErrHostKeyMismatch: the SSH host presented a key different from the pinned/known one.
	ErrHostKeyMismatch = errors.New("SSH host key mismatch")
	// ErrCertificate: the Redfish BMC's TLS certificate does not chain to the configured CA (or
	// names another host).
	ErrCertificate = errors.New("BMC TLS certificate not trusted")
	// ErrBootDeviceNotApplied: the BMC accepted a boot override but reading it back shows
	// something else (LAB.md: always read the override back).
	ErrBootDeviceNotApplied = errors.New("boot device override not applied")
	// ErrCommandFailed: the BMC accepted the session but answered the command (power, boot
	// device) with a failure; the error carries the BMC's own words.
	ErrCommandFailed = errors.New("BMC command failed")
)

// permanent reports whether retrying err cannot help: wrong credentials or keys, untrusted
// certificates, unsupported operations. PowerOnAll stops retrying a node on such errors.
func permanent(err error) bool {
	for _, s := range []error{ErrUnsupported, ErrAuth, ErrHostKeyUnknown, ErrHostKeyMismatch, ErrCertificate, ErrVirtualMediaUnsupported} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// Controller drives one node's power. Implementations are safe for concurrent use; each method
// honours ctx's deadline and cancellation.
type Controller interface {
	// PowerOn turns the node on; a node already on is left alone (nil). Over SSH it only checks
	// that sshd answers (the host is on if it does) and returns ErrUnreachable otherwise.
	PowerOn(ctx context.Context) error
	// PowerOff turns the node off hard (IPMI "chassis power off", Redfish ForceOff); over SSH it
	// runs `systemctl poweroff`. A node already off is left alone.
	PowerOff(ctx context.Context) error
	// PowerCycle restarts the node: on → hard cycle (IPMI "chassis power cycle": the BMC cuts
	// power and restores it after its own interval; Redfish ForceRestart; SSH `systemctl
	// reboot`); off → power on.
	PowerCycle(ctx context.Context) error
	// PowerState reads the power state. Over SSH: on if sshd answers, off on connection refused
	// or timeout; authentication and host-key failures are errors.
	PowerState(ctx context.Context) (State, error)
	// SetBootDevice sets the boot override (once, or every boot if persistent), then reads it
	// back and returns ErrBootDeviceNotApplied if the BMC reports another device. Over SSH it
	// returns ErrUnsupported.
	SetBootDevice(ctx context.Context, dev BootDevice, persistent bool) error
	// Close releases sessions and connections (Redfish logout). It is safe to call twice.
	Close() error
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
