// Package isovm boots the appliance ISO (iso/build-iso.sh) in QEMU under TCG for tests, the way an
// operator boots it on a server: the ISO as a CD (BIOS, or UEFI with Debian's OVMF), a configuration
// volume (FAT, label APPL-CONFIG) and a state disk as virtio disks, NICs on tap devices inside a lab
// network namespace. The VM is a real peer; QEMU runs inside the namespace, killed by its PID.
package isovm

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// cpuModel is the emulated CPU. (qemu64 with AES-NI, PCLMULQDQ and SSE4 made the ISO journey slower
// here, 152 s against 123–125 s: kept plain.)
const cpuModel = "qemu64,+rdrand"

// StateSerial is the state disk's virtio serial: the guest sees it as /dev/disk/by-id/virtio-applstate.
const StateSerial = "applstate"

// StateDevice is the state disk's path in the guest.
const StateDevice = "/dev/disk/by-id/virtio-" + StateSerial

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// BuildISO builds (or reuses, by content) the ISO with binaries built from this tree and the fixture
// bundle, and returns its path. The system stage must have been built by `make fixtures`
// (build-iso.sh --system-only) or is built now (it downloads: call it before any lab exists).
func BuildISO(t testing.TB) string {
	t.Helper()
	labns.RequireRoot(t)
	for _, tool := range []string{"grub-mkrescue", "xorriso", "mksquashfs"} {
		labns.RequireTool(t, tool)
	}
	root := repoRoot()
	bin := t.TempDir()
	for _, c := range [][]string{
		{"go", "build", "-trimpath", "-o", filepath.Join(bin, "appliance"), "./cmd/appliance"},
		{"go", "build", "-trimpath", "-o", filepath.Join(bin, "hostagent"), "./cmd/hostagent"},
	} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	out := filepath.Join(labns.FixtureCache(), "iso", "appliance-test-amd64.iso")
	cmd := exec.Command("bash", filepath.Join(root, "iso", "build-iso.sh"), "--appliance", filepath.Join(bin, "appliance"),
		"--hostagent", filepath.Join(bin, "hostagent"), "--bundle", filepath.Join(labns.FixtureCache(), "bundle"), "--out", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if _, err := cmd.Output(); err != nil {
		t.Fatalf("iso/build-iso.sh: %v\n%s", err, stderr.String())
	}
	t.Logf("%s", strings.TrimSpace(stderr.String()))
	return out
}

// ConfigVolume makes a FAT image labelled APPL-CONFIG in dir holding files (name → content; names
// may have one directory level, e.g. "ssh/id_ed25519") and returns its path.
func ConfigVolume(t testing.TB, dir string, files map[string]string) string {
	t.Helper()
	labns.RequireTool(t, "mkfs.vfat")
	labns.RequireTool(t, "mcopy")
	img := filepath.Join(dir, "config.img")
	_ = os.Remove(img)
	if out, err := exec.Command("mkfs.vfat", "-C", "-n", "APPL-CONFIG", img, "16384").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.vfat: %v\n%s", err, out)
	}
	made := map[string]bool{}
	for name, content := range files {
		if d := filepath.Dir(name); d != "." && !made[d] {
			if out, err := exec.Command("mmd", "-i", img, "::/"+d).CombinedOutput(); err != nil {
				t.Fatalf("mmd %s: %v\n%s", d, err, out)
			}
			made[d] = true
		}
		p := filepath.Join(dir, "config-"+strings.ReplaceAll(name, "/", "_"))
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mcopy", "-i", img, p, "::/"+name).CombinedOutput(); err != nil {
			t.Fatalf("mcopy %s: %v\n%s", name, err, out)
		}
	}
	return img
}

// BlankDisk makes a sparse, all-zero raw disk of size bytes (blank: no signature).
func BlankDisk(t testing.TB, path string, size int64) string {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

// NIC is one network interface of the VM: a tap device (created by the caller in the namespace) and
// the MAC address the configuration matches.
type NIC struct{ Tap, MAC string }

// Options describe one boot.
type Options struct {
	NS            *labns.NS // the namespace QEMU runs in (its taps)
	NetNS         string    // or a namespace by name (ip netns), when NS is nil
	ISO           string
	Config, State string // disk images; "" leaves the disk out
	NICs          []NIC
	UEFI          bool
	// Dir receives the console log (NAME.console.log) and UEFI variables; no commas (QEMU's option
	// syntax).
	Dir, Name string
	MemoryMB  int // default 2048
}

// VM is one QEMU boot of the ISO.
type VM struct {
	Console string
	Start   time.Time
	cmd     *exec.Cmd
	exited  chan struct{}
	output  bytes.Buffer

	mu    sync.Mutex
	lines []Line // the console's complete lines, as the watcher saw them
}

// Line is one console line and when the watcher saw it.
type Line struct {
	At   time.Duration // since power-on (VM.Start); up to watchInterval after QEMU wrote it
	CPU  time.Duration // QEMU's host CPU time then (CPUTime)
	Text string        // without carriage returns and the line end; terminal escapes kept
}

// watchInterval is how often the watcher reads the console: the resolution of Line.At.
const watchInterval = 100 * time.Millisecond

// Boot starts QEMU; the VM is killed (by its PID) when the test ends, or by Halt.
func Boot(t testing.TB, o Options) *VM {
	t.Helper()
	labns.RequireTool(t, "qemu-system-x86_64")
	if strings.Contains(o.Dir, ",") || strings.Contains(o.ISO, ",") {
		t.Fatalf("%s: QEMU's option syntax cannot take a path with a comma", o.Dir)
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 2048
	}
	v := &VM{Console: filepath.Join(o.Dir, o.Name+".console.log"), Start: time.Now()}
	args := []string{"qemu-system-x86_64", "-name", "appliance-iso-" + o.Name, "-accel", "tcg", "-cpu", cpuModel,
		"-m", strconv.Itoa(o.MemoryMB), "-smp", "2", "-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "file,id=con,path=" + v.Console, "-serial", "chardev:con", "-boot", "d"}
	if o.UEFI {
		vars := filepath.Join(o.Dir, o.Name+".OVMF_VARS.fd")
		data, err := os.ReadFile("/usr/share/OVMF/OVMF_VARS_4M.fd")
		if err != nil {
			t.Fatalf("OVMF (Debian package ovmf): %v", err)
		}
		if err := os.WriteFile(vars, data, 0o600); err != nil {
			t.Fatal(err)
		}
		// q35: the CD on its AHCI controller.
		args = append(args, "-machine", "q35",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
			"-drive", "if=pflash,format=raw,unit=1,file="+vars,
			"-drive", "file="+o.ISO+",media=cdrom,if=none,id=cd,readonly=on,format=raw", "-device", "ide-cd,drive=cd,bus=ide.0")
	} else {
		args = append(args, "-drive", "file="+o.ISO+",media=cdrom,if=ide,readonly=on,format=raw")
	}
	if o.State != "" {
		args = append(args, "-drive", "file="+o.State+",if=none,id=state,format=raw", "-device", "virtio-blk-pci,drive=state,serial="+StateSerial)
	}
	if o.Config != "" {
		args = append(args, "-drive", "file="+o.Config+",if=none,id=cfg,format=raw", "-device", "virtio-blk-pci,drive=cfg,serial=applconfig")
	}
	for i, n := range o.NICs {
		id := "n" + strconv.Itoa(i)
		args = append(args, "-netdev", "tap,id="+id+",ifname="+n.Tap+",script=no,downscript=no", "-device", "virtio-net-pci,netdev="+id+",mac="+n.MAC)
	}
	if o.NS != nil {
		v.cmd = o.NS.Command(args...)
	} else {
		v.cmd = exec.Command("ip", append([]string{"netns", "exec", o.NetNS}, args...)...)
	}
	v.cmd.Stdout, v.cmd.Stderr = &v.output, &v.output
	labns.MachineSession(v.cmd) // its CPU share is a session's, not the caller's niced one
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("qemu: %v", err)
	}
	v.exited = make(chan struct{})
	go func() { _ = v.cmd.Wait(); close(v.exited) }()
	go v.watch()
	t.Cleanup(v.Halt)
	fw := "BIOS"
	if o.UEFI {
		fw = "UEFI/OVMF"
	}
	t.Logf("%s: QEMU pid %d (%s), console %s", o.Name, v.cmd.Process.Pid, fw, v.Console)
	return v
}

// watch reads the console every watchInterval until QEMU exits and records each complete line with
// the time since power-on and QEMU's CPU time (Lines): the boot's timeline on the host's clock, which
// Shares splits into firmware, kernel, initramfs and systemd.
func (v *VM) watch() {
	var off int64
	var partial []byte
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	for {
		exited := false
		select {
		case <-v.exited:
			exited = true
		case <-tick.C:
		}
		if f, err := os.Open(v.Console); err == nil {
			buf, _ := io.ReadAll(io.NewSectionReader(f, off, 1<<40))
			_ = f.Close()
			off += int64(len(buf))
			if len(buf) > 0 {
				at, cpu := time.Since(v.Start), v.CPUTime()
				partial = append(partial, buf...)
				v.mu.Lock()
				for {
					i := bytes.IndexByte(partial, '\n')
					if i < 0 {
						break
					}
					v.lines = append(v.lines, Line{At: at, CPU: cpu, Text: strings.Trim(string(partial[:i]), "\r")})
					partial = partial[i+1:]
				}
				v.mu.Unlock()
			}
		}
		if exited {
			return
		}
	}
}

// Lines are the console's complete lines so far, oldest first.
func (v *VM) Lines() []Line {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.lines)
}

// Halt kills the VM (its PID) and waits for it.
func (v *VM) Halt() {
	select {
	case <-v.exited:
	default:
		_ = v.cmd.Process.Kill()
		<-v.exited
	}
}

// Dead reports whether QEMU has exited, with its output.
func (v *VM) Dead() (string, bool) {
	select {
	case <-v.exited:
		return "QEMU exited: " + v.output.String(), true
	default:
		return "", false
	}
}

// CPUTime is the host CPU time QEMU has used so far (user + system, from /proc/PID/stat fields 14
// and 15 in USER_HZ ticks, 100 per second on Linux/x86): under TCG, what the guest's work costs the
// host, taken from the same cores the lab's nodes run on. 0 when QEMU has exited.
func (v *VM) CPUTime() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", v.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from after it.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100)
}

// Log is the console so far.
func (v *VM) Log() string {
	b, _ := os.ReadFile(v.Console)
	return string(b)
}

// WaitConsole waits until the console shows re and returns the match, or fails with the console's
// tail.
func (v *VM) WaitConsole(t testing.TB, re *regexp.Regexp, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if m := re.FindString(v.Log()); m != "" {
			return m
		}
		if why, dead := v.Dead(); dead || time.Now().After(deadline) {
			t.Fatalf("console never showed %q within %s %s; its tail:\n%s", re, limit, why, Tail(v.Log(), 40))
		}
		time.Sleep(time.Second)
	}
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// uptimeLine is a console line journald forwarded (or the kernel printed): "[   14.252623] TEXT",
// stamped with CLOCK_MONOTONIC, the seconds since the kernel started. Not anchored: a login prompt
// may precede it on the same line.
var uptimeLine = regexp.MustCompile(`\[\s*([0-9]+\.[0-9]+)\] (.*)$`)

// phaseLine is a phase's result line of appliance bootstrap: "[4/11] bundle: DETAIL 8.9s".
var phaseLine = regexp.MustCompile(`appliance\[\d+\]: \[(\d+)/(\d+)\] ([a-z-]+): .* ([0-9.]+)s$`)

// Shares splits the boot, from power-on, into its shares on the host's clock, read from the
// console (Lines):
//   - firmware: SeaBIOS or OVMF, then GRUB loading the kernel and initramfs from the medium, until
//     the kernel started (the initramfs's first line's time less the uptime it prints);
//   - kernel: until the initramfs's /init started;
//   - initramfs: modules, the medium found and verified (iso/init), the root mounted, until
//     switch_root to systemd;
//   - systemd: until appliance-firstboot.service started;
//   - firstboot: until it started appliance-bootstrap.service;
//   - then each phase of `appliance bootstrap` up to and including upTo ("" for every phase that
//     finished), from the uptime journald stamps its lines with.
//
// A share whose mark is not on the console (yet) is left out. Seconds, one decimal; the marks are
// up to watchInterval late.
func (v *VM) Shares(upTo string) string { return shares(v.Lines(), upTo) }

func shares(lines []Line, upTo string) string {
	var parts []string
	kernelAt := -1.0 // seconds from power-on to the kernel's start
	var mark float64 // the end of the last share, seconds from power-on
	add := func(name string, end float64, extra string) {
		parts = append(parts, fmt.Sprintf("%s %.1f s%s", name, end-mark, extra))
		mark = end
	}
	initStart := regexp.MustCompile(`APPLIANCE-INIT: start \([^,]+, ([0-9.]+)s`)
	verified := regexp.MustCompile(`APPLIANCE-INIT: medium verified \(\d+ files\) at ([0-9.]+)s`)
	switched := regexp.MustCompile(`APPLIANCE-INIT: switching to systemd at ([0-9.]+)s`)
	var verifiedAt float64
	firstbootStarted, bootstrapStarted := false, false
	for _, l := range lines {
		if m := initStart.FindStringSubmatch(l.Text); m != nil && kernelAt < 0 {
			up, _ := strconv.ParseFloat(m[1], 64)
			kernelAt = l.At.Seconds() - up
			add("firmware", kernelAt, "")
			add("kernel", kernelAt+up, "")
			continue
		}
		if kernelAt < 0 {
			continue
		}
		if m := verified.FindStringSubmatch(l.Text); m != nil {
			verifiedAt, _ = strconv.ParseFloat(m[1], 64)
		} else if m := switched.FindStringSubmatch(l.Text); m != nil {
			up, _ := strconv.ParseFloat(m[1], 64)
			extra := ""
			if verifiedAt > 0 {
				extra = fmt.Sprintf(" (medium verified at %.1f s)", kernelAt+verifiedAt)
			}
			add("initramfs", kernelAt+up, extra)
		} else if !firstbootStarted && strings.Contains(stripEscapes(l.Text), "Starting appliance-firstbo") {
			firstbootStarted = true
			add("systemd → firstboot", l.At.Seconds(), "")
		} else if m := uptimeLine.FindStringSubmatch(l.Text); m != nil {
			up, _ := strconv.ParseFloat(m[1], 64)
			at := kernelAt + up
			if !bootstrapStarted && strings.Contains(m[2], "firstboot: started appliance-bootstrap") {
				bootstrapStarted = true
				add("firstboot", at, "")
			} else if p := phaseLine.FindStringSubmatch(m[2]); p != nil && bootstrapStarted {
				add(p[3], at, "")
				if p[3] == upTo {
					break
				}
			}
		}
	}
	return strings.Join(parts, ", ")
}

var escape = regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]")

// stripEscapes removes terminal escapes (systemd's colours) from a console line.
func stripEscapes(s string) string { return escape.ReplaceAllString(s, "") }

// Timeline is the console's lines of `appliance bootstrap` and firstboot (its phases, and the nodes'
// progress while it converges), each with the seconds since power-on and QEMU's host CPU seconds so
// far, for the reader of a test log.
func (v *VM) Timeline() string {
	var b strings.Builder
	for _, l := range v.Lines() {
		m := uptimeLine.FindStringSubmatch(l.Text)
		if m == nil || !strings.Contains(m[2], "appliance[") {
			continue
		}
		fmt.Fprintf(&b, "  %6.1f s  cpu %5.1f s  %s\n", l.At.Seconds(), l.CPU.Seconds(), m[2])
	}
	return b.String()
}
