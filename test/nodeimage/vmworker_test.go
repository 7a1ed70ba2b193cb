//go:build e2e

package nodeimage

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

// The virtual-media worker of the bare-metal lab (TestBareMetalWorkerJoinsCluster's n2): a QEMU VM
// behind the lab's Redfish BMC (the project's emulator, because no real BMC can run here;
// test/labredfish.StartMachine with a lab NIC), on the lab's control-plane segment.
const (
	vmMAC    = "52:54:00:02:64:00"
	vmUUID   = "52540002-6400-4000-8000-525400026400"
	vmSerial = "LAB-DISK-n2"
	// vmDecoySerial is n2's second, smaller disk, which an install without hints would choose (the
	// smallest of at least 4 GiB): its nodes[].rootDevice (which only its enrolment answer carries to
	// it) must pass over it. It is the second because a BIOS "boot from Hdd" (the BMC's override
	// after the install) boots the firmware's first disk: with a blank first disk SeaBIOS fell
	// through to the CD, which was still inserted, and the machine booted the ISO again.
	vmDecoySerial = "DECOY-n2"
	vmAddr        = "10.100.0.22"
	vmBMC         = "10.100.0.122/24"
	// n2ImageURL is n2's power.virtualMediaImage: the appliance's own node ISO (boot.nodeISO).
	n2ImageURL = "https://10.100.0.2:8443/boot/node.iso"
)

// startVMWorker makes n2 (2 GiB, the blank 8 GiB disk with serial vmSerial and a blank 5 GiB decoy,
// powered off) and its BMC, whose NIC and BMC address sit on the lab's control-plane bridge (fabric's
// br-cp). A reboot of the machine starts it again with the BMC's boot override and media, as firmware
// does.
func startVMWorker(t *testing.T, fabric string) labredfish.Machine {
	t.Helper()
	return labredfish.StartMachine(t, labredfish.MachineOptions{MemoryMiB: 2048, UUID: vmUUID, MAC: vmMAC,
		Disks: []labredfish.Disk{{SizeGiB: 8, Serial: vmSerial}, {SizeGiB: 5, Serial: vmDecoySerial}},
		Lab:   &labredfish.LabNIC{Fabric: fabric, Bridge: "br-cp", BMC: netip.MustParsePrefix(vmBMC)}})
}

// domainEvents reads the machine's lifecycle log (labredfish.Machine.Events): each event's name and time.
func domainEvents(t *testing.T, path string) []domainEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("domain events: %v", err)
	}
	defer f.Close()
	var evs []domainEvent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ns, what, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if ok && err == nil {
			evs = append(evs, domainEvent{time.Unix(0, n), what})
		}
	}
	return evs
}

type domainEvent struct {
	at   time.Time
	what string
}

// firstEvent is when the first event whose name starts with prefix happened, zero if none did.
func firstEvent(evs []domainEvent, prefix string) time.Time {
	for _, e := range evs {
		if strings.HasPrefix(e.what, prefix) {
			return e.at
		}
	}
	return time.Time{}
}

// vmediaShares reads node's virtual-media report from the power phase's detail
// (power.VirtualMediaReport.String: "n2 powered on from virtual media SLOT (HOW): insert 1.2s, boot
// override 0.1s, power on 0.2s"): the slot, how, and the three durations.
var vmediaShareRE = regexp.MustCompile(`powered on from virtual media (\S+) \(([^)]*)\): insert (\S+), boot override (\S+), power (\S+) (\S+?)(?:[,;]|$)`)

func vmediaShares(detail, node string) (slot, how string, insert, boot, power time.Duration, ok bool) {
	i := strings.Index(detail, node+" powered on from virtual media ")
	if i < 0 {
		return "", "", 0, 0, 0, false
	}
	m := vmediaShareRE.FindStringSubmatch(detail[i:])
	if m == nil {
		return "", "", 0, 0, 0, false
	}
	var errs [3]error
	insert, errs[0] = time.ParseDuration(m[3])
	boot, errs[1] = time.ParseDuration(m[4])
	power, errs[2] = time.ParseDuration(m[6])
	return m[1], m[2], insert, boot, power, errs[0] == nil && errs[1] == nil && errs[2] == nil
}

// virtualMediaState reads the BMC's virtual media (every member of the System's VirtualMedia
// collection, where the emulator's default profile serves them) and the system's boot override, as a lab client would.
func virtualMediaState(m labredfish.Machine) (inserted []string, target, enabled string, err error) {
	sysPath := "/redfish/v1/Systems/" + m.SystemID
	var coll struct {
		Members []struct {
			ID string `json:"@odata.id"`
		}
	}
	b, err := m.Get(sysPath + "/VirtualMedia")
	if err == nil {
		err = json.Unmarshal(b, &coll)
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("%s/VirtualMedia: %w", sysPath, err)
	}
	for _, vm := range coll.Members {
		var s struct {
			Inserted bool
			Image    string
		}
		b, err := m.Get(vm.ID)
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil {
			return nil, "", "", fmt.Errorf("%s: %w", vm.ID, err)
		}
		if s.Inserted {
			inserted = append(inserted, vm.ID+" "+s.Image)
		}
	}
	var sys struct {
		Boot struct {
			BootSourceOverrideTarget  string
			BootSourceOverrideEnabled string
		}
	}
	b, err = m.Get(sysPath)
	if err == nil {
		err = json.Unmarshal(b, &sys)
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("%s: %w", sysPath, err)
	}
	if len(coll.Members) == 0 {
		return nil, "", "", fmt.Errorf("%s/VirtualMedia lists no media", sysPath)
	}
	return inserted, sys.Boot.BootSourceOverrideTarget, sys.Boot.BootSourceOverrideEnabled, nil
}

// caPin is agentapi.PinOf the CA certificate in the PEM file p (what the node image's kernel
// command line carries as appliance.ca_pin).
func caPin(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("no PEM block in %s", p)
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return agentapi.PinOf(ca)
}

// milestone is a line a machine's console shows, and when it first did (since the machine's power-on).
type milestone struct {
	name string
	re   *regexp.Regexp
	at   time.Duration
	line string
}

// consoleTrack follows a machine's console for its milestones, in order, timed from its power-on
// (poweredOn: zero while unknown).
type consoleTrack struct {
	console   string
	poweredOn func() time.Time
	ms        []milestone
	next      int
}

// poll notes the milestones the console shows now.
func (c *consoleTrack) poll() {
	on := c.poweredOn()
	if on.IsZero() {
		return
	}
	b, _ := os.ReadFile(c.console)
	for c.next < len(c.ms) {
		m := c.ms[c.next].re.FindString(string(b))
		if m == "" {
			return
		}
		c.ms[c.next].at = time.Since(on).Round(100 * time.Millisecond)
		c.ms[c.next].line = m
		c.next++
	}
}

// bmcRequest is one request the BMC's log holds.
type bmcRequest = labredfish.Request

// bmcRequests reads the BMC's log.
func bmcRequests(t *testing.T, m labredfish.Machine) []bmcRequest {
	t.Helper()
	reqs, err := m.Requests()
	if err != nil {
		t.Fatalf("the BMC's log: %v", err)
	}
	return reqs
}

// firstRequest is the first successful (2xx) request with method whose path ends with suffix, at or
// after from; ok false if none.
func firstRequest(reqs []bmcRequest, method, suffix string, from time.Time) (bmcRequest, bool) {
	for _, r := range reqs {
		if r.Method == method && strings.HasSuffix(r.Path, suffix) && r.Status/100 == 2 && !r.At.Before(from) {
			return r, true
		}
	}
	return bmcRequest{}, false
}
