package redfishbmc

import (
	"errors"
	"sync"
)

// Boot is what the machine's firmware boots at one start, as the BMC's override decides it
// (DSP2046 ComputerSystem.Boot): Target is a BootSourceOverrideTarget ("None": the machine's own
// order), UEFI the firmware (BootSourceOverrideMode UEFI) instead of legacy BIOS.
type Boot struct {
	Target string
	UEFI   bool
}

// Machine is the host a BMC drives. Implementations: powerOnly (no host: the power state alone, as
// sushy-tools' fake driver was) and qemuMachine (a real QEMU virtual machine over QMP).
type Machine interface {
	// PowerState is "On" or "Off" (DSP2046 PowerState).
	PowerState() string
	// Reset carries out a ComputerSystem.Reset ResetType the profile offers; nextBoot is called at
	// every start of the host (power-on, restart, and a cold restart after a guest reset) for the
	// boot override then in force.
	Reset(resetType string) error
	// SetMedia attaches the image file at path as the CD ("" ejects it), also while the host runs.
	SetMedia(path string) error
	// Close powers the host off and releases it.
	Close() error
}

// errResetRefused is a ResetType the host's state refuses (e.g. GracefulShutdown while off).
var errResetRefused = errors.New("refused in the present power state")

// powerOnly is a BMC without a host: the power state changes at once, and each power-on consumes the
// boot override as a real one would.
type powerOnly struct {
	mu       sync.Mutex
	on       bool
	nextBoot func() Boot
}

func (m *powerOnly) PowerState() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		return "On"
	}
	return "Off"
}

func (m *powerOnly) Reset(rt string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch rt {
	case "On", "ForceOn":
		if !m.on {
			m.on = true
			m.nextBoot()
		}
	case "ForceOff", "GracefulShutdown":
		m.on = false
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		if !m.on && rt != "PowerCycle" {
			return errResetRefused
		}
		m.on = true
		m.nextBoot()
	case "PushPowerButton":
		m.on = !m.on
		if m.on {
			m.nextBoot()
		}
	case "Nmi":
		if !m.on {
			return errResetRefused
		}
	}
	return nil
}

// SetMedia has nothing to attach the image to: the slot's state is the Server's.
func (m *powerOnly) SetMedia(string) error { return nil }

func (m *powerOnly) Close() error { return nil }
