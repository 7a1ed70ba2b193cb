package isovm

import (
	"testing"
	"time"
)

// TestShares: the boot's shares from console lines as QEMU wrote them in a TestISOJourney run (CI
// run 17: systemd's colours, carriage returns, a login prompt before a journald line), with the
// times a watcher saw them: firmware is the initramfs's first line's time less the uptime it
// prints, and the later marks come from the uptime journald stamps lines with.
func TestShares(t *testing.T) {
	s := func(at float64) time.Duration { return time.Duration(at * float64(time.Second)) }
	lines := []Line{
		{At: s(2.0), Text: "  Booting `Bootstrap appliance'"},
		{At: s(4.94), Text: "APPLIANCE-INIT: start (6.1.0-50-amd64, 1.74s since the kernel started)"},
		{At: s(8.1), Text: "APPLIANCE-INIT: medium verified (8 files) at 6.84s"},
		{At: s(10.1), Text: "APPLIANCE-INIT: switching to systemd at 6.90s"},
		{At: s(14.8), Text: "         Starting \x1b[0;1;39mappliance-firstbo…figuration, network, state disk..."},
		{At: s(17.4), Text: "[   14.140308] appliance[213]: firstboot: started appliance-bootstrap.service: bootstrapping the cluster unattended"},
		{At: s(17.5), Text: `[   14.252623] appliance[242]: [1/11] load: cluster "kiso", 3 control-plane and 1 worker nodes 0.0s`},
		{At: s(26.6), Text: "appliance login: [   23.305728] appliance[242]: [4/11] bundle: signed by 96200f869d7bb473, verified 130 files (276.1 MiB; 130 hashed, 0 unchanged since last check) 8.9s"},
		{At: s(29.5), Text: "[   26.208325] appliance[242]: [7/11] serve: started appliance.service at https://10.100.0.2:8443 (pid 279, generation a46a5c2d90bb6d1a) 1.6s"},
		{At: s(33.3), Text: "[   30.002212] appliance[242]: [8/11] power: cp1 hostagent installed over SSH (8 changes) 3.8s"},
	}
	for _, tc := range []struct{ upTo, want string }{
		{"serve", "firmware 3.2 s, kernel 1.7 s, initramfs 5.2 s (medium verified at 10.0 s), systemd → firstboot 4.7 s, firstboot 2.5 s, load 0.1 s, bundle 9.1 s, serve 2.9 s"},
		{"", "firmware 3.2 s, kernel 1.7 s, initramfs 5.2 s (medium verified at 10.0 s), systemd → firstboot 4.7 s, firstboot 2.5 s, load 0.1 s, bundle 9.1 s, serve 2.9 s, power 3.8 s"},
	} {
		if got := shares(lines, tc.upTo); got != tc.want {
			t.Errorf("shares(upTo %q) =\n  %s\nwant\n  %s", tc.upTo, got, tc.want)
		}
	}
	if got := shares(lines[:1], ""); got != "" {
		t.Errorf("before the kernel started: %q, want nothing", got)
	}
}
