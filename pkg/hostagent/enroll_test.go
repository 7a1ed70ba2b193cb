package hostagent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/logbuf"
)

const (
	enrollMAC  = "52:54:00:01:64:00"
	enrollUUID = "52540001-6400-4000-8000-525400016400"
)

// enrollAppliance is the real appliance front (pkg/server: /ca.crt, /ignition/, the enrolment
// endpoint) over TLS with a CA from pkg/pki, in-process, with w1 (ipmi, MAC enrollMAC, UUID
// enrollUUID) rendered and powered on by "the power phase" (its records in the node store).
type enrollAppliance struct {
	url, pin string
	caPEM    []byte
	enroll   *server.Enrollment
	store    *nodestate.Store
	// drop, while > 0, makes the front close the connection of that many enrolment answers
	// unanswered (a lost response), after the appliance handled the request.
	drop atomic.Int32
	// frozen, when not 0, is the enrolment endpoint's clock (Unix nanoseconds), standing still.
	frozen atomic.Int64
}

func newEnrollAppliance(t *testing.T) *enrollAppliance {
	t.Helper()
	ca, cert := testPKI(t)
	a := &enrollAppliance{caPEM: ca.CertPEM, pin: agentapi.PinOf(ca.Cert)}
	dir := t.TempDir()
	rendered := filepath.Join(dir, "rendered")
	a.store = nodestate.Open(filepath.Join(dir, "nodes"))
	a.enroll = server.NewEnrollment(rendered, filepath.Join(dir, "enrolment"),
		[]server.EnrollNode{{Name: "w1", BMC: true, MAC: enrollMAC, SystemUUID: enrollUUID}}, a.store, nil)
	a.enroll.Now = func() time.Time {
		if ns := a.frozen.Load(); ns != 0 {
			return time.Unix(0, ns)
		}
		return time.Now()
	}
	s, err := server.New(server.Options{
		Listen: "127.0.0.1:0", Certificate: cert, CAPEM: ca.CertPEM, Enroll: a.enroll,
		Ignition: server.NewIgnitionStore(rendered, map[string]string{"w1": "tok-w1"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == agentapi.EnrollPathV1 && a.drop.Load() > 0 {
			a.drop.Add(-1)
			h.ServeHTTP(httptest.NewRecorder(), r) // handled, then the answer is lost
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	ts.TLS = s.TLSConfig()
	ts.TLS.NextProtos = []string{"http/1.1"} // Hijack needs HTTP/1
	ts.StartTLS()
	t.Cleanup(ts.Close)
	a.url = ts.URL
	cfg, err := agentapi.Configuration{Node: "w1", Roles: []string{"worker"}, ApplianceURL: a.url, CAPin: a.pin, Token: "tok-w1"}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string][]byte{
		filepath.Join(rendered, "w1", statedir.AgentConfigFile):           cfg,
		filepath.Join(rendered, "w1", statedir.IgnitionDir, "3.3.0.json"): []byte(`{"ignition":{"version":"3.3.0"}}`),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := a.store.Set("w1", st, ""); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

func (a *enrollAppliance) options(t *testing.T, key ed25519.PrivateKey) EnrollOptions {
	t.Helper()
	ca, err := FetchCA(context.Background(), a.url, a.pin)
	if err != nil {
		t.Fatal(err)
	}
	return EnrollOptions{ApplianceURL: a.url, CAPin: a.pin, CAPEM: ca, Key: key,
		MACs: []string{"52:54:00:01:c8:00", enrollMAC}, SystemUUID: enrollUUID, RetryFor: 30 * time.Second}
}

// TestEnrollAgainstAppliance: the machine fetches the pinned CA, enrols with a new key and gets w1's
// configuration with its token; the token then fetches w1's Ignition config in the Authorization
// header; a lost answer is retried with the same key and answered again; a second machine (another
// key) claiming w1 is refused with the appliance's reason and ErrEnrollRefused, after one request.
func TestEnrollAgainstAppliance(t *testing.T) {
	a := newEnrollAppliance(t)
	ctx := context.Background()
	keyPath := filepath.Join(t.TempDir(), "run", "enroll.key")
	key, created, err := LoadOrCreateKey(keyPath)
	if err != nil || !created {
		t.Fatalf("LoadOrCreateKey: %v created=%v", err, created)
	}
	if st, err := os.Stat(keyPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", st, err)
	}
	a.drop.Store(1) // the first answer is lost on the way back
	res, err := Enroll(ctx, a.options(t, key))
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if res.Config.Node != "w1" || res.Config.Token != "tok-w1" || res.Config.CAPin != a.pin || res.Attempts != 2 {
		t.Errorf("enrolled %+v after %d attempts, want w1's config after 2 (one answer lost)", res.Config, res.Attempts)
	}
	rec, found, err := a.enroll.ReadRecord("w1")
	if err != nil || !found || rec.PublicKey != base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey)) || rec.KeyFingerprint != res.Response.KeyFingerprint || len(rec.Nonces) != 2 {
		t.Errorf("appliance record %+v (found %v, %v), want the key bound and both nonces", rec, found, err)
	}
	// The same key from the file: `hostagent enroll` restarted by the boot script.
	again, created, err := LoadOrCreateKey(keyPath)
	if err != nil || created || !again.Equal(key) {
		t.Fatalf("LoadOrCreateKey again: %v created=%v same=%v", err, created, again.Equal(key))
	}
	if res2, err := Enroll(ctx, a.options(t, again)); err != nil || res2.Config.Token != "tok-w1" {
		t.Errorf("retry with the same key: %v %+v", err, res2.Config)
	}
	ign, err := FetchIgnition(ctx, a.url, a.caPEM, res.Config.Node, res.Config.Token, "3.3.0")
	if err != nil || !strings.Contains(string(ign), `"version":"3.3.0"`) {
		t.Errorf("FetchIgnition: %v %s", err, ign)
	}
	if _, err := FetchIgnition(ctx, a.url, a.caPEM, "w1", "wrong", "3.3.0"); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Errorf("FetchIgnition with a wrong token: %v, want HTTP 401", err)
	}

	_, other, _ := ed25519.GenerateKey(nil)
	_, err = Enroll(ctx, a.options(t, other))
	if !errors.Is(err, ErrEnrollRefused) || !strings.Contains(err.Error(), "HTTP 409") || !strings.Contains(err.Error(), "already enrolled with another key") {
		t.Errorf("second machine: %v, want ErrEnrollRefused with the 409's reason", err)
	}
}

// TestEnrollCorrectsClockSkew: a machine whose clock is an hour behind (no NTP in an initramfs) is
// refused once for its timestamp, signs again with the appliance's time from the refusal's Date
// header, and enrols.
func TestEnrollCorrectsClockSkew(t *testing.T) {
	a := newEnrollAppliance(t)
	_, key, _ := ed25519.GenerateKey(nil)
	o := a.options(t, key)
	o.Now = func() time.Time { return time.Now().Add(-time.Hour) }
	res, err := Enroll(context.Background(), o)
	if err != nil || res.Attempts != 2 || res.Config.Node != "w1" {
		t.Fatalf("Enroll with a skewed clock: %v, %d attempts, want w1 after 2", err, res.Attempts)
	}
}

// TestEnrollRetriesRateLimit: a machine whose source address has used up the appliance's
// enrolment rate limit (pkg/server.EnrollSourceBurst requests at once, here junk from this address)
// is answered 429, retries with backoff like after a 5xx, and enrols (a 429 is not a refusal).
func TestEnrollRetriesRateLimit(t *testing.T) {
	a := newEnrollAppliance(t)
	_, key, _ := ed25519.GenerateKey(nil)
	o := a.options(t, key)
	// The appliance's clock stands still (its buckets do not refill) until the machine has been
	// answered 429 and says it retries; then it moves on a minute.
	start := time.Now()
	a.frozen.Store(start.UnixNano())
	o.Log = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		if bytes.Contains(p, []byte("status=429")) {
			a.frozen.Store(start.Add(time.Minute).UnixNano())
		}
		return len(p), nil
	}), nil))
	hc := pinnedClient(mustPool(t, o.CAPEM))
	for range server.EnrollSourceBurst {
		resp, err := hc.Post(a.url+agentapi.EnrollPathV1, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	hc.CloseIdleConnections()
	res, err := Enroll(context.Background(), o)
	if err != nil || res.Config.Node != "w1" || res.Attempts != 2 {
		t.Fatalf("Enroll after the source's limit was used up: %v, %d attempts, want w1 after one retry of the 429", err, res.Attempts)
	}
}

// TestEnrollWaitsForApproval: where the operator approves enrolments, the machine is answered 202
// (pending) and does not give up: it logs its key fingerprint, its address and what the operator
// runs, asks again with the same key, backing off, and once the operator has approved that key
// (server.ApproveEnrollment, what `appliance node approve` runs) its next request gets the token.
func TestEnrollWaitsForApproval(t *testing.T) {
	a := newEnrollAppliance(t)
	a.enroll.RequireApproval = true
	_, key, _ := ed25519.GenerateKey(nil)
	fp := agentapi.KeyFingerprint(key.Public().(ed25519.PublicKey))
	o := a.options(t, key)
	o.PendingBackOff = backoff.NewConstantBackOff(50 * time.Millisecond)
	var log logbuf.Buffer
	o.Log = slog.New(slog.NewTextHandler(&log, nil))
	type result struct {
		res Enrolled
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := Enroll(context.Background(), o)
		done <- result{res, err}
	}()
	// The appliance holds the binding pending while the machine asks again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, found, err := a.enroll.ReadRecord("w1")
		if err != nil {
			t.Fatal(err)
		}
		if found && rec.Pending && len(rec.Nonces) >= 3 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("Enroll returned while the enrolment was pending: %+v %v", r.res, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the machine did not keep asking while pending: %+v\n%s", rec, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(log.String(), "level=WARN msg=\"the enrolment waits for the operator's approval") || !strings.Contains(log.String(), "key="+fp) ||
		!strings.Contains(log.String(), "appliance node approve w1 --fingerprint "+fp) {
		t.Errorf("the machine's log does not show its key and what the operator runs:\n%s", log.String())
	}
	if strings.Count(log.String(), "level=WARN") != 1 {
		t.Errorf("the pending wait was logged more than once at warn:\n%s", log.String())
	}
	if _, err := server.ApproveEnrollment(a.enroll.RecordDir, "w1", fp, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.res.Config.Token != "tok-w1" || r.res.Pending <= 0 || r.res.Attempts < 4 {
			t.Fatalf("after the approval: %v, token %q, pending %s, %d attempts", r.err, r.res.Config.Token, r.res.Pending, r.res.Attempts)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the machine did not enrol within 20 s of the approval")
	}
}

// TestEnrollNotApprovedInTime: an enrolment nobody approves ends after PendingFor with
// ErrNotApproved, naming the key and what the operator runs.
func TestEnrollNotApprovedInTime(t *testing.T) {
	a := newEnrollAppliance(t)
	a.enroll.RequireApproval = true
	_, key, _ := ed25519.GenerateKey(nil)
	o := a.options(t, key)
	o.PendingBackOff = backoff.NewConstantBackOff(50 * time.Millisecond)
	o.PendingFor = 300 * time.Millisecond
	_, err := Enroll(context.Background(), o)
	if !errors.Is(err, ErrNotApproved) || !strings.Contains(err.Error(), "appliance node approve w1") || !strings.Contains(err.Error(), agentapi.KeyFingerprint(key.Public().(ed25519.PublicKey))) {
		t.Errorf("an enrolment never approved: %v, want ErrNotApproved naming the key and the command", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestEnrollRefusedIsNotRetried: a machine the appliance does not know (no MAC of the inventory)
// gets ErrEnrollRefused and the appliance's reason after one request, without naming any node.
func TestEnrollRefusedIsNotRetried(t *testing.T) {
	a := newEnrollAppliance(t)
	_, key, _ := ed25519.GenerateKey(nil)
	o := a.options(t, key)
	o.MACs = []string{"52:54:00:09:09:09"}
	_, err := Enroll(context.Background(), o)
	if !errors.Is(err, ErrEnrollRefused) || !strings.Contains(err.Error(), "HTTP 403") || !strings.Contains(err.Error(), "no node of the inventory") || strings.Contains(err.Error(), "w1") {
		t.Errorf("unknown machine: %v", err)
	}
}

// TestSystemMACsAndUUID reads this machine's real NICs (via the kernel) and checks the shapes; the
// UUID reader takes a missing file (no DMI) as "none" and lowercases.
func TestSystemMACsAndUUID(t *testing.T) {
	macs, err := SystemMACs()
	if err != nil {
		t.Fatal(err)
	}
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 && len(i.HardwareAddr) == 6 && i.HardwareAddr.String() != "00:00:00:00:00:00" {
			found := false
			for _, m := range macs {
				found = found || m == i.HardwareAddr.String()
			}
			if !found {
				t.Errorf("SystemMACs %v lacks %s (%s)", macs, i.HardwareAddr, i.Name)
			}
		}
	}
	for _, m := range macs {
		if m == "00:00:00:00:00:00" {
			t.Errorf("SystemMACs lists the loopback's zero address: %v", macs)
		}
	}
	dir := t.TempDir()
	if u, err := SystemUUID(filepath.Join(dir, "absent")); err != nil || u != "" {
		t.Errorf("absent file: %q %v", u, err)
	}
	p := filepath.Join(dir, "product_uuid")
	_ = os.WriteFile(p, []byte(strings.ToUpper(enrollUUID)+"\n"), 0o400)
	if u, err := SystemUUID(p); err != nil || u != enrollUUID {
		t.Errorf("SystemUUID: %q %v, want %s", u, err, enrollUUID)
	}
	_ = os.WriteFile(p, []byte("Not Settable\n"), 0o400)
	if u, err := SystemUUID(p); err != nil || u != "" {
		t.Errorf("no UUID in the file: %q %v, want none", u, err)
	}
}

func mustPool(t *testing.T, caPEM []byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}
	return pool
}
