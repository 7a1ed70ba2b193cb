package netboot

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// Handler is the plain-HTTP handler of the boot artefacts: GET or HEAD of ChainPath, ScriptPath+MAC,
// KernelPath and InitrdPath; anything else is 404, another method 405, an unknown or malformed MAC
// 404 with a line saying what to fix. It never answers a client's input with a 5xx (only a kernel or
// initrd file vanishing from the appliance's disk gives 503).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(ChainPath, s.serveChain)
	mux.HandleFunc(ScriptPath, s.serveScript)
	mux.HandleFunc(KernelPath, func(w http.ResponseWriter, r *http.Request) { s.serveFile(w, r, s.kernel) })
	mux.HandleFunc(InitrdPath, func(w http.ResponseWriter, r *http.Request) { s.serveFile(w, r, s.initrd) })
	if s.rootFS.path != "" {
		mux.HandleFunc(RootFSPath, func(w http.ResponseWriter, r *http.Request) { s.serveFile(w, r, s.rootFS) })
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found: this port serves only the network-boot artefacts ("+ChainPath+", "+ScriptPath+"MAC, "+KernelPath+", "+InitrdPath+")", http.StatusNotFound)
	})
	return mux
}

func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
		return false
	}
	return true
}

func (s *Server) baseURL() string {
	return "http://" + netip.AddrPortFrom(s.cfg.ServerIP, s.cfg.HTTPPort).String()
}

// serveChain answers a client that does not know its script's URL: chain to it by ${netX/mac}
// (netX is the interface iPXE last opened, the one that booted).
func (s *Server) serveChain(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "#!ipxe\nchain %s%s${netX/mac}\n", s.baseURL(), ScriptPath)
}

// parseMAC accepts 52:54:00:00:00:21, 52-54-00-00-00-21 and 525400000021.
func parseMAC(s string) (net.HardwareAddr, bool) {
	if len(s) == 12 && !strings.ContainsAny(s, ":-.") {
		var b strings.Builder
		for i := 0; i < 12; i += 2 {
			if i > 0 {
				b.WriteByte(':')
			}
			b.WriteString(s[i : i+2])
		}
		s = b.String()
	}
	hw, err := net.ParseMAC(s)
	return hw, err == nil && len(hw) == 6
}

// What iPXE writes for agentapi.BootArgs.BootIF and IP, from the settings of the NIC it booted
// from (iPXE's settings: ${netX/mac:hexhyp} is the MAC with '-', the ip, gateway and netmask DHCP
// gave): expanded by iPXE when it runs the script, so the kernel sees the values.
const (
	ipxeBootIF = "01-${netX/mac:hexhyp}"
	ipxeIP     = "${netX/ip}::${netX/gateway}:${netX/netmask}"
)

// Script returns the iPXE script of the machine with this MAC, and false for a MAC not in the
// inventory. It carries public data only: the kernel and initrd URLs and the command line
// (for UEFI initrd=initrd, Config.KernelArgs, the machine's KernelArgs, then agentapi.BootArgs with
// the node's name and, with Config.RootFS, the node image's network-boot arguments, see install.go).
// A machine marked installed gets a script that boots its disk instead.
func (s *Server) Script(mac net.HardwareAddr) (string, bool) {
	script, _, ok := s.script(mac)
	return script, ok
}

// script is Script, also saying whether the script boots the machine's disk (it is marked installed).
func (s *Server) script(mac net.HardwareAddr) (script string, disk, ok bool) {
	m, ok := s.dhcp.machines[mac.String()]
	if !ok {
		return "", false, false
	}
	if s.cfg.StateDir != "" {
		if mark, ok, err := InstalledMark(s.cfg.StateDir, m.Name); err != nil {
			s.cfg.Logger.Warn("netboot: install mark unreadable; booting from the network", "node", m.Name, "err", err)
		} else if ok {
			return fmt.Sprintf("#!ipxe\n"+
				"echo appliance: %s installed itself to its disk at %s: booting the disk (appliance node reinstall %s to install again)\n"+
				"sanboot --no-describe --drive 0x80 || exit\n", m.Name, mark.Time.Format(time.RFC3339), m.Name), true, true
		}
	}
	args := append([]string{"initrd=initrd"}, s.cfg.KernelArgs...)
	args = append(args, m.KernelArgs...)
	boot := agentapi.BootArgs{Node: m.Name}
	base := s.baseURL()
	if s.rootFS.path != "" {
		boot.RootFSURL, boot.RootFSSHA256, boot.InitrdURL = base+RootFSPath, s.rootFSSHA256, base+InitrdPath
		boot.BootIF, boot.IP = ipxeBootIF, ipxeIP
	}
	args = append(args, boot.Words()...)
	return fmt.Sprintf("#!ipxe\n"+
		"echo appliance: network boot of %s (${netX/mac})\n"+
		"kernel %s%s %s\n"+
		"initrd %s%s\n"+
		"boot\n", m.Name, base, KernelPath, strings.Join(args, " "), base, InitrdPath), false, true
}

func (s *Server) serveScript(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	raw := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, ScriptPath), ".ipxe")
	mac, ok := parseMAC(raw)
	if !ok {
		http.Error(w, fmt.Sprintf("%q is not a MAC address: ask for %sMAC, e.g. %s52:54:00:00:00:21", clip(raw), ScriptPath, ScriptPath), http.StatusNotFound)
		return
	}
	script, disk, ok := s.script(mac)
	if !ok {
		s.dhcp.logUnknown(mac.String(), "HTTP")
		if o, ok := s.dhcp.addrOnly[mac.String()]; ok {
			http.Error(w, fmt.Sprintf("%s is node %s, which boots from virtual media: the appliance gives it an address, not a network boot", mac, o.Name), http.StatusNotFound)
			return
		}
		if o, ok := s.dhcp.others[mac.String()]; ok {
			http.Error(w, fmt.Sprintf("%s is node %s, which does not boot from the network: give it power.kind ipmi or redfish and power.bootDevice pxe", mac, o.Name), http.StatusNotFound)
			return
		}
		http.Error(w, fmt.Sprintf("%s is not in the inventory: add it as nodes[].mac", mac), http.StatusNotFound)
		return
	}
	s.cfg.Logger.Info("netboot: iPXE script", "mac", mac.String(), "remote", r.RemoteAddr)
	if s.cfg.Seen != nil {
		what := "iPXE script served: network boot of the node image"
		if disk {
			what = "iPXE script served: boot from its disk (installed)"
		}
		s.cfg.Seen(s.dhcp.machines[mac.String()].Name, what)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(script))
}

func (s *Server) serveFile(w http.ResponseWriter, r *http.Request, a artefact) {
	if !allowGet(w, r) {
		return
	}
	f, content, modTime, err := a.open()
	if err != nil {
		s.cfg.Logger.Warn("netboot: boot artefact missing on the appliance", "file", a.String(), "err", err)
		http.Error(w, "boot artefact not available on the appliance", http.StatusServiceUnavailable)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", modTime.Truncate(time.Second), content)
}

// clip bounds client input echoed in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
