package applianced

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/iana"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestLabServeEnrolFromLease is issue 34 item 1's source check with every part real: `appliance
// serve` with boot.dhcp: server (its DHCP server, its HTTPS front, its own nftables firewall) in a
// lab namespace, and on the same segment, in a second namespace, the machine w1 and an attacker.
// w1 takes its address the way its firmware does, a DHCP DISCOVER/REQUEST from its MAC (nclient4),
// and puts the leased address on its NIC; the attacker holds another address of the segment and
// knows w1's MAC (it is in every DHCP packet w1 sends). After the power-on (the power phase's
// record), the attacker's enrolment as w1 from its own address is refused with a 403 naming the
// lease, and binds nothing; w1's, from its lease, gets its token. The attacker's second claim is
// then refused 409 and raises the alarm: an error-level line in serve's log and enrol-conflict in
// w1's history.
func TestLabServeEnrolFromLease(t *testing.T) {
	labns.RequireRoot(t)
	srvNS, cliNS := labns.New(t, "ens"), labns.New(t, "enc")
	const (
		serverIP = "10.81.0.1"
		attacker = "10.81.0.66" // outside boot.range: an address of its own
		macW1    = "52:54:00:4e:45:21"
	)
	_, cliIf := labns.Link(t, srvNS, serverIP+"/24", cliNS, attacker+"/24")
	sl := newServeLab(t, []byte("node image kernel"))
	cfgPath := sl.config(t, "10.81", `- name: cp1
  roles: [control-plane]
  addresses: [10.81.0.11, 10.80.0.11]
  power: {kind: ipmi, address: 10.81.0.211, username: admin, passwordFile: `+sl.password+`, bootDevice: disk}
- name: w1
  roles: [worker]
  addresses: [10.81.0.21, 10.80.0.21]
  mac: "`+macW1+`"
  power: {kind: ipmi, address: 10.81.0.221, username: admin, passwordFile: `+sl.password+`}
boot:
  dhcp: server
  range: {start: 10.81.0.150, end: 10.81.0.170}
`)
	// What the render phase leaves for w1: its hostagent configuration (the enrolment's answer).
	hcfg, err := agentapi.Configuration{Node: "w1", Roles: []string{"worker"}, ApplianceURL: "https://" + serverIP + ":8443", CAPin: testCAPin(t, sl.caPEM), Token: "token-of-w1"}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(statedir.RenderedNode(sl.state, "w1"), statedir.AgentConfigFile), hcfg)
	applyApplianceFirewall(t, srvNS, cfgPath)
	serve := startServe(t, srvNS, cfgPath)

	// The power phase powers w1 on.
	store := nodestate.Open(statedir.Nodes(sl.state))
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := store.Set("w1", st, ""); err != nil {
			t.Fatal(err)
		}
	}
	// w1's DHCP, as its PXE ROM sends it, answered by serve's DHCP server.
	mac, _ := net.ParseMAC(macW1)
	lease, err := pxeDHCPClient(t, cliNS, cliIf, mac).Request(context.Background(), pxeROM(iana.INTEL_X86PC)...)
	if err != nil {
		t.Fatalf("w1's DHCP: %v\n%s", err, serve.Log())
	}
	leased := lease.ACK.YourIPAddr.String()
	if a := netip.MustParseAddr(leased); a.Less(netip.MustParseAddr("10.81.0.150")) || netip.MustParseAddr("10.81.0.170").Less(a) {
		t.Fatalf("w1 leased %s, want an address of boot.range", leased)
	}
	cliNS.MustRun("ip", "addr", "add", leased+"/24", "dev", cliIf)

	enrol := func(from string, key ed25519.PrivateKey) (int, string) {
		t.Helper()
		nonce := make([]byte, 16)
		_, _ = rand.Read(nonce)
		r := agentapi.EnrollRequest{MACs: []string{macW1}, Timestamp: time.Now().UTC(), Nonce: base64.RawURLEncoding.EncodeToString(nonce), CAPin: testCAPin(t, sl.caPEM)}
		r.Sign(key)
		body, _ := json.Marshal(r)
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: certPool(t, sl.caPEM)},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := labns.InNamespace(cliNS.Path(), func() (err error) {
					d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
					c, err = d.DialContext(ctx, network, addr)
					return err
				})
				return c, err
			}}}
		defer hc.CloseIdleConnections()
		resp, err := hc.Post("https://"+serverIP+":8443"+agentapi.EnrollPathV1, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("enrol from %s: %v\n%s", from, err, serve.Log())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	_, attackerKey, _ := ed25519.GenerateKey(rand.Reader)
	code, body := enrol(attacker, attackerKey)
	if code != http.StatusForbidden || !strings.Contains(body, "the request came from "+attacker+", not from "+leased) {
		t.Fatalf("the attacker's enrolment as w1 from %s: %d %s, want 403 naming the lease %s", attacker, code, body, leased)
	}
	if _, found, err := server.ReadEnrollRecord(statedir.Enrolment(sl.state), "w1"); found || err != nil {
		t.Fatalf("the attacker's refused enrolment bound w1 (%v)", err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	code, body = enrol(leased, key)
	if code != http.StatusOK {
		t.Fatalf("w1's enrolment from its lease %s: %d %s\n%s", leased, code, body, serve.Log())
	}
	var resp agentapi.EnrollResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil || resp.Node != "w1" {
		t.Fatalf("answer %s: %v", body, err)
	}
	if c, err := agentapi.Parse([]byte(resp.HostagentConfig)); err != nil || c.Token == "" || c.Token == "token-of-w1" {
		t.Errorf("w1's answer: %v, want a new token", err)
	}

	code, body = enrol(attacker, attackerKey)
	if code != http.StatusConflict || !strings.Contains(body, "raised an alarm") {
		t.Errorf("the attacker's claim after w1 enrolled: %d %s, want 409 and the alarm", code, body)
	}
	if !strings.Contains(serve.Log(), "level=ERROR msg=\"ALARM: a second machine claims the node by enrolment") || !strings.Contains(serve.Log(), "claimSource="+attacker) {
		t.Errorf("serve logged no alarm naming %s:\n%s", attacker, serve.Log())
	}
	hist, err := store.History("w1")
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := nodestate.ActiveEnrolConflict(hist); !ok || !strings.Contains(a.Detail, "from "+leased) || !strings.Contains(a.Detail, "from "+attacker) {
		t.Errorf("w1's history %+v, want the alarm naming %s and %s", hist, leased, attacker)
	}
}

// testCAPin is the pin of the CA in caPEM.
func testCAPin(t *testing.T, caPEM []byte) string {
	t.Helper()
	pin, err := caPin(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pin
}
