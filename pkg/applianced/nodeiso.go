package applianced

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/nodeiso"
	"github.com/airgap-appliance/appliance/pkg/plan"
)

// controlPlaneAddress resolves the appliance's control-plane address in the current network
// namespace as the resolve phase does (networks.controlPlane.cidrs in order, the API VIP excluded).
func controlPlaneAddress(cfg *config.BootstrapConfiguration) (netresolve.Address, error) {
	r, err := netresolve.New("")
	if err != nil {
		return netresolve.Address{}, err
	}
	defer r.Close()
	var exclude []netip.Addr
	if vip := cfg.APIServer.VIP; vip.IsValid() {
		exclude = append(exclude, vip)
	}
	return r.Resolve(cfg.Networks.ControlPlane.CIDRs, exclude...)
}

// openNodeISO opens boot.nodeISO for serving at nodeiso.Path with this appliance's kernel arguments
// in its embed area: appliance.url (https://CONTROL-PLANE-ADDRESS:server.port, what bootstrap gives
// every node) and appliance.ca_pin (plan.KernelCmdline, public data only). It returns nil, nil when
// boot.nodeISO is unset or absent and no node boots it (the path then answers 404). When a node's
// power.virtualMediaImage is the appliance's own /boot/node.iso, an absent or unusable ISO is an
// error naming boot.nodeISO, so serve stops before a BMC fetches nothing.
func openNodeISO(cfg *config.BootstrapConfiguration, caPEM []byte, log *slog.Logger) (*nodeiso.Image, error) {
	users := cfg.NodeISOUsers()
	path := cfg.Boot.NodeISO
	if path == "" {
		return nil, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if len(users) == 0 {
			log.Debug("no node image ISO to serve", "boot.nodeISO", path)
			return nil, nil
		}
		return nil, fmt.Errorf("boot.nodeISO: %s does not exist, and nodes %v boot it from %s (power.virtualMediaImage): build it with iso/build-node-image.sh and give its node-amd64.iso", path, users, nodeiso.Path)
	}
	fail := func(err error) (*nodeiso.Image, error) {
		if len(users) == 0 {
			log.Warn("node image ISO not served at "+nodeiso.Path, "boot.nodeISO", path, "error", err)
			return nil, nil
		}
		return nil, fmt.Errorf("boot.nodeISO: %w (nodes %v boot it from %s): build it with iso/build-node-image.sh", err, users, nodeiso.Path)
	}
	cp, err := controlPlaneAddress(cfg)
	if err != nil {
		return fail(fmt.Errorf("networks.controlPlane.cidrs: %w", err))
	}
	pin, err := caPin(caPEM)
	if err != nil {
		return nil, err
	}
	url := "https://" + net.JoinHostPort(cp.Prefix.Addr().String(), strconv.Itoa(int(cfg.Server.Port)))
	im, err := nodeiso.Open(path, plan.KernelCmdline(url, pin))
	if err != nil {
		return fail(err)
	}
	log.Info("serving the node image ISO", "path", nodeiso.Path, "file", path, "bytes", im.Size(), "applianceURL", url)
	return im, nil
}
