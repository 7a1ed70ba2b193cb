package power

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/crypto/ssh"
)

// Commands the SSH controller runs on the node (systemd hosts).
const (
	sshPowerOffCommand = "systemctl poweroff"
	sshRebootCommand   = "systemctl reboot"
)

// sshController is the Controller for pre-installed hosts reached over SSH: there is no BMC, so
// "on" means "sshd answers".
type sshController struct{ o SSHOptions }

// NewSSHController returns the Controller for a pre-installed host reached over SSH (see
// Controller for what each method means there). It checks the options and does not connect.
func NewSSHController(o SSHOptions) (Controller, error) {
	if o.User == "" {
		return nil, fmt.Errorf("SSH %s: user is empty", o.Address)
	}
	if len(o.HostKeys) == 0 && o.KnownHostsFile == "" {
		return nil, fmt.Errorf("SSH %s: no host key pinned: set power.hostKey or power.knownHostsFile (there is no trust on first use)", o.Address)
	}
	return &sshController{o: o}, nil
}

// PowerOn succeeds if the host's sshd answers and accepts the key; ErrUnreachable otherwise (a
// host without a BMC cannot be switched on remotely; PowerOnAll's retries wait for it to boot).
func (s *sshController) PowerOn(ctx context.Context) error {
	c, err := DialSSH(ctx, s.o)
	if err != nil {
		if errors.Is(err, ErrUnreachable) {
			return fmt.Errorf("power on: host has no BMC and is not answering SSH; switch it on by hand: %w", err)
		}
		return fmt.Errorf("power on: %w", err)
	}
	return c.Close()
}

func (s *sshController) PowerOff(ctx context.Context) error {
	return s.runDetached(ctx, "power off", sshPowerOffCommand)
}

func (s *sshController) PowerCycle(ctx context.Context) error {
	return s.runDetached(ctx, "power cycle", sshRebootCommand)
}

// runDetached runs a command that takes the host (and so the connection) down: a dropped
// connection without exit status counts as success; a non-zero exit does not.
func (s *sshController) runDetached(ctx context.Context, op, cmd string) error {
	c, err := DialSSH(ctx, s.o)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer c.Close()
	_, stderr, code, err := c.Run(ctx, cmd, nil)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if errors.Is(err, io.EOF) || isExitMissing(err) {
			return nil // the host went down before reporting
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if code != 0 {
		return fmt.Errorf("%s: %q exited %d on %s: %s", op, cmd, code, s.o.Address, bytes.TrimSpace(stderr))
	}
	return nil
}

// PowerState is on when sshd answers and accepts the key, off when the connection is refused or
// times out; auth and host-key failures return StateUnknown and the error.
func (s *sshController) PowerState(ctx context.Context) (State, error) {
	c, err := DialSSH(ctx, s.o)
	if err != nil {
		if errors.Is(err, ErrUnreachable) {
			return StateOff, nil
		}
		return StateUnknown, fmt.Errorf("power status: %w", err)
	}
	_ = c.Close()
	return StateOn, nil
}

func (s *sshController) SetBootDevice(context.Context, BootDevice, bool) error {
	return fmt.Errorf("set boot device over SSH: %w (a pre-installed host boots from its disk; use a BMC kind to PXE-boot)", ErrUnsupported)
}

func (s *sshController) Close() error { return nil }

func isExitMissing(err error) bool {
	var em *ssh.ExitMissingError
	return errors.As(err, &em)
}
