package redfishbmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/airgap-appliance/appliance/test/labns"
)

// QEMUConfig is the host a BMC drives: a QEMU virtual machine (TCG: "-enable-kvm hangs here",
// LAB.md), powered off until the BMC powers it on. Power-on starts QEMU with the boot override then
// in force; power-off ends it, as pulling the power does. A guest reset (the machine rebooting
// itself) ends QEMU too (-no-reboot) and the BMC starts it again at once, reading the boot override
// and the inserted media anew, as a real machine's firmware does at every reset.
type QEMUConfig struct {
	// Binary is qemu-system-x86_64's path.
	Binary string
	// MemoryMiB is the machine's memory in MiB.
	MemoryMiB int
	// UUID is the SMBIOS system UUID (/sys/class/dmi/id/product_uuid in the guest).
	UUID string
	// MAC is the NIC's MAC address ("" : QEMU's default).
	MAC string
	// Disks are raw disk images, attached in this order as virtio disks with their serials (what
	// root-device hints match).
	Disks []DiskConfig
	// TAP is the tap interface the NIC uses (made beforehand, in the BMC's namespace); "" gives it
	// QEMU's user-mode network instead.
	TAP string
	// Console is the serial console's (ttyS0) log, appended to across starts.
	Console string
	// Events is the machine's lifecycle log, one line per event: "UNIXNANOS EVENT", EVENT one of
	// "started", "stopped", "reset" (the guest reset itself), "restarted from its definition".
	Events string
	// NetNS, when set, is the network namespace QEMU runs in (`ip netns exec`), when it is not the
	// BMC's own: user-mode networking then reaches that namespace's loopback as 10.0.2.2.
	NetNS string
	// RunDir holds the QMP sockets, QEMU's own log (qemu.log) and the UEFI variable store.
	RunDir string
	// OVMFCode and OVMFVars are the UEFI firmware and its variable template, for boots with
	// BootSourceOverrideMode UEFI; empty: the machine has legacy BIOS (SeaBIOS) only.
	OVMFCode, OVMFVars string
}

// DiskConfig is one disk of QEMUConfig.
type DiskConfig struct {
	Path, Serial string
}

// qemuMachine implements Machine with QEMU, driven over QMP (go-qemu's qmp package).
type qemuMachine struct {
	cfg      QEMUConfig
	nextBoot func() Boot

	mu    sync.Mutex
	run   *qemuRun // nil: powered off
	media string   // the CD's image file, "" when empty
	n     int      // starts so far (QMP socket names)
}

// qemuRun is one QEMU process: one power-on until QEMU exits.
type qemuRun struct {
	cmd      *exec.Cmd
	mon      *qmp.SocketMonitor
	exited   chan struct{}
	events   chan struct{} // closed when the QMP event stream has ended
	stopping bool          // the BMC ended it (power off): no restart
	// reason is the last SHUTDOWN event's reason (QMP), e.g. "guest-reset": written by the event
	// reader, read once the stream has ended (events closed).
	reason string
}

func newQEMU(cfg QEMUConfig, nextBoot func() Boot) (*qemuMachine, error) {
	for _, p := range append([]string{cfg.Console, cfg.RunDir}, diskPaths(cfg.Disks)...) {
		if strings.Contains(p, ",") {
			return nil, fmt.Errorf("%s: QEMU's option syntax cannot take a path with a comma", p)
		}
	}
	if cfg.Binary == "" || cfg.MemoryMiB <= 0 || cfg.RunDir == "" {
		return nil, errors.New("qemu: binary, memoryMiB and runDir are required")
	}
	return &qemuMachine{cfg: cfg, nextBoot: nextBoot}, nil
}

func diskPaths(ds []DiskConfig) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Path)
	}
	return out
}

func (m *qemuMachine) note(what string) {
	if m.cfg.Events == "" {
		return
	}
	f, err := os.OpenFile(m.cfg.Events, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%d %s\n", time.Now().UnixNano(), what)
	_ = f.Close()
}

func (m *qemuMachine) PowerState() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.run != nil {
		return "On"
	}
	return "Off"
}

func (m *qemuMachine) Reset(rt string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch rt {
	case "On", "ForceOn":
		if m.run == nil {
			return m.startLocked()
		}
	case "ForceOff":
		m.stopLocked()
	case "GracefulShutdown":
		if m.run == nil {
			return nil
		}
		// ACPI power button: the guest shuts down and QEMU exits (SHUTDOWN guest-shutdown), or it
		// ignores the button and stays on, as a real machine does.
		return m.qmpLocked("system_powerdown", nil)
	case "PushPowerButton":
		if m.run == nil {
			return m.startLocked()
		}
		return m.qmpLocked("system_powerdown", nil)
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		// A restart is a cold one: the firmware starts again and reads the boot override.
		if m.run == nil && rt != "PowerCycle" {
			return errResetRefused
		}
		m.stopLocked()
		return m.startLocked()
	case "Nmi":
		if m.run == nil {
			return errResetRefused
		}
		return m.qmpLocked("inject-nmi", nil)
	default:
		return fmt.Errorf("ResetType %s: not implemented by the QEMU host", rt)
	}
	return nil
}

func (m *qemuMachine) SetMedia(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if strings.Contains(path, ",") {
		return fmt.Errorf("%s: QEMU's option syntax cannot take a path with a comma", path)
	}
	m.media = path
	if m.run == nil {
		return nil // read at the next start
	}
	if path == "" {
		// force: the guest may have locked the tray (a mounted CD).
		return m.qmpLocked("eject", map[string]any{"id": "cdrom0", "force": true})
	}
	return m.qmpLocked("blockdev-change-medium", map[string]any{"id": "cdrom0", "filename": path, "format": "raw", "read-only-mode": "read-only"})
}

func (m *qemuMachine) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopLocked()
	return nil
}

func (m *qemuMachine) qmpLocked(cmd string, args any) error {
	b, err := json.Marshal(qmp.Command{Execute: cmd, Args: args})
	if err != nil {
		return err
	}
	if _, err := m.run.mon.Run(b); err != nil {
		return fmt.Errorf("QMP %s: %w", cmd, err)
	}
	return nil
}

// argv is QEMU's command line for one start with boot b.
func (m *qemuMachine) argv(b Boot, qmpSock string) ([]string, error) {
	c := m.cfg
	a := []string{"-name", "redfish-bmc-host", "-accel", "tcg", "-cpu", "qemu64,+rdrand", "-machine", "pc",
		"-m", strconv.Itoa(c.MemoryMiB), "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot", "-qmp", "unix:" + qmpSock + ",server=on,wait=off"}
	if c.UUID != "" {
		a = append(a, "-uuid", c.UUID)
	}
	if c.Console != "" {
		a = append(a, "-chardev", "file,id=ser0,path="+c.Console+",append=on", "-serial", "chardev:ser0")
	}
	if b.UEFI {
		if c.OVMFCode == "" {
			return nil, errors.New("BootSourceOverrideMode UEFI: this machine has no UEFI firmware (legacy BIOS only)")
		}
		vars := filepath.Join(c.RunDir, "OVMF_VARS.fd")
		if _, err := os.Stat(vars); err != nil {
			data, err := os.ReadFile(c.OVMFVars)
			if err == nil {
				err = os.WriteFile(vars, data, 0o600)
			}
			if err != nil {
				return nil, fmt.Errorf("UEFI variable store: %w", err)
			}
		}
		a = append(a, "-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+c.OVMFCode, "-drive", "if=pflash,format=raw,unit=1,file="+vars)
	}
	// Boot order by bootindex (SeaBIOS and OVMF both read it): the override's device first, then the
	// machine's own order, disks, CD, network.
	order := map[string]int{"Hdd": 1, "Cd": 2, "Pxe": 3}
	switch b.Target {
	case "Cd":
		order = map[string]int{"Cd": 1, "Hdd": 2, "Pxe": 3}
	case "Pxe":
		order = map[string]int{"Pxe": 1, "Hdd": 2, "Cd": 3}
	}
	idx := func(kind string, i int) string { return strconv.Itoa(order[kind]*100 + i) }
	for i, d := range c.Disks {
		id := "disk" + strconv.Itoa(i)
		a = append(a, "-drive", "if=none,id="+id+",file="+d.Path+",format=raw,cache=unsafe",
			"-device", "virtio-blk-pci,drive="+id+",serial="+d.Serial+",bootindex="+idx("Hdd", i))
	}
	cd := "if=none,id=cd0,media=cdrom,readonly=on"
	if m.media != "" {
		cd += ",format=raw,file=" + m.media
	}
	a = append(a, "-drive", cd, "-device", "ide-cd,drive=cd0,id=cdrom0,bus=ide.1,bootindex="+idx("Cd", 0))
	nd := "user,id=n0"
	if c.TAP != "" {
		nd = "tap,id=n0,ifname=" + c.TAP + ",script=no,downscript=no"
	}
	dev := "virtio-net-pci,netdev=n0,bootindex=" + idx("Pxe", 0)
	if c.MAC != "" {
		dev += ",mac=" + c.MAC
	}
	a = append(a, "-netdev", nd, "-device", dev)
	return a, nil
}

// startLocked powers the machine on: QEMU with the boot override in force, its QMP monitor
// connected and its events read.
func (m *qemuMachine) startLocked() error {
	m.n++
	sock := filepath.Join(m.cfg.RunDir, "qmp"+strconv.Itoa(m.n)+".sock")
	_ = os.Remove(sock)
	argv, err := m.argv(m.nextBoot(), sock)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(m.cfg.RunDir, "qemu.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "%s start %d: %s %s\n", time.Now().Format(time.RFC3339Nano), m.n, m.cfg.Binary, strings.Join(argv, " "))
	bin := m.cfg.Binary
	if m.cfg.NetNS != "" {
		// ip execs QEMU: the PID is QEMU's.
		argv, bin = append([]string{"netns", "exec", m.cfg.NetNS, bin}, argv...), "ip"
	}
	cmd := exec.Command(bin, argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A BMC killed outright takes its host down with it, not leaving QEMU behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	labns.MachineSession(cmd) // its CPU share is a session's, not the caller's niced one
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start QEMU: %w", err)
	}
	r := &qemuRun{cmd: cmd, exited: make(chan struct{}), events: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.exited) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mon, err := qmp.NewSocketMonitor("unix", sock, 5*time.Second)
		if err == nil {
			if err = mon.Connect(); err == nil {
				r.mon = mon
				break
			}
		}
		select {
		case <-r.exited:
			b, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("QEMU exited at start: %s", lastLines(string(b), 10))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-r.exited
			return fmt.Errorf("QEMU's QMP monitor %s did not answer in 30 s: %v", sock, err)
		}
	}
	evs, _ := r.mon.Events(context.Background())
	go func() {
		defer close(r.events)
		for e := range evs {
			if e.Event == "SHUTDOWN" {
				r.reason, _ = e.Data["reason"].(string)
			}
		}
	}()
	m.run = r
	m.note("started")
	go m.watch(r)
	return nil
}

// watch waits for r's QEMU to exit: a guest reset starts the machine again (cold), any other exit
// not asked for by the BMC (the guest powered itself off) leaves it off.
func (m *qemuMachine) watch(r *qemuRun) {
	<-r.exited
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.run != r || r.stopping {
		return
	}
	// QEMU closed its monitor when it exited: the event stream ends with it, after the SHUTDOWN
	// event that says why.
	select {
	case <-r.events:
	case <-time.After(5 * time.Second):
	}
	_ = r.mon.Disconnect()
	m.run = nil
	m.note("stopped")
	if r.reason != "guest-reset" {
		return
	}
	m.note("reset")
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		if err = m.startLocked(); err == nil {
			m.note("restarted from its definition")
			return
		}
		m.note(fmt.Sprintf("restart %d failed: %s", attempt, strings.ReplaceAll(err.Error(), "\n", " ")))
		time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
	}
}

// stopLocked ends QEMU at once (power pulled) and waits for it.
func (m *qemuMachine) stopLocked() {
	r := m.run
	if r == nil {
		return
	}
	r.stopping = true
	_ = r.cmd.Process.Kill()
	<-r.exited // watch(r) waits for m.mu, then sees stopping
	_ = r.mon.Disconnect()
	m.run = nil
	m.note("stopped")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
