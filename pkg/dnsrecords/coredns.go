package dnsrecords

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodeaddr"
)

// The control planes' own DNS servers: every control plane runs CoreDNS as a kubelet static pod on
// the host network (OpenShift on-prem does the same), answering the zone ForCoreDNS builds on port 53
// of its node addresses, so the cluster's names resolve while the bootstrap host is switched off.
// The hostagent writes the two files below (CoreDNSConfigDir) and the pod manifest.
const (
	// CoreDNSConfigDir is the directory on a control plane that holds the Corefile and the zone
	// file, mounted read-only into the static pod (a directory, so that files replaced by rename are
	// seen inside it).
	// (agentapi's: the node side takes them from the contract.)
	CoreDNSConfigDir = agentapi.CoreDNSConfigDir
	// CoreDNSCorefile and CoreDNSZoneFile are the files in CoreDNSConfigDir.
	CoreDNSCorefile = agentapi.CoreDNSCorefile
	CoreDNSZoneFile = agentapi.CoreDNSZoneFile
	// CoreDNSHealthPort is the port of CoreDNS's health plugin (GET /health answers 200 "OK"), on
	// 127.0.0.1 only: the static pod's liveness probe. 18080 is where OpenShift's on-prem CoreDNS
	// answers it too, clear of kubeadm's and the appliance's host-network ports.
	CoreDNSHealthPort = 18080
)

// ForCoreDNS builds the zone the control planes' CoreDNS serves: New's records with ns.<zone> at
// every control plane's control-plane address (nodeaddr.ControlPlanes, document order), whatever
// dns.listenAddress says (the bootstrap host may be switched off), and the SOA serial ContentSerial.
// Errors: ErrNoBaseDomain without baseDomain; ErrNoNameServer when no control plane has an address.
func ForCoreDNS(c *config.BootstrapConfiguration) (*Zone, error) {
	if c.BaseDomain == "" {
		return nil, ErrNoBaseDomain
	}
	cps := nodeaddr.ControlPlanes(c)
	if len(cps) == 0 {
		return nil, ErrNoNameServer
	}
	z, err := New(c, Options{NameServers: cps})
	if err != nil {
		return nil, err
	}
	z.soa.Serial = ContentSerial(z)
	return z, nil
}

// ContentSerial is a SOA serial derived from the zone's records other than the SOA: the first four
// bytes of the SHA-256 of their presentation format, never 0. It changes whenever a record does and
// is the same on every render, so the plan stays pure. It is not monotonic (RFC 1982 secondaries
// would miss a decrease), which is fine for its one reader: CoreDNS's file plugin reloads a zone
// whose serial differs from the loaded one (plugin/file/reload.go, v1.12.1), and nothing transfers
// this copy of the zone; the exported zone (`appliance dns zone`) keeps FileSerial.
func ContentSerial(z *Zone) uint32 {
	h := sha256.New()
	for _, rr := range z.RRs {
		if rr.Header().Rrtype == dns.TypeSOA {
			continue
		}
		h.Write([]byte(rr.String()))
		h.Write([]byte{'\n'})
	}
	s := binary.BigEndian.Uint32(h.Sum(nil))
	if s == 0 {
		s = 1
	}
	return s
}

// Corefile is a control plane's CoreDNS configuration (CoreDNS's Corefile syntax; CoreDNS v1.12.1
// plugins) serving z from CoreDNSZoneFile, with one server block for the zone on port 53:
//
//	bind         listen, the control plane's node addresses: never 0.0.0.0, where kubeadm's cluster
//	             DNS (pod network), systemd-resolved (127.0.0.53) or anything else may hold port 53
//	file         the zone (authoritative answers, wildcards per RFC 4592, SRV targets' addresses in
//	             the additional section), re-read when its SOA serial changes (ContentSerial)
//	loadbalance  A records of one name (*.apps, ns) in rotating order
//	errors       errors to the log
//	health       127.0.0.1:CoreDNSHealthPort, the static pod's liveness probe
//	reload       the Corefile re-read when it changes (new addresses after a day-2 change)
//
// Nothing is forwarded: this is an air gap, and the node resolvers keep their own servers after
// these. A name outside the zone matches no server block, and CoreDNS answers REFUSED for it (not
// NXDOMAIN): a stub resolver that lists this server first moves on to its next server on REFUSED
// (glibc res_send, systemd-resolved), whereas NXDOMAIN would be final and break every other name.
// Errors: no listen address, or one that is not IPv4.
func Corefile(z *Zone, listen []netip.Addr) ([]byte, error) {
	if len(listen) == 0 {
		return nil, errors.New("CoreDNS needs at least one address to listen on: the control plane has no address in networks.controlPlane.cidrs or networks.workloadPlane.cidrs")
	}
	addrs := make([]string, 0, len(listen))
	for _, a := range listen {
		if !a.Is4() {
			return nil, fmt.Errorf("CoreDNS listen address %s is not IPv4: the cluster's networks are IPv4", a)
		}
		addrs = append(addrs, a.String())
	}
	zone := strings.TrimSuffix(z.Origin, ".")
	var b strings.Builder
	fmt.Fprintf(&b, "# The cluster's DNS zone %s on this control plane, generated by the appliance (pkg/dnsrecords).\n", zone)
	b.WriteString("# Names outside the zone match no server block: CoreDNS answers REFUSED, the resolver asks its next server.\n")
	fmt.Fprintf(&b, "%s:%d {\n", zone, Port)
	fmt.Fprintf(&b, "    bind %s\n", strings.Join(addrs, " "))
	fmt.Fprintf(&b, "    file %s %s\n", CoreDNSZoneFile, zone)
	b.WriteString("    loadbalance round_robin\n")
	b.WriteString("    errors\n")
	fmt.Fprintf(&b, "    health %s\n", net.JoinHostPort("127.0.0.1", strconv.Itoa(CoreDNSHealthPort)))
	b.WriteString("    reload\n")
	b.WriteString("}\n")
	return []byte(b.String()), nil
}

// ZoneFile is z as the master file CoreDNS's file plugin reads (WriteTo's text).
func ZoneFile(z *Zone) []byte {
	var b strings.Builder
	_, _ = z.WriteTo(&b) // a strings.Builder never fails
	return []byte(b.String())
}
