package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// VRRP is what every speaker of the API VIP must agree on: the bootstrap host's instance and every
// control plane's (agentapi.KeepalivedConfig) are built from the same VRRP.
type VRRP struct {
	// VirtualRouterID is the VRID, 1..255.
	VirtualRouterID uint8
	// AuthPass is the VRRPv2 PASS secret (1..8 bytes; secret), or "" for VRRPv3 without
	// authentication.
	AuthPass string
	// AdvertInterval is the advertisement interval: whole seconds with AuthPass, a multiple of 10 ms
	// without.
	AdvertInterval time.Duration
}

// VRRPFor resolves the cluster's VRRP settings from the configuration c (defaulted and validated),
// the PASS secret auth (the pki phase's; used only when c selects VRRPv2 with
// apiServer.keepalived.authPasswordFile, else ignored), and recorded, the bootstrap host's instance
// as an earlier render wrote it (ReadRecorded; nil on a first run).
//
// A running cluster keeps what it was bootstrapped with unless the document says otherwise, because
// changing the VRID, the VRRP version or the interval of live speakers is not atomic: while the
// speakers are reconfigured one by one, those on the old settings and those on the new ignore each
// other's advertisements and each side elects a master, so the VIP has two holders. So:
//   - a VRID that SetDefaults derived (config.BootstrapConfiguration.VirtualRouterIDDerived) gives
//     way to the recorded one (releases before the derivation from clusterName and apiServer.vip
//     derived it from clusterName alone);
//   - a cluster recorded with VRRPv2 PASS authentication whose document sets neither
//     authPasswordFile nor advertInterval (releases before VRRPv3 became the default made a PASS
//     secret for every cluster) keeps VRRPv2 with the recorded secret and interval.
//
// A value written in the document always wins: changing one on a running cluster is the operator's
// decision (do it in a maintenance window). Notes say, for people, what was kept and how to change it.
func VRRPFor(c *config.BootstrapConfiguration, auth string, recorded *keepalived.Instance) (VRRP, []string) {
	k := c.APIServer.Keepalived
	v := VRRP{VirtualRouterID: k.VirtualRouterID, AdvertInterval: k.AdvertInterval}
	if k.VRRPVersion() == 2 {
		v.AuthPass = auth
	}
	if recorded == nil {
		return v, nil
	}
	var notes []string
	if c.VirtualRouterIDDerived() && recorded.VirtualRouterID != 0 && recorded.VirtualRouterID != v.VirtualRouterID {
		notes = append(notes, fmt.Sprintf("kept VRRP VRID %d the cluster was bootstrapped with (derived now: %d; write apiServer.keepalived.virtualRouterID to change it)",
			recorded.VirtualRouterID, v.VirtualRouterID))
		v.VirtualRouterID = recorded.VirtualRouterID
	}
	if recorded.AuthPass != "" && k.VRRPVersion() == 3 && c.AdvertIntervalDerived() {
		v.AuthPass = recorded.AuthPass
		v.AdvertInterval = recorded.AdvertInterval
		if v.AdvertInterval == 0 {
			v.AdvertInterval = keepalived.DefaultAdvertInterval
		}
		notes = append(notes, fmt.Sprintf("kept VRRPv2 with PASS authentication and %s advertisements the cluster was bootstrapped with (write apiServer.keepalived.advertInterval, e.g. %s, to move to VRRPv3)",
			v.AdvertInterval, config.DefaultAdvertInterval))
	}
	return v, notes
}

// ReadRecorded reads back the bootstrap host's VRRP instance the render phase wrote in stateDir
// (statedir.Appliance/keepalived.json, Plan.Files), for VRRPFor. It returns nil, nil when there is
// none (a first run, or keepalived disabled). Unlike Build it reads the disk. Errors: an unreadable or
// malformed file, named with what to do.
func ReadRecorded(stateDir string) (*keepalived.Instance, error) {
	path := filepath.Join(statedir.Appliance(stateDir), statedir.KeepalivedFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read the recorded VRRP instance: %w", err)
	}
	var kc keepalived.Config
	if err := json.Unmarshal(b, &kc); err != nil || len(kc.Instances) == 0 {
		if err == nil {
			err = errors.New("no VRRP instance")
		}
		return nil, fmt.Errorf("%s: %w (restore it from a backup, or remove it to derive VRID and VRRP version from bootstrap.yaml: then make sure every control plane gets the new settings at the same time)", path, err)
	}
	return &kc.Instances[0], nil
}
