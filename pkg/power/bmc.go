package power

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/stmcginnis/gofish/common"
)

// BMC kinds accepted by BMCOptions.Kind (the same strings as Target.Kind).
const (
	KindIPMI    = "ipmi"
	KindRedfish = "redfish"
)

// bmclib provider names (registrar driver names) this package uses, one per kind.
const (
	providerIPMI    = "ipmitool"
	providerRedfish = "gofish"
)

// BMCOptions configures NewBMC.
type BMCOptions struct {
	// Kind is KindIPMI (IPMI v2.0 / RMCP+ through the ipmitool binary) or KindRedfish (DMTF
	// Redfish over HTTPS through gofish).
	Kind string
	// Host is the BMC's IP address or DNS name, without port or scheme.
	Host string
	// Port: UDP port for IPMI (0 → 623), TCP port for Redfish (0 → 443).
	Port int
	// Username and Password are the BMC credentials. Password is never logged.
	Username string
	Password string
	// CAPEM holds the PEM CA certificates the Redfish BMC's certificate must chain to. Empty →
	// the system roots. Ignored for IPMI.
	CAPEM []byte
	// InsecureSkipVerify turns Redfish TLS verification off (bmclib's default, which this
	// package never uses unless asked). A warning is logged.
	InsecureSkipVerify bool
	// CipherSuite is the RMCP+ cipher suite ID for IPMI ("3", "17"). Empty → negotiated once, on
	// the first operation: 3 then 17 (bmclib's order), the first that establishes a session is
	// kept for every later command, so a command the BMC refuses is never retried with another
	// suite (whose session error would hide the BMC's own answer). OpenIPMI's ipmi_sim only speaks 3.
	CipherSuite string
	// Timeout bounds each BMC operation (bmclib's per-provider timeout). 0 → DefaultTimeout.
	Timeout time.Duration
	// Log receives debug lines (never secrets). nil → discarded.
	Log *slog.Logger
}

// bmcController is a Controller over one bmclib client restricted to a single provider.
type bmcController struct {
	o        BMCOptions
	provider string
	ipmitool string // path, IPMI only
	log      *slog.Logger

	mu     sync.Mutex // bmclib.Client is not safe for concurrent use
	client *bmclib.Client
	opened bool
	// basicAuth: the Redfish service offers no sessions; every request carries HTTP basic auth.
	basicAuth bool
	rootCAs   *x509.CertPool  // Redfish: the CAs the BMC's certificate must chain to (nil: system roots)
	opts      []bmclib.Option // the client's options, to rebuild it once the IPMI cipher suite is known
}

// NewBMC builds a Controller for an IPMI or Redfish BMC with bmclib v2, restricted to one
// provider (ipmitool for IPMI, gofish for Redfish) so bmclib never probes other protocols. Redfish
// TLS is verified against CAPEM (or the system roots) unless InsecureSkipVerify. It does not
// contact the BMC. Errors: ErrUnsupported for an unknown kind; a plain error when ipmitool is not
// installed, the CA PEM holds no certificate, or DEBUG_BMCLIB=true (bmclib would then dump
// requests, passwords included, to stdout).
func NewBMC(ctx context.Context, o BMCOptions) (Controller, error) {
	_ = ctx
	if o.Host == "" {
		return nil, fmt.Errorf("BMC host is empty: set power.address")
	}
	if os.Getenv("DEBUG_BMCLIB") == "true" {
		return nil, fmt.Errorf("DEBUG_BMCLIB=true makes bmclib print BMC passwords to stdout: unset it")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	c := &bmcController{o: o, log: orDiscard(o.Log).With("bmc", o.Host)}
	opts := []bmclib.Option{bmclib.WithPerProviderTimeout(o.Timeout)}
	switch o.Kind {
	case KindIPMI:
		if o.Port == 0 {
			o.Port = 623
		}
		// The ipmitool provider registers only if the binary is found when the client is made.
		p, err := lookIpmitool()
		if err != nil {
			return nil, err
		}
		c.ipmitool = p
		c.provider = providerIPMI
		opts = append(opts, bmclib.WithIpmitoolPort(strconv.Itoa(o.Port)), bmclib.WithIpmitoolPath(p))
		if o.CipherSuite != "" {
			opts = append(opts, bmclib.WithIpmitoolCipherSuite(o.CipherSuite))
		}
	case KindRedfish:
		if o.Port == 0 {
			o.Port = 443
		}
		c.provider = providerRedfish
		opts = append(opts, bmclib.WithRedfishPort(strconv.Itoa(o.Port)))
		if o.InsecureSkipVerify {
			c.log.Warn("Redfish TLS verification is off: anyone on the path can read the BMC password", "bmc", o.Host)
		} else {
			var pool *x509.CertPool // nil → system roots
			if len(o.CAPEM) > 0 {
				pool = x509.NewCertPool()
				if !pool.AppendCertsFromPEM(o.CAPEM) {
					return nil, fmt.Errorf("Redfish CA for %s holds no PEM certificate: check power.caFile", o.Host)
				}
			}
			opts = append(opts, bmclib.WithSecureTLS(pool))
			c.rootCAs = pool
		}
	default:
		return nil, fmt.Errorf("BMC kind %q: %w (use %s or %s)", o.Kind, ErrUnsupported, KindIPMI, KindRedfish)
	}
	c.o = o
	c.opts = opts
	if err := c.newClient(); err != nil {
		return nil, err
	}
	return c, nil
}

// newClient (re)builds the bmclib client from c.opts, restricted to c.provider.
func (c *bmcController) newClient() error {
	host := c.o.Host
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]" // bmclib joins host+":"+port for both providers
	}
	cl := bmclib.NewClient(host, c.o.Username, c.o.Password, c.opts...)
	cl.Registry.Drivers = cl.Registry.For(c.provider)
	if len(cl.Registry.Drivers) == 0 {
		return fmt.Errorf("bmclib has no %s provider for %s", c.provider, c.o.Host)
	}
	c.client = cl
	return nil
}

// negotiateSuiteLocked finds the RMCP+ cipher suite this BMC accepts (3, then 17) with a read-only
// `chassis power status`, and pins it on the bmclib client. No-op when a suite is configured or
// already found. A session that fails with every suite returns the last error (classify tells a
// wrong password from a dead BMC).
func (c *bmcController) negotiateSuiteLocked(ctx context.Context) error {
	if c.provider != providerIPMI || c.o.CipherSuite != "" {
		return nil
	}
	suite, _, err := c.ipmitoolTry(ctx, []string{"3", "17"}, "chassis", "power", "status")
	if suite == "" {
		return err
	}
	c.log.Debug("IPMI cipher suite negotiated", "suite", suite)
	c.o.CipherSuite = suite
	c.opts = append(c.opts, bmclib.WithIpmitoolCipherSuite(suite))
	return c.newClient()
}

func lookIpmitool() (string, error) {
	if p, err := exec.LookPath("ipmitool"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/ipmitool", "/usr/sbin/ipmitool", "/usr/local/bin/ipmitool"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("IPMI needs the ipmitool binary, which is not on PATH: install the ipmitool package")
}

// op runs f under the controller lock with a per-operation timeout, opening the bmclib session
// first (Redfish: service root + session login) and classifying errors.
func (c *bmcController) op(ctx context.Context, name string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	err := c.openLocked(ctx)
	if err == nil {
		err = f(ctx)
	}
	if err != nil {
		err = c.classify(ctx, name, err)
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrUnreachable) {
			c.opened = false // log in again next time (session expired, BMC rebooted)
		}
	}
	c.log.Debug("bmc operation", "op", name, "provider", c.provider, "duration", time.Since(start), "error", err)
	return err
}

func (c *bmcController) openLocked(ctx context.Context) error {
	if c.provider == providerIPMI { // ipmitool's Open is only a power-status probe
		return c.negotiateSuiteLocked(ctx)
	}
	if c.opened {
		return nil
	}
	err := c.client.Open(ctx)
	if err != nil && !c.basicAuth && ctx.Err() == nil {
		// A service without a SessionService (sushy-tools, older BMCs) fails the session login
		// (gofish: "no target provided", or a 404): like OpenStack's sushy client, fall back to HTTP
		// basic auth, once, and keep it. Not for errors a login method cannot change.
		if cl := c.classify(ctx, "open", err); !errors.Is(cl, ErrUnreachable) && !errors.Is(cl, ErrCertificate) && !errors.Is(cl, ErrAuth) {
			c.log.Debug("Redfish session login failed; trying HTTP basic auth", "error", err)
			c.basicAuth = true
			c.opts = append(c.opts, bmclib.WithRedfishUseBasicAuth(true))
			if nerr := c.newClient(); nerr != nil {
				return nerr
			}
			if berr := c.client.Open(ctx); berr != nil {
				return fmt.Errorf("session login: %w; basic auth: %w", err, berr)
			}
			err = nil
		}
	}
	if err != nil {
		return err
	}
	c.opened = true
	return nil
}

func (c *bmcController) PowerOn(ctx context.Context) error {
	return c.op(ctx, "power on", func(ctx context.Context) error { return c.setPower(ctx, "on") })
}

func (c *bmcController) PowerOff(ctx context.Context) error {
	return c.op(ctx, "power off", func(ctx context.Context) error { return c.setPower(ctx, "off") })
}

func (c *bmcController) PowerCycle(ctx context.Context) error {
	return c.op(ctx, "power cycle", func(ctx context.Context) error {
		s, err := c.client.GetPowerState(ctx)
		if err != nil {
			return err
		}
		if ParseState(s) == StateOff {
			return c.setPower(ctx, "on")
		}
		return c.setPower(ctx, "cycle")
	})
}

func (c *bmcController) setPower(ctx context.Context, state string) error {
	ok, err := c.client.SetPowerState(ctx, state)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("BMC did not confirm power %s", state)
	}
	return nil
}

func (c *bmcController) PowerState(ctx context.Context) (State, error) {
	st := StateUnknown
	err := c.op(ctx, "power status", func(ctx context.Context) error {
		s, err := c.client.GetPowerState(ctx)
		if err != nil {
			return err
		}
		st = ParseState(s)
		if st == StateUnknown {
			c.log.Debug("unrecognised power state", "state", strings.TrimSpace(s))
		}
		return nil
	})
	if err != nil {
		return StateUnknown, err
	}
	return st, nil
}

func (c *bmcController) SetBootDevice(ctx context.Context, dev BootDevice, persistent bool) error {
	if !dev.valid() {
		return fmt.Errorf("boot device %q: %w (use disk, pxe or cdrom)", dev, ErrUnsupported)
	}
	return c.op(ctx, "set boot device", func(ctx context.Context) error {
		ok, err := c.client.SetBootDevice(ctx, string(dev), persistent, false)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("BMC did not confirm boot device %s", dev)
		}
		got, gotPersistent, checkPersistent, err := c.readBootDevice(ctx)
		if err != nil {
			return fmt.Errorf("read back boot override: %w", err)
		}
		if got != dev || (checkPersistent && gotPersistent != persistent) {
			return fmt.Errorf("%w: set %s (persistent=%t), BMC reports %s (persistent=%t)", ErrBootDeviceNotApplied, dev, persistent, got, gotPersistent)
		}
		return nil
	})
}

// readBootDevice reads the boot override back. Redfish: Boot.BootSourceOverrideTarget/Enabled via
// bmclib. IPMI: bmclib's ipmitool provider cannot read it (v2.3.5), so this runs
// `ipmitool chassis bootparam get 5` (IPMI v2.0 §28.13, boot flags parameter 5) and decodes the
// device selector, data byte 2 bits 5:2. The persistence bit is not compared for IPMI: simulators
// and many BMCs clear or never store it (checkPersistent=false).
func (c *bmcController) readBootDevice(ctx context.Context) (dev BootDevice, persistent, checkPersistent bool, err error) {
	if c.provider == providerRedfish {
		ov, err := c.client.GetBootDeviceOverride(ctx)
		if err != nil {
			return "", false, false, err
		}
		return BootDevice(ov.Device), ov.IsPersistent, true, nil
	}
	out, err := c.ipmitoolRun(ctx, "chassis", "bootparam", "get", "5")
	if err != nil {
		return "", false, false, err
	}
	d, err := parseBootFlags(out)
	return d, false, false, err
}

// parseBootFlags decodes ipmitool's "Boot parameter data: 0014000000" line (boot flags, IPMI v2.0
// table 28-14): byte 2 bits 5:2 are the device selector (1 PXE, 2 hard drive, 5 CD/DVD).
func parseBootFlags(out []byte) (BootDevice, error) {
	for _, line := range strings.Split(string(out), "\n") {
		h, ok := strings.CutPrefix(strings.TrimSpace(line), "Boot parameter data:")
		if !ok {
			continue
		}
		b, err := hex.DecodeString(strings.TrimSpace(h))
		if err != nil || len(b) < 2 {
			return "", fmt.Errorf("cannot decode boot flags %q", strings.TrimSpace(h))
		}
		switch (b[1] >> 2) & 0xf {
		case 1:
			return BootPXE, nil
		case 2:
			return BootDisk, nil
		case 5:
			return BootCDROM, nil
		default:
			return BootDevice(fmt.Sprintf("selector-%d", (b[1]>>2)&0xf)), nil
		}
	}
	return "", fmt.Errorf("ipmitool printed no boot parameter data")
}

// ipmitoolRun runs ipmitool over lanplus with the password in IPMITOOL_PASSWORD (never on the
// command line), with the configured or negotiated cipher suite (3 then 17 before negotiation).
func (c *bmcController) ipmitoolRun(ctx context.Context, args ...string) ([]byte, error) {
	suites := []string{"3", "17"}
	if c.o.CipherSuite != "" {
		suites = []string{c.o.CipherSuite}
	}
	_, out, err := c.ipmitoolTry(ctx, suites, args...)
	return out, err
}

// ipmitoolTry runs one ipmitool command with each suite in turn, moving on only while the RMCP+
// session itself fails. suite is the one whose session was established ("" when none was), also
// when the command then failed: its error carries the BMC's own words.
func (c *bmcController) ipmitoolTry(ctx context.Context, suites []string, args ...string) (suite string, out []byte, err error) {
	for _, cs := range suites {
		argv := []string{"-I", "lanplus", "-H", c.o.Host, "-p", strconv.Itoa(c.o.Port), "-U", c.o.Username, "-E", "-N", "5", "-C", cs}
		cmd := exec.CommandContext(ctx, c.ipmitool, append(argv, args...)...)
		cmd.Env = []string{"IPMITOOL_PASSWORD=" + c.o.Password}
		out, err = cmd.CombinedOutput()
		if err == nil {
			return cs, out, nil
		}
		if ctx.Err() != nil {
			return "", out, ctx.Err()
		}
		if !ipmiSessionFailed(string(out)) {
			return cs, out, fmt.Errorf("ipmitool %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	return "", out, fmt.Errorf("ipmitool %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
}

// ipmiSessionFailed reports whether ipmitool's output says the RMCP+ session was not established
// (wrong credentials, unsupported cipher suite, no answer), as opposed to a command the BMC refused.
func ipmiSessionFailed(msg string) bool {
	for _, s := range []string{"Unable to establish IPMI v2", "RMCP+ session", "authentication algorithm",
		"Error: Unable to establish", "Insufficient privilege level", "Unauthorized name"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// classify wraps err with the sentinel that says what to fix.
func (c *bmcController) classify(ctx context.Context, op string, err error) error {
	addr := net.JoinHostPort(c.o.Host, strconv.Itoa(c.o.Port))
	msg := err.Error()
	switch c.provider {
	case providerIPMI:
		if ipmiSessionFailed(msg) || errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// ipmitool prints the same line for a wrong password and a dead BMC: ask the BMC
			// whether it is there with an RMCP presence ping (ASF 2.0).
			pctx, cancel := context.WithTimeout(context.Background(), time.Second)
			alive := rmcpPing(pctx, addr) == nil
			cancel()
			if alive && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s: IPMI BMC %s answers but refused the RMCP+ session: check power.username and the password in power.passwordFile (the user needs administrator privilege and cipher suite 3 or 17): %w: %w", op, addr, ErrAuth, err)
			}
			if !alive {
				return fmt.Errorf("%s: no IPMI answer from %s (RMCP ping unanswered): check power.address, the BMC's network and that IPMI over LAN is enabled: %w: %w", op, addr, ErrUnreachable, err)
			}
		} else if strings.Contains(msg, "exit status") {
			// The session was established (the suite is pinned once negotiated) and the BMC
			// itself answered the command with a failure: its words are in err.
			return fmt.Errorf("%s: IPMI BMC %s accepted the session but the command failed (see the BMC's answer; its chassis or power supply may be at fault): %w: %w", op, addr, ErrCommandFailed, err)
		}
	case providerRedfish:
		var rfErr *common.Error
		var certErr *tls.CertificateVerificationError
		var uaErr x509.UnknownAuthorityError
		var hnErr x509.HostnameError
		switch {
		case errors.As(err, &rfErr) && (rfErr.HTTPReturnedStatusCode == 401 || rfErr.HTTPReturnedStatusCode == 403),
			strings.Contains(msg, "401") && (strings.Contains(strings.ToLower(msg), "unauthorized") || strings.Contains(strings.ToLower(msg), "password")):
			return fmt.Errorf("%s: Redfish BMC %s refused the login: check power.username and the password in power.passwordFile: %w: %w", op, addr, ErrAuth, err)
		case errors.As(err, &certErr), errors.As(err, &uaErr), errors.As(err, &hnErr),
			// An insert's error quotes the BMC's own words about the image server's certificate
			// (a task's message): that is not the BMC's certificate.
			!errors.Is(err, ErrVirtualMediaNotInserted) && (strings.Contains(msg, "x509:") || strings.Contains(msg, "tls: failed to verify")):
			return fmt.Errorf("%s: Redfish BMC %s presented a certificate that does not verify: put the CA that signed it in power.caFile (insecureSkipVerify only for a lab): %w: %w", op, addr, ErrCertificate, err)
		}
		if isUnreachable(err) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%s: no Redfish answer from %s: check power.address and the BMC's network: %w: %w", op, addr, ErrUnreachable, err)
		}
	}
	return fmt.Errorf("%s: BMC %s: %w", op, addr, err)
}

// isUnreachable reports connection refused, timeouts, unreachable networks and hosts, also when
// only the text survived (bmclib flattens some errors into strings).
func isUnreachable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	m := err.Error()
	for _, s := range []string{"connection refused", "no route to host", "network is unreachable", "i/o timeout", "host is down", "Client.Timeout exceeded", "context deadline exceeded"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

func (c *bmcController) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.opened {
		return nil
	}
	c.opened = false
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	return c.client.Close(ctx)
}
