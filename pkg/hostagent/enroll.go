package hostagent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/ignition"
)

// SystemUUIDPath is where Linux shows the SMBIOS system UUID (drivers/firmware/dmi-id.c; readable by
// root only).
const SystemUUIDPath = "/sys/class/dmi/id/product_uuid"

// ErrEnrollRefused is wrapped when the appliance refuses the enrolment (a 4xx): retrying the same
// request will not help; the error carries the appliance's reason.
var ErrEnrollRefused = errors.New("the appliance refused the enrolment")

// EnrollOptions are the inputs of Enroll.
type EnrollOptions struct {
	// ApplianceURL is https://host:port of the appliance front.
	ApplianceURL string
	// CAPin is the pin of the appliance CA (agentapi.PinOf format); it is signed into the request.
	CAPin string
	// CAPEM is the pinned CA (FetchCA's answer): the only certificate trusted.
	CAPEM []byte
	// Key is the machine's enrolment key (LoadOrCreateKey). Required.
	Key ed25519.PrivateKey
	// MACs are the machine's NIC addresses; nil means SystemMACs.
	MACs []string
	// SystemUUID is the SMBIOS system UUID; "" means read SystemUUIDPath (none if it is missing).
	SystemUUID string
	// RetryFor bounds the retries of network errors, 5xx answers (the appliance restarting) and 429
	// (its rate limit); zero means 5 minutes. Another 4xx is never retried, except once after
	// correcting a clock skew.
	RetryFor time.Duration
	// PendingFor bounds the wait for the operator's approval (202 agentapi.EnrollPending answers:
	// boot.enrolment.approval operator); zero means agentapi.EnrollWindow. The appliance ends the
	// wait sooner with a refusal once the node's enrolment window closes.
	PendingFor time.Duration
	// PendingBackOff spaces the requests while the enrolment is pending; nil means exponential from
	// the appliance's Retry-After (agentapi.EnrollPendingRetry) up to MaxPendingWait, so an approval
	// takes effect within MaxPendingWait.
	PendingBackOff backoff.BackOff
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives progress (never the token); nil discards.
	Log *slog.Logger
}

// Enrolled is what an accepted enrolment gave.
type Enrolled struct {
	// Response is the appliance's answer as received (it holds the token).
	Response agentapi.EnrollResponse
	// Config is Response.HostagentConfig parsed.
	Config agentapi.Configuration
	// Attempts is how many requests it took.
	Attempts int
	// Pending is how long the enrolment waited for the operator's approval (zero: it did not).
	Pending time.Duration
}

// MaxPendingWait is the longest wait between two requests of an enrolment that waits for the
// operator's approval (with the default EnrollOptions.PendingBackOff).
const MaxPendingWait = 30 * time.Second

// ErrNotApproved is wrapped when the operator did not approve the enrolment within
// EnrollOptions.PendingFor.
var ErrNotApproved = errors.New("the enrolment was not approved in time")

// answer is one request's outcome: the enrolment (200), or a pending answer (202) with its
// Retry-After.
type answer struct {
	resp       agentapi.EnrollResponse
	pending    *agentapi.EnrollPending
	retryAfter time.Duration
}

// Enroll asks the appliance for this machine's node credential (POST agentapi.EnrollPathV1; the
// exchange is described in pkg/agentapi): it signs an agentapi.EnrollRequest with o.Key (a new nonce
// and timestamp per attempt) carrying the machine's MACs and SMBIOS system UUID, trusts only
// o.CAPEM, and checks that the answer's configuration is for the node the answer names and for this
// appliance (URL and pin).
//
// A refused request (4xx) ends with ErrEnrollRefused and the appliance's reason, except a refusal
// whose Date header shows the machine's clock is off by more than agentapi.EnrollClockSkew: then it
// is signed again once with the appliance's time (a machine in an initramfs often has no NTP).
// Network errors and 5xx answers are retried with exponential backoff for o.RetryFor; a lost
// answer is safe to retry with the same key (the appliance answers it again).
//
// A 202 answer (agentapi.EnrollPending: the operator approves enrolments) is not an error: it is
// logged (the key fingerprint and address the operator compares, and what the operator runs;
// warn the first time, then once a minute) and the request is sent again with the same key, backing
// off (o.PendingBackOff) for up to o.PendingFor, until the approval gives a 200 or a refusal ends it;
// past o.PendingFor, ErrNotApproved.
func Enroll(ctx context.Context, o EnrollOptions) (Enrolled, error) {
	if len(o.Key) != ed25519.PrivateKeySize {
		return Enrolled{}, errors.New("enrol: no Ed25519 key")
	}
	u, err := url.Parse(o.ApplianceURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return Enrolled{}, fmt.Errorf("appliance URL %q: want https://host:port", o.ApplianceURL)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(o.CAPEM) {
		return Enrolled{}, errors.New("appliance CA: no PEM certificate")
	}
	macs := o.MACs
	if macs == nil {
		if macs, err = SystemMACs(); err != nil {
			return Enrolled{}, err
		}
	}
	if len(macs) == 0 {
		return Enrolled{}, errors.New("enrol: this machine shows no NIC with a MAC address (is its network driver loaded?)")
	}
	uuid := o.SystemUUID
	if uuid == "" {
		if uuid, err = SystemUUID(SystemUUIDPath); err != nil {
			return Enrolled{}, err
		}
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	retryFor := o.RetryFor
	if retryFor <= 0 {
		retryFor = 5 * time.Minute
	}
	pendingFor := o.PendingFor
	if pendingFor <= 0 {
		pendingFor = agentapi.EnrollWindow
	}
	hc := pinnedClient(pool)
	defer hc.CloseIdleConnections()
	endpoint := strings.TrimRight(o.ApplianceURL, "/") + agentapi.EnrollPathV1

	var offset time.Duration // the appliance's clock minus ours, once a refusal showed a skew
	corrected := false
	attempts := 0
	request := func() (answer, error) {
		for {
			attempts++
			nonce := make([]byte, 16)
			if _, err := rand.Read(nonce); err != nil {
				return answer{}, backoff.Permanent(err)
			}
			req := agentapi.EnrollRequest{MACs: macs, SystemUUID: uuid, Timestamp: now().Add(offset).UTC(),
				Nonce: base64.RawURLEncoding.EncodeToString(nonce), CAPin: o.CAPin}
			req.Sign(o.Key)
			body, err := json.Marshal(req)
			if err != nil {
				return answer{}, backoff.Permanent(err)
			}
			hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
			if err != nil {
				return answer{}, backoff.Permanent(err)
			}
			hreq.Header.Set("Content-Type", "application/json")
			hresp, err := hc.Do(hreq)
			if err != nil {
				log.Info("enrolment request failed; retrying", "error", err)
				return answer{}, fmt.Errorf("POST %s: %w", agentapi.EnrollPathV1, err)
			}
			data, err := io.ReadAll(io.LimitReader(hresp.Body, maxNodeConfigBytes))
			hresp.Body.Close()
			if err != nil {
				return answer{}, fmt.Errorf("POST %s: %w", agentapi.EnrollPathV1, err)
			}
			switch {
			case hresp.StatusCode == http.StatusOK:
				var out agentapi.EnrollResponse
				if err := json.Unmarshal(data, &out); err != nil {
					return answer{}, backoff.Permanent(fmt.Errorf("enrolment answer: %w", err))
				}
				return answer{resp: out}, nil
			case hresp.StatusCode == http.StatusAccepted:
				var p agentapi.EnrollPending
				if err := json.Unmarshal(data, &p); err != nil {
					return answer{}, backoff.Permanent(fmt.Errorf("pending enrolment answer: %w", err))
				}
				a := answer{pending: &p, retryAfter: agentapi.EnrollPendingRetry}
				if secs, err := strconv.Atoi(hresp.Header.Get("Retry-After")); err == nil && secs > 0 {
					a.retryAfter = time.Duration(secs) * time.Second
				}
				return a, nil
			case hresp.StatusCode >= 500 || hresp.StatusCode == http.StatusTooManyRequests:
				// 429: the appliance's rate limit (pkg/server.EnrollSourceRate); the backoff spaces the retries.
				log.Info("the appliance answered the enrolment with an error or asked to slow down; retrying", "status", hresp.StatusCode)
				return answer{}, fmt.Errorf("POST %s: HTTP %d: %s", agentapi.EnrollPathV1, hresp.StatusCode, strings.TrimSpace(string(data)))
			}
			if date, derr := http.ParseTime(hresp.Header.Get("Date")); derr == nil && !corrected {
				if skew := date.Sub(now()); skew > agentapi.EnrollClockSkew || skew < -agentapi.EnrollClockSkew {
					log.Warn("this machine's clock is off; signing again with the appliance's time", "skew", skew.Round(time.Second).String())
					offset, corrected = skew, true
					continue
				}
			}
			return answer{}, backoff.Permanent(fmt.Errorf("%w: HTTP %d: %s", ErrEnrollRefused, hresp.StatusCode, strings.TrimSpace(string(data))))
		}
	}
	var pendingSince, reminded time.Time
	pendingBackOff := o.PendingBackOff
	var resp agentapi.EnrollResponse
	for {
		a, err := backoff.Retry(ctx, request, backoff.WithBackOff(backoff.NewExponentialBackOff()), backoff.WithMaxElapsedTime(retryFor))
		if err != nil {
			return Enrolled{}, err
		}
		if a.pending == nil {
			resp = a.resp
			break
		}
		p := a.pending
		switch {
		case pendingSince.IsZero():
			pendingSince, reminded = time.Now(), time.Now()
			if pendingBackOff == nil {
				pendingBackOff = &backoff.ExponentialBackOff{InitialInterval: a.retryAfter, RandomizationFactor: 0.2, Multiplier: 1.5, MaxInterval: MaxPendingWait}
			}
			pendingBackOff.Reset()
			log.Warn("the enrolment waits for the operator's approval: compare this key and address with the appliance's, then the operator approves it; asking again until then",
				"node", p.Node, "key", p.KeyFingerprint, "source", p.Source, "appliance", p.Message)
		case time.Since(reminded) >= time.Minute:
			reminded = time.Now()
			log.Info("the enrolment still waits for the operator's approval", "node", p.Node, "key", p.KeyFingerprint, "waiting", time.Since(pendingSince).Round(time.Second).String())
		}
		wait := pendingBackOff.NextBackOff()
		if wait == backoff.Stop || time.Since(pendingSince)+wait > pendingFor {
			return Enrolled{}, fmt.Errorf("%w: node %s's enrolment with key %s waited %s for the operator's approval (`appliance node approve %s` on the appliance); run the enrolment again to wait longer",
				ErrNotApproved, p.Node, p.KeyFingerprint, time.Since(pendingSince).Round(time.Second), p.Node)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return Enrolled{}, context.Cause(ctx)
		case <-timer.C:
		}
	}
	cfg, err := agentapi.Parse([]byte(resp.HostagentConfig))
	if err != nil {
		return Enrolled{}, fmt.Errorf("enrolment answer: %w", err)
	}
	switch {
	case cfg.Node == "" || cfg.Node != resp.Node:
		return Enrolled{}, fmt.Errorf("enrolment answer: the configuration is for node %q, the answer names %q", cfg.Node, resp.Node)
	case cfg.CAPin != o.CAPin:
		return Enrolled{}, fmt.Errorf("enrolment answer: the configuration pins %s, this machine trusts %s", cfg.CAPin, o.CAPin)
	case cfg.Token == "":
		return Enrolled{}, errors.New("enrolment answer: the configuration has no token")
	}
	log.Debug("enrolled", "node", resp.Node, "key", resp.KeyFingerprint, "attempts", attempts)
	res := Enrolled{Response: resp, Config: cfg, Attempts: attempts}
	if !pendingSince.IsZero() {
		res.Pending = time.Since(pendingSince)
	}
	return res, nil
}

// pinnedClient is the HTTPS client of every hostagent request to the appliance (agent API,
// enrolment, Ignition, artifacts): it trusts pool only, uses no proxy (the network is air-gapped; the
// appliance is reached directly) and gives each request 30 s.
func pinnedClient(pool *x509.CertPool) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			Proxy:               nil,
			DialContext:         dialContext,
			ForceAttemptHTTP2:   true,
			TLSHandshakeTimeout: 10 * time.Second,
			IdleConnTimeout:     90 * time.Second,
		},
		Timeout: 30 * time.Second,
	}
}

// SystemMACs returns the MAC addresses of the machine's NICs as the kernel lists them (net.Interfaces:
// netlink), lowercase and sorted: every interface with a 48-bit hardware address that is not all
// zeros, loopback excluded.
func SystemMACs() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || len(i.HardwareAddr) != 6 || bytes.Equal(i.HardwareAddr, make([]byte, 6)) {
			continue
		}
		if m := i.HardwareAddr.String(); !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out, nil
}

// SystemUUID reads the SMBIOS system UUID from p (SystemUUIDPath), lowercase; "" (no error) when the
// file does not exist (no DMI tables, e.g. some VMs and non-x86 boards) or holds no UUID.
func SystemUUID(p string) (string, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("read the SMBIOS system UUID: %w", err)
	}
	s := strings.ToLower(strings.TrimSpace(string(b)))
	if !agentapi.IsUUID(s) {
		return "", nil
	}
	return s, nil
}

// LoadOrCreateKey returns the Ed25519 key kept at p (PKCS#8, PEM "PRIVATE KEY", RFC 8410), creating
// it (mode 0600, written atomically) when p does not exist; created says which. The same key across
// restarts of `hostagent enroll` lets a retry after a lost answer succeed. Errors: a file that is
// not such a key, file system errors.
func LoadOrCreateKey(p string) (ed25519.PrivateKey, bool, error) {
	b, err := os.ReadFile(p)
	if err == nil {
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "PRIVATE KEY" {
			return nil, false, fmt.Errorf("%s: no PEM PRIVATE KEY block (delete it to create a new key)", p)
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", p, err)
		}
		ek, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, false, fmt.Errorf("%s: not an Ed25519 key (delete it to create a new key)", p)
		}
		return ek, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(path.Dir(p), 0o700); err != nil {
		return nil, false, err
	}
	if _, err := atomicfile.Write(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, false, fmt.Errorf("write the enrolment key: %w", err)
	}
	return k, true, nil
}

// FetchIgnition downloads the node's Ignition config (GET /ignition/<node>) with the token in the
// Authorization header (never in the URL), trusting only caPEM, asking for Ignition spec version
// (e.g. "3.3.0", what Debian's ignition 2.14 parses; pkg/ignition.Negotiate). It is what a booted
// machine hands to `ignition -platform file` after enrolling. Errors: HTTP and network errors.
func FetchIgnition(ctx context.Context, applianceURL string, caPEM []byte, node, token, version string) ([]byte, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("appliance CA: no PEM certificate")
	}
	hc := pinnedClient(pool)
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(applianceURL, "/")+"/ignition/"+url.PathEscape(node), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", ignition.ContentType(version)+", */*;q=0.1")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the Ignition config: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeConfigBytes))
	if err != nil {
		return nil, fmt.Errorf("fetch the Ignition config: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the Ignition config of %s: HTTP %d: %s", node, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, nil
}
