package applianced

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestOpenNodeISOAbsent: an absent boot.nodeISO is served by nobody (404) when no node boots it, and
// stops serve with an error naming the field, the file and the nodes when one does. (The served
// image itself: TestLabServeNetboot, step 4b.)
func TestOpenNodeISOAbsent(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "node-amd64.iso")
	cfg := &config.BootstrapConfiguration{Server: config.Server{Port: 8443}, Boot: config.Boot{NodeISO: absent},
		Nodes: []config.Node{{Name: "n2", Power: config.Power{Kind: config.PowerRedfish, BootDevice: config.BootCDROM,
			VirtualMediaImage: "https://images.example.com/node.iso"}}}}
	im, err := openNodeISO(cfg, nil, slog.New(slog.DiscardHandler))
	if im != nil || err != nil {
		t.Errorf("no node boots it: %v, %v; want nothing served and no error", im, err)
	}
	cfg.Nodes[0].Power.VirtualMediaImage = "https://10.0.0.2:8443/boot/node.iso"
	_, err = openNodeISO(cfg, nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.HasPrefix(err.Error(), "boot.nodeISO: "+absent+" does not exist") || !strings.Contains(err.Error(), "[n2]") {
		t.Errorf("n2 boots it: %v; want an error naming boot.nodeISO, the file and n2", err)
	}
}
