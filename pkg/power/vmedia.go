package power

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// Virtual media (DMTF Redfish VirtualMedia, DSP0268 schema VirtualMedia v1.x): the BMC fetches an ISO
// from a URL itself and presents it to the machine as a CD; the machine then boots it once.

var (
	// ErrVirtualMediaUnsupported: the BMC offers no virtual CD: no VirtualMedia slot whose
	// MediaTypes hold "CD" or "DVD" under its Manager or its System, and no Supermicro
	// legacy VM1/CfgCD. Retrying cannot help; the error says what to check (licence, enablement).
	ErrVirtualMediaUnsupported = errors.New("BMC offers no virtual media CD")
	// ErrVirtualMediaNotInserted: the BMC accepted (or refused) the insert but reading the slot back
	// does not show the image inserted; the error carries the BMC's words and what to check.
	ErrVirtualMediaNotInserted = errors.New("virtual media not inserted")
)

// VirtualMediaBooter is implemented by the Redfish Controller (NewBMC with KindRedfish): it boots a
// node once from an ISO its BMC fetches.
type VirtualMediaBooter interface {
	// BootVirtualMedia inserts o.Image as the BMC's virtual CD, sets a one-time boot override
	// from it (Redfish BootSourceOverrideTarget "Cd", Enabled "Once", read back), and powers the
	// node on, or cycles it when it is already on so that it boots the CD now. Errors wrap
	// ErrVirtualMediaUnsupported, ErrVirtualMediaNotInserted, ErrBootDeviceNotApplied or the
	// Controller's sentinels, and say what to check.
	BootVirtualMedia(ctx context.Context, o VirtualMediaOptions) (VirtualMediaReport, error)
	// EjectVirtualMedia ejects every inserted virtual CD (Redfish EjectMedia through bmclib, which
	// finds the slots under the Manager or, on newer Dell iDRACs, under the System; Supermicro legacy
	// IsoConfig.UnMount) and reads the slots back, then clears a boot override from the CD as
	// ClearVirtualMediaBoot does, so that the next boot is the disk's. Nothing inserted and no CD
	// override: nil. Call it only once the machine no longer reads the CD (the node image's live
	// system runs from it until it reboots into its disk).
	EjectVirtualMedia(ctx context.Context) error
	// ClearVirtualMediaBoot replaces a boot override from the CD (BootSourceOverrideTarget "Cd",
	// whatever its BootSourceOverrideEnabled: a BMC that keeps it Continuous, such as sushy-tools'
	// libvirt driver, would boot the CD again; one that keeps the target after a Once boot shows it
	// too) with a one-time boot from the disk ("Hdd", Once), read back; other overrides are left
	// alone. It touches no media, so it is safe while the machine still runs from the CD. It reports
	// whether it changed the override. Errors wrap ErrBootDeviceNotApplied when the BMC reads back
	// another device.
	ClearVirtualMediaBoot(ctx context.Context) (bool, error)
}

// VirtualMediaOptions says what a BMC inserts.
type VirtualMediaOptions struct {
	// Image is the http:// or https:// URL of the ISO (Redfish InsertMedia "Image"); the BMC
	// fetches it itself, so it must be reachable from the BMC's network.
	Image string
	// CAPEM is the PEM CA certificate that Image's HTTPS server chains to (the appliance CA). When
	// the slot has a Certificates collection (VirtualMedia v1.4.0) it is added there and
	// VerifyCertificate is set, so the BMC refuses a server that does not chain to it; BMCs
	// without it fetch without verification (the Redfish default) and the report says so.
	CAPEM []byte
}

// VirtualMediaReport says what BootVirtualMedia did and how long each share took.
type VirtualMediaReport struct {
	// Slot is the VirtualMedia resource used (its @odata.id), e.g.
	// /redfish/v1/Systems/1/VirtualMedia/Cd or /redfish/v1/Managers/1/VM1/CfgCD.
	Slot string
	// Legacy: the slot is Supermicro's OEM VM1/CfgCD (IsoConfig.Mount), not a standard one.
	Legacy bool
	// Verified: the BMC verifies Image's TLS certificate against CAPEM (VerifyCertificate true
	// with CAPEM in the slot's Certificates). False for http:// images and for BMCs that cannot.
	Verified bool
	// BootPersistent: the BMC reports the CD override as Continuous although Once was asked
	// (sushy-tools' libvirt driver, some BMCs): the node boots the CD on every power-on until the
	// media is ejected.
	BootPersistent bool
	// Powered is "on" (the node was off) or "cycle" (it was on and was restarted).
	Powered string
	// Insert covers finding the slot, the certificate, the insert and its read-back (the BMC's
	// download included when the BMC fetches before answering, as sushy-tools does); Boot the
	// boot override and its read-back; Power the power action.
	Insert, Boot, Power time.Duration
}

// String is a one-line summary for progress output, e.g. "virtual media /redfish/v1/Systems/x/
// VirtualMedia/Cd (TLS verified with the appliance CA): insert 1.2s, boot override 0.1s, power on 0.2s".
func (r VirtualMediaReport) String() string {
	how := "TLS verified with the appliance CA"
	if !r.Verified {
		how = "the BMC does not verify the image server's TLS"
	}
	if r.Legacy {
		how += ", Supermicro legacy VM1"
	}
	if r.BootPersistent {
		how += ", boot override kept for every boot"
	}
	return fmt.Sprintf("virtual media %s (%s): insert %s, boot override %s, power %s %s",
		r.Slot, how, r.Insert.Round(time.Millisecond), r.Boot.Round(time.Millisecond), r.Powered, r.Power.Round(time.Millisecond))
}

// BootVirtualMedia implements VirtualMediaBooter for Redfish BMCs (IPMI: ErrUnsupported). The insert
// goes through bmclib's SetVirtualMedia (which looks under the Manager, then under the System as
// newer Dell iDRACs have it, and retries InsertMedia without Inserted/WriteProtected for Supermicro
// X11); this adds what bmclib does not do: the CA upload, Supermicro's legacy OEM VM1/CfgCD when no
// standard slot exists, and reading the slot back.
func (c *bmcController) BootVirtualMedia(ctx context.Context, o VirtualMediaOptions) (VirtualMediaReport, error) {
	var r VirtualMediaReport
	if c.provider != providerRedfish {
		return r, fmt.Errorf("virtual media on a %s BMC: %w (IPMI has no virtual media: use power.kind redfish, or power.bootDevice pxe)", c.o.Kind, ErrUnsupported)
	}
	u, err := url.Parse(o.Image)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		shown := "(not a URL)"
		if err == nil {
			shown = u.Redacted()
		}
		return r, fmt.Errorf("virtual media image %s: %w: give an http:// or https:// URL with a host and no credentials", shown, ErrUnsupported)
	}
	start := time.Now()
	err = c.op(ctx, "insert virtual media", func(ctx context.Context) error {
		rf, err := c.gofish(ctx)
		if err != nil {
			return err
		}
		defer rf.Logout()
		slots, err := virtualCDs(rf)
		if err != nil {
			return err
		}
		if len(slots) == 0 {
			if cfg, ok := supermicroLegacyCD(rf); ok {
				r.Slot, r.Legacy = cfg, true
				return mountSupermicroLegacy(rf, cfg, u)
			}
			return fmt.Errorf("%w: no VirtualMedia slot with MediaTypes CD or DVD under /redfish/v1/Managers/* or /redfish/v1/Systems/*, and no Supermicro /VM1/CfgCD: check that the BMC's virtual media is licensed (iDRAC Enterprise/Datacenter, iLO Advanced, Supermicro SFT-DCMS-SINGLE) and enabled, or boot the node from the network (power.bootDevice: pxe)", ErrVirtualMediaUnsupported)
		}
		if u.Scheme == "https" && len(o.CAPEM) > 0 {
			r.Verified = true
			for _, s := range slots {
				if err := trustImageCA(rf, s, o.CAPEM); err != nil {
					c.log.Warn("BMC cannot verify the virtual media image server; it fetches without TLS verification", "slot", s.ODataID, "error", err)
					r.Verified = false
				}
			}
		}
		before := taskIDs(rf)
		ok, err := c.client.SetVirtualMedia(ctx, "CD", o.Image)
		if err != nil || !ok {
			return fmt.Errorf("%w: the BMC refused InsertMedia of %s: check that the BMC reaches that URL (its own network, not the node's) and, for https, that it trusts the appliance CA: %v", ErrVirtualMediaNotInserted, o.Image, err)
		}
		slot, err := readBackInserted(ctx, rf, slots, o.Image, before)
		r.Slot = slot
		return err
	})
	r.Insert = time.Since(start)
	if err != nil {
		return r, err
	}
	start = time.Now()
	err = c.op(ctx, "set boot device", func(ctx context.Context) error {
		ok, err := c.client.SetBootDevice(ctx, string(BootCDROM), false, false)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("BMC did not confirm boot device %s", BootCDROM)
		}
		got, persistent, _, err := c.readBootDevice(ctx)
		if err != nil {
			return fmt.Errorf("read back boot override: %w", err)
		}
		if got != BootCDROM {
			return fmt.Errorf("%w: set %s once, BMC reports %s", ErrBootDeviceNotApplied, BootCDROM, got)
		}
		// Some BMCs keep every override (sushy-tools' libvirt driver rewrites the domain's boot
		// order, "Continuous"): the CD then boots on every power-on until it is ejected.
		r.BootPersistent = persistent
		return nil
	})
	r.Boot = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("virtual media inserted (%s) but the one-time boot from CD was not set: %w", r.Slot, err)
	}
	if r.BootPersistent {
		c.log.Warn("the BMC keeps the boot override from CD for every boot (BootSourceOverrideEnabled Continuous), not once: the node boots the virtual CD again until the media is ejected", "slot", r.Slot)
	}
	start = time.Now()
	st, err := c.PowerState(ctx)
	if err == nil && st == StateOn {
		r.Powered = "cycle"
		err = c.PowerCycle(ctx)
	} else if err == nil {
		r.Powered = "on"
		err = c.PowerOn(ctx)
	}
	r.Power = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("virtual media inserted (%s) and boot from CD set, but power %s failed: %w", r.Slot, r.Powered, err)
	}
	return r, nil
}

// EjectVirtualMedia implements VirtualMediaBooter.
func (c *bmcController) EjectVirtualMedia(ctx context.Context) error {
	if c.provider != providerRedfish {
		return fmt.Errorf("virtual media on a %s BMC: %w", c.o.Kind, ErrUnsupported)
	}
	return c.op(ctx, "eject virtual media", func(ctx context.Context) error {
		rf, err := c.gofish(ctx)
		if err != nil {
			return err
		}
		defer rf.Logout()
		slots, err := virtualCDs(rf)
		if err != nil {
			return err
		}
		if len(slots) == 0 {
			if cfg, ok := supermicroLegacyCD(rf); ok {
				resp, err := rf.Post(cfg+"/Actions/IsoConfig.UnMount", struct{}{})
				if err != nil {
					return fmt.Errorf("Supermicro %s refused IsoConfig.UnMount: %w", cfg, err)
				}
				_ = resp.Body.Close()
			}
			_, err := c.clearCDBoot(ctx)
			return err
		}
		inserted := false
		for _, s := range slots {
			inserted = inserted || s.Inserted
		}
		if inserted {
			if ok, err := c.client.SetVirtualMedia(ctx, "CD", ""); err != nil || !ok {
				return fmt.Errorf("the BMC refused EjectMedia: %v", err)
			}
			for _, s := range slots {
				if got, err := redfish.GetVirtualMedia(rf, s.ODataID); err == nil && got.Inserted {
					return fmt.Errorf("EjectMedia was accepted but %s still reads back Inserted (image %s): eject it on the BMC's virtual media page", s.ODataID, got.Image)
				}
			}
		}
		_, err = c.clearCDBoot(ctx)
		return err
	})
}

// ClearVirtualMediaBoot implements VirtualMediaBooter.
func (c *bmcController) ClearVirtualMediaBoot(ctx context.Context) (bool, error) {
	if c.provider != providerRedfish {
		return false, fmt.Errorf("virtual media on a %s BMC: %w", c.o.Kind, ErrUnsupported)
	}
	var changed bool
	err := c.op(ctx, "clear the boot override from CD", func(ctx context.Context) error {
		var err error
		changed, err = c.clearCDBoot(ctx)
		return err
	})
	return changed, err
}

// clearCDBoot is ClearVirtualMediaBoot under the controller lock (c.op). The one-time disk override
// goes through bmclib (BootSourceOverrideTarget "Hdd", Enabled "Once"); a BMC may report it
// Continuous (sushy-tools' libvirt driver rewrites the domain's boot order), which boots the disk
// as well.
func (c *bmcController) clearCDBoot(ctx context.Context) (bool, error) {
	got, _, _, err := c.readBootDevice(ctx)
	if err != nil {
		return false, fmt.Errorf("read the boot override: %w", err)
	}
	if got != BootCDROM {
		return false, nil
	}
	ok, err := c.client.SetBootDevice(ctx, string(BootDisk), false, false)
	if err != nil {
		return false, fmt.Errorf("replace the boot override from CD with the disk: %w", err)
	}
	if !ok {
		return false, fmt.Errorf("BMC did not confirm boot device %s", BootDisk)
	}
	if got, _, _, err = c.readBootDevice(ctx); err != nil {
		return false, fmt.Errorf("read back the boot override: %w", err)
	}
	if got != BootDisk {
		return false, fmt.Errorf("%w: replaced the boot override from CD with %s once, BMC reports %s: clear it on the BMC (boot override), or the node boots the virtual CD again", ErrBootDeviceNotApplied, BootDisk, got)
	}
	return true, nil
}

// gofish opens a gofish client on the same BMC with the same TLS trust and login method as the
// bmclib client (HTTP basic auth when the service has no sessions). The caller logs it out.
func (c *bmcController) gofish(ctx context.Context) (*gofish.APIClient, error) {
	tc := &tls.Config{RootCAs: c.rootCAs, InsecureSkipVerify: c.o.InsecureSkipVerify} //nolint:gosec // only when configured, warned in NewBMC
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}, Timeout: c.o.Timeout}
	return gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:   "https://" + hostPort(c.o.Host, c.o.Port),
		Username:   c.o.Username,
		Password:   c.o.Password,
		BasicAuth:  c.basicAuth,
		HTTPClient: hc,
	})
}

func hostPort(host string, port int) string {
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(port)
}

// virtualCDs lists the VirtualMedia slots that take a CD or DVD, in bmclib's order: under the
// Managers first; only when none has any, under the Systems (newer Dell iDRACs, sushy-tools).
func virtualCDs(rf *gofish.APIClient) ([]*redfish.VirtualMedia, error) {
	var out []*redfish.VirtualMedia
	pick := func(vms []*redfish.VirtualMedia) {
		for _, vm := range vms {
			for _, t := range vm.MediaTypes {
				if t == redfish.CDMediaType || t == redfish.DVDMediaType {
					out = append(out, vm)
					break
				}
			}
		}
	}
	managers, err := rf.Service.Managers()
	if err != nil {
		return nil, fmt.Errorf("list Redfish managers: %w", err)
	}
	for _, m := range managers {
		if vms, err := m.VirtualMedia(); err == nil {
			pick(vms)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	systems, err := rf.Service.Systems()
	if err != nil {
		return nil, fmt.Errorf("list Redfish systems: %w", err)
	}
	for _, s := range systems {
		if vms, err := s.VirtualMedia(); err == nil {
			pick(vms)
		}
	}
	return out, nil
}

// trustImageCA makes the slot verify the image server against caPEM (Redfish VirtualMedia v1.4.0:
// POST the certificate to its Certificates collection, PATCH VerifyCertificate true). A slot that
// already holds the same certificate is not posted to again; one that holds others and refuses a
// second has them deleted first.
func trustImageCA(rf *gofish.APIClient, s *redfish.VirtualMedia, caPEM []byte) error {
	var links struct {
		Certificates struct {
			ODataID string `json:"@odata.id"`
		}
	}
	raw, err := getJSON(rf, s.ODataID)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &links); err != nil || links.Certificates.ODataID == "" {
		return errors.New("the slot has no Certificates collection (VirtualMedia before v1.4.0)")
	}
	certs, err := certificates(rf, links.Certificates.ODataID)
	if err != nil {
		return err
	}
	have := false
	for _, ct := range certs {
		if strings.TrimSpace(ct.CertificateString) == strings.TrimSpace(string(caPEM)) {
			have = true
		}
	}
	if !have {
		post := func() error {
			resp, err := rf.Post(links.Certificates.ODataID, map[string]string{"CertificateString": string(caPEM), "CertificateType": "PEM"})
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		}
		if err := post(); err != nil {
			// A slot may hold one certificate only (sushy-tools answers 409): one left by an
			// earlier insert, for another CA, would make the BMC refuse the appliance. Replace it.
			if len(certs) == 0 {
				return fmt.Errorf("add the CA to %s: %w", links.Certificates.ODataID, err)
			}
			for _, ct := range certs {
				if resp, derr := rf.Delete(ct.ODataID); derr == nil {
					_ = resp.Body.Close()
				}
			}
			if err := post(); err != nil {
				return fmt.Errorf("replace the certificates of %s with the CA: %w", links.Certificates.ODataID, err)
			}
		}
	}
	if !s.VerifyCertificate {
		resp, err := rf.Patch(s.ODataID, map[string]bool{"VerifyCertificate": true})
		if err != nil {
			return fmt.Errorf("set VerifyCertificate on %s: %w", s.ODataID, err)
		}
		_ = resp.Body.Close()
	}
	return nil
}

type certificate struct {
	ODataID           string `json:"@odata.id"`
	CertificateString string
}

// certificates reads a CertificateCollection and its members (gofish's VirtualMedia.Certificates
// reads the collection link as if it were a certificate).
func certificates(rf *gofish.APIClient, collection string) ([]certificate, error) {
	raw, err := getJSON(rf, collection)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", collection, err)
	}
	var col struct {
		Members []struct {
			ODataID string `json:"@odata.id"`
		}
	}
	if err := json.Unmarshal(raw, &col); err != nil {
		return nil, fmt.Errorf("read %s: %w", collection, err)
	}
	var out []certificate
	for _, m := range col.Members {
		raw, err := getJSON(rf, m.ODataID)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", m.ODataID, err)
		}
		var ct certificate
		if err := json.Unmarshal(raw, &ct); err != nil {
			return nil, fmt.Errorf("read %s: %w", m.ODataID, err)
		}
		if ct.ODataID == "" {
			ct.ODataID = m.ODataID
		}
		out = append(out, ct)
	}
	return out, nil
}

// supermicroLegacyCD finds Supermicro's pre-standard virtual media (X10/X11 firmware without
// VirtualMedia InsertMedia): /redfish/v1/Managers/{id}/VM1/CfgCD, an IsoConfig resource with an
// IsoConfig.Mount action.
func supermicroLegacyCD(rf *gofish.APIClient) (string, bool) {
	managers, err := rf.Service.Managers()
	if err != nil {
		return "", false
	}
	for _, m := range managers {
		p := strings.TrimSuffix(m.ODataID, "/") + "/VM1/CfgCD"
		raw, err := getJSON(rf, p)
		if err != nil {
			continue
		}
		var cfg struct {
			Actions map[string]json.RawMessage
		}
		if json.Unmarshal(raw, &cfg) == nil && cfg.Actions["#IsoConfig.Mount"] != nil {
			return p, true
		}
	}
	return "", false
}

// mountSupermicroLegacy points CfgCD at the image (PATCH Host = scheme://host[:port], Path = the
// rest, as Supermicro's IPMI web UI splits it), mounts it (POST IsoConfig.Mount, an empty body) and
// reads Host and Path back.
func mountSupermicroLegacy(rf *gofish.APIClient, cfg string, u *url.URL) error {
	host := u.Scheme + "://" + u.Host
	path := u.RequestURI()
	if resp, err := rf.Patch(cfg, map[string]string{"Host": host, "Path": path}); err != nil {
		return fmt.Errorf("%w: Supermicro %s refused the image %s: %v", ErrVirtualMediaNotInserted, cfg, u, err)
	} else {
		_ = resp.Body.Close()
	}
	resp, err := rf.Post(cfg+"/Actions/IsoConfig.Mount", struct{}{})
	if err != nil {
		return fmt.Errorf("%w: Supermicro %s refused IsoConfig.Mount of %s: check that the BMC reaches that URL: %v", ErrVirtualMediaNotInserted, cfg, u, err)
	}
	_ = resp.Body.Close()
	raw, err := getJSON(rf, cfg)
	if err != nil {
		return fmt.Errorf("%w: read %s back: %v", ErrVirtualMediaNotInserted, cfg, err)
	}
	var got struct{ Host, Path string }
	if err := json.Unmarshal(raw, &got); err != nil || got.Host != host || got.Path != path {
		return fmt.Errorf("%w: Supermicro %s reads back Host %q Path %q after the mount, want %q %q", ErrVirtualMediaNotInserted, cfg, got.Host, got.Path, host, path)
	}
	return nil
}

// insertPoll is how often readBackInserted reads the slots and tasks again while an insert task runs.
var insertPoll = 500 * time.Millisecond

// readBackInserted finds the slot that holds image (bmclib inserted into the first CD slot that took
// it). A BMC that runs InsertMedia as a Task (DSP0266 § "Asynchronous operations": 202 Accepted with
// a task monitor, which bmclib does not follow) shows the image only once its fetch is done: while
// the service's TaskService lists a task that has not ended, the slots are read again until ctx
// ends; a task that ended in Exception and was not among before (the tasks listed before the insert)
// is the error, with its message. A BMC without tasks gets one read.
func readBackInserted(ctx context.Context, rf *gofish.APIClient, slots []*redfish.VirtualMedia, image string, before map[string]bool) (string, error) {
	var last error
	doneBefore := false // a new task had completed at the previous round
	slot, err := backoff.Retry(ctx, func() (string, error) {
		slot, done, err := readBackOnce(rf, slots, image, before, doneBefore)
		doneBefore = done
		last = err
		return slot, err
	}, backoff.WithBackOff(backoff.NewConstantBackOff(insertPoll)), backoff.WithMaxElapsedTime(0))
	if err != nil && last != nil && ctx.Err() != nil {
		return "", fmt.Errorf("%w (the operation's time ran out)", last) // the task's state, not just "deadline exceeded"
	}
	return slot, err
}

// readBackOnce is one round of readBackInserted: the slot, or a retryable error while an insert task
// runs, or a permanent one.
func readBackOnce(rf *gofish.APIClient, slots []*redfish.VirtualMedia, image string, before map[string]bool, doneBefore bool) (slot string, done bool, err error) {
	for _, s := range slots {
		got, err := redfish.GetVirtualMedia(rf, s.ODataID)
		if err == nil && got.Inserted && got.Image == image {
			return s.ODataID, false, nil
		}
	}
	running, done, failed := insertTasks(rf, before)
	switch {
	case failed != "":
		return "", done, backoff.Permanent(fmt.Errorf("%w: the BMC's task for InsertMedia of %s ended in an exception: %s: check that the BMC reaches that URL (its own network, not the node's) and, for https, that it trusts the appliance CA", ErrVirtualMediaNotInserted, image, failed))
	case running:
		return "", done, fmt.Errorf("%w: the BMC's InsertMedia task for %s is still running", ErrVirtualMediaNotInserted, image)
	case done && !doneBefore:
		// The task completed between the slots' read and the tasks': read the slots once more.
		return "", done, fmt.Errorf("%w: the BMC's InsertMedia task for %s completed", ErrVirtualMediaNotInserted, image)
	}
	return "", done, backoff.Permanent(fmt.Errorf("%w: InsertMedia of %s was accepted but no VirtualMedia slot reads back Inserted with that Image: check the BMC's virtual media status page and its log", ErrVirtualMediaNotInserted, image))
}

// insertTasks reads the BMC's tasks: whether one has not ended yet, whether one not in before has
// completed, and the messages of one not in before that ended in Exception. A service without a
// TaskService has none of them.
func insertTasks(rf *gofish.APIClient, before map[string]bool) (running, done bool, failed string) {
	for _, tk := range tasks(rf) {
		switch tk.TaskState {
		case redfish.NewTaskState, redfish.StartingTaskState, redfish.RunningTaskState, redfish.PendingTaskState, redfish.StoppingTaskState, redfish.SuspendedTaskState, redfish.InterruptedTaskState:
			running = true
		case redfish.CompletedTaskState:
			done = done || !before[tk.ODataID]
		case redfish.ExceptionTaskState:
			if before[tk.ODataID] {
				continue
			}
			var msgs []string
			for _, m := range tk.Messages {
				msgs = append(msgs, strings.TrimSpace(m.Message+" "+m.Resolution))
			}
			failed = tk.ODataID + ": " + strings.Join(msgs, "; ")
		}
	}
	return running, done, failed
}

// taskIDs are the @odata.ids of the BMC's tasks now (none without a TaskService).
func taskIDs(rf *gofish.APIClient) map[string]bool {
	ids := map[string]bool{}
	for _, tk := range tasks(rf) {
		ids[tk.ODataID] = true
	}
	return ids
}

// tasks lists the BMC's tasks through its TaskService; nil when it has none or it cannot be read.
func tasks(rf *gofish.APIClient) []*redfish.Task {
	ts, err := rf.Service.TaskService()
	if err != nil || ts == nil {
		return nil
	}
	out, _ := ts.Tasks()
	return out
}

// getJSON GETs a Redfish resource's body (gofish returns an error for HTTP status ≥ 400).
func getJSON(rf *gofish.APIClient, path string) ([]byte, error) {
	resp, err := rf.Get(path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
