// Conformance of the lab's Redfish BMC emulator with Redfish clients nobody here wrote: DMTF's
// redfishtool, OpenStack's sushy (the library Ironic and Metal3 drive BMCs with), gofish and bmclib
// (the Go clients the product's pkg/power builds on), and the DSP0266 error format read with plain
// net/http. Each test starts its own BMC process (test/labredfish) on 127.0.0.1.
//
// Where the clients disagree the emulator follows the specification: DSP0266 (Redfish
// Specification) and DSP2046 (Redfish Resource and Schema Guide); the comments name the section.
//
// HPE's ilorest (Debian package ilorest 3.6.0.0, which LAB.md lists) was tried and has no test here
// (nor a place in `make deps`):
// `ilorest login https://ADDR -u USER -p … --https CA` fails with "ERROR: 'links'" because
// redfish/ris/gen_compat.py reads the service root's JsonSchemas link, or HPE's legacy
// links.Schemas, unconditionally, and JsonSchemas is optional in ServiceRoot (DSP2046; DMTF's
// mockup has none). With a JsonSchemas link added in a scratch build, login crawled the whole tree
// (about 250 GETs) and then hung forever: its crawler thread died on the mockup's absolute link to an
// external PDU (https://redfishpdu.contoso.com/…, a PowerOutlet link, which DSP0266 allows) and the
// crawl's queue.join() never returned. Every ilorest command logs in that way first, so nothing of
// it can be checked meaningfully against a non-HPE service; it also takes the password only on argv
// or from a prompt. The crawl did find one real fault, a dangling CertificateLocations link (fixed in
// vmedia.go, checked in TestConformanceTasks).
package redfishbmc_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	"github.com/stmcginnis/gofish/redfish"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labns"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

// baseRegistry is the prefix of every MessageId the emulator sends: the mockup's Base registry
// (Registries/Base.1.5.0.json).
const baseRegistry = "Base.1.5.0."

// Expected ResetType@Redfish.AllowableValues, written out here (not read from redfishbmc.Profiles)
// so that a change to a profile has to be made twice.
var (
	dmtfResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton", "PowerCycle"}
	// Supermicro X12-like: no PowerCycle, no PushPowerButton.
	managerVMediaResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"}
	// iLO 5: no GracefulRestart, no ForceOn, no PowerCycle.
	hpeILOResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "Nmi", "PushPowerButton"}
)

// TestConformanceRedfishtool drives the emulator with DMTF's redfishtool (Debian's 1.1.5): discovery,
// session and basic auth, the boot override, power on and off, and an error answer.
//
// TLS: redfishtool has no option for a CA. Every request it makes passes verify=False to
// python-requests (redfishtoolTransport.py: rftSendRecvRequest's verify=False, and the GET /redfish
// probe), so it can only skip verification; -S Always makes it use https for every request. The
// password is read from a 0600 -c file ({"user", "password"}), never from argv; the output of -s
// (which echoes the login body and the Authorization header) is redacted before it is logged.
func TestConformanceRedfishtool(t *testing.T) {
	t.Parallel()
	tool := labns.RequireTool(t, "redfishtool")
	b := labredfish.Start(t, labredfish.Options{Profile: "dmtf"})
	dir := t.TempDir()
	creds := writeSecret(t, dir, "creds.json", map[string]string{"user": b.User, "password": b.Password})
	wrong := writeSecret(t, dir, "wrong.json", map[string]string{"user": b.User, "password": "not-" + b.Password})
	sys := "/redfish/v1/Systems/" + b.SystemID

	type result struct {
		stdout, stderr string
		err            error
		reqs           []labredfish.Request // what the BMC served during the run
	}
	run := func(t *testing.T, auth, cfg string, args ...string) result {
		t.Helper()
		before := requests(t, b)
		argv := append([]string{"-r", b.Addr, "-S", "Always", "-n", "-T", "10", "-A", auth, "-c", cfg}, args...)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, tool, argv...)
		cmd.Env = peerEnv(dir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return result{redact(stdout.String(), b), redact(stderr.String(), b), err, requests(t, b)[len(before):]}
	}
	mustRun := func(t *testing.T, auth, cfg string, args ...string) result {
		t.Helper()
		r := run(t, auth, cfg, args...)
		if r.err != nil {
			t.Fatalf("redfishtool -A %s %s: %v\nstdout:\n%s\nstderr:\n%s", auth, strings.Join(args, " "), r.err, r.stdout, r.stderr)
		}
		return r
	}
	decodeOut := func(t *testing.T, r result) map[string]any {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("redfishtool printed no JSON object: %v\n%s", err, r.stdout)
		}
		return v
	}

	t.Run("discovery", func(t *testing.T) {
		root := decodeOut(t, mustRun(t, "Session", creds, "root"))
		if root["@odata.id"] != "/redfish/v1/" || str(root, "Links", "Sessions", "@odata.id") != "/redfish/v1/SessionService/Sessions" {
			t.Errorf("root: @odata.id %v, Links.Sessions %q", root["@odata.id"], str(root, "Links", "Sessions", "@odata.id"))
		}

		// Session auth: redfishtool logs in, lists, and logs out (DSP0266 § "Session lifecycle
		// management": DELETE of the session's URI ends it).
		r := mustRun(t, "Session", creds, "Systems", "list")
		list := decodeOut(t, r)
		members := asList(list["Members"])
		if list["Members@odata.count"] != 1.0 || len(members) != 1 || str(members[0], "@odata.id") != sys || str(members[0], "Id") != b.SystemID {
			t.Errorf("Systems list: %v", list)
		}
		// The service root is read without credentials, then the session is created.
		if len(r.reqs) < 4 || r.reqs[0].Path != "/redfish/v1/" || r.reqs[1].Method != http.MethodPost || r.reqs[1].Path != "/redfish/v1/SessionService/Sessions" || r.reqs[1].Status != http.StatusCreated {
			t.Errorf("Systems list -A Session did not start with a session login: %v", r.reqs)
		} else if last := r.reqs[len(r.reqs)-1]; last.Method != http.MethodDelete || !strings.HasPrefix(last.Path, "/redfish/v1/SessionService/Sessions/") || last.Status != http.StatusNoContent {
			t.Errorf("Systems list -A Session did not end with a logout: %v", r.reqs)
		}
		if n := getJSON(t, b, "/redfish/v1/SessionService/Sessions")["Members@odata.count"]; n != 0.0 {
			t.Errorf("sessions left after redfishtool logged out: %v", n)
		}

		// Basic auth: no session at all.
		r = mustRun(t, "Basic", creds, "Systems", "-I", b.SystemID, "get")
		got := decodeOut(t, r)
		if got["Id"] != b.SystemID || got["PowerState"] != "Off" {
			t.Errorf("Systems get: Id %v PowerState %v", got["Id"], got["PowerState"])
		}
		for _, q := range r.reqs {
			if strings.HasPrefix(q.Path, "/redfish/v1/SessionService") || q.Status != http.StatusOK {
				t.Errorf("Systems get -A Basic: %s %s %d", q.Method, q.Path, q.Status)
			}
		}
	})

	t.Run("boot override and reset", func(t *testing.T) {
		r := mustRun(t, "Session", creds, "Systems", "-I", b.SystemID, "setBootOverride", "Once", "Cd")
		if !hasRequest(r.reqs, http.MethodPatch, sys, http.StatusOK) {
			t.Errorf("setBootOverride sent no PATCH that succeeded: %v", r.reqs)
		}
		if boot := getJSON(t, b, sys)["Boot"]; str(boot, "BootSourceOverrideEnabled") != "Once" || str(boot, "BootSourceOverrideTarget") != "Cd" {
			t.Errorf("after setBootOverride Once Cd: %v", boot)
		}
		// redfishtool checks the target against BootSourceOverrideTarget@Redfish.AllowableValues,
		// which the mockup's system gives without Floppy: refused before any PATCH.
		r = run(t, "Session", creds, "Systems", "-I", b.SystemID, "setBootOverride", "Once", "Floppy")
		if r.err == nil || !strings.Contains(r.stderr, "not supported by the remote service (via @Redfish.AllowableValues)") || hasMethod(r.reqs, http.MethodPatch) {
			t.Errorf("setBootOverride Once Floppy: %v, requests %v\n%s", r.err, r.reqs, r.stderr)
		}

		mustRun(t, "Session", creds, "Systems", "-I", b.SystemID, "reset", "On")
		s := getJSON(t, b, sys)
		// The power-on used the override: "Once" reverts to "Disabled" (DSP2046 ComputerSystem
		// Boot.BootSourceOverrideEnabled).
		if s["PowerState"] != "On" || str(s, "Boot", "BootSourceOverrideEnabled") != "Disabled" {
			t.Errorf("after reset On: PowerState %v, Boot %v", s["PowerState"], s["Boot"])
		}
		mustRun(t, "Basic", creds, "Systems", "-I", b.SystemID, "reset", "ForceOff")
		if s := getJSON(t, b, sys); s["PowerState"] != "Off" {
			t.Errorf("after reset ForceOff: PowerState %v", s["PowerState"])
		}
	})

	t.Run("errors", func(t *testing.T) {
		// redfishtool refuses a ResetType outside the allowable values itself, so the bad one goes
		// through `raw`; -sssss prints the answer's body.
		target := sys + "/Actions/ComputerSystem.Reset"
		r := run(t, "Basic", creds, "-sssss", "raw", "POST", target, "-d", `{"ResetType":"Bogus"}`)
		if r.err == nil || !strings.Contains(r.stderr, "status_code: 400") {
			t.Fatalf("raw POST ResetType Bogus: %v\n%s", r.err, r.stderr)
		}
		var body errorBody
		_, data, ok := strings.Cut(r.stdout, "#__Response. Data: ")
		if ok {
			data, _, _ = strings.Cut(data, "\n")
		}
		if err := json.Unmarshal([]byte(data), &body); err != nil {
			t.Fatalf("redfishtool printed no error body: %v\n%s", err, r.stdout)
		}
		checkErrorBody(t, loadRegistry(t), body, "PropertyValueNotInList", "Bogus", "ResetType")

		r = run(t, "Basic", wrong, "Systems", "-I", b.SystemID, "get")
		if r.err == nil || !strings.Contains(r.stderr, "status_code: 401") {
			t.Errorf("basic auth with a wrong password: %v\n%s", r.err, r.stderr)
		}
		r = run(t, "Session", wrong, "Systems", "list")
		if r.err == nil || !strings.Contains(r.stderr, "Session Login Failed") || !hasRequest(r.reqs, http.MethodPost, "/redfish/v1/SessionService/Sessions", http.StatusUnauthorized) {
			t.Errorf("session login with a wrong password: %v, requests %v\n%s", r.err, r.reqs, r.stderr)
		}
	})
}

// sushyScript is the OpenStack sushy client's side of TestConformanceSushy. It reads its
// configuration (addresses, CA files, credentials) from the 0600 file named by SUSHY_CONF and prints
// one JSON object of results; sushy's own log goes to stderr.
const sushyScript = `
import json, logging, os, sys
import sushy
from sushy import auth as sushy_auth
from sushy import exceptions as sx
from sushy.connector import Connector

logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
conf = json.load(open(os.environ["SUSHY_CONF"]))
out = {}

def err(e):
    d = {"class": type(e).__name__}
    if isinstance(e, sx.HTTPError):
        infos = (e.body or {}).get("@Message.ExtendedInfo", [])
        d.update(status=e.status_code, code=e.code, detail=e.detail,
                 ids=[m.get("MessageId") for m in infos], args=[m.get("MessageArgs") for m in infos])
    return d

def expect_error(fn):
    try:
        fn()
    except sx.SushyError as e:
        return err(e)
    return None

d = conf["dmtf"]

def system_steps(auth):
    s = sushy.Sushy(d["url"], auth=auth, verify=d["ca"])
    r = {"redfish_version": s.redfish_version,
         "systems": sorted(s.get_system_collection().members_identities)}
    sy = s.get_system(d["system"])
    r["identity"] = sy.identity
    r["power_initial"] = sy.power_state.value
    r["allowed_resets"] = sorted(v.value for v in sy.get_allowed_reset_system_values())
    sy.set_system_boot_options(target=sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
    sy.refresh()
    r["boot_set"] = [sy.boot.target.value, sy.boot.enabled.value]
    sy.reset_system(sushy.ResetType.ON)
    sy.refresh()
    r["power_on"] = sy.power_state.value
    r["boot_after_on"] = sy.boot.enabled.value
    sy.reset_system(sushy.ResetType.FORCE_OFF)
    sy.refresh()
    r["power_off"] = sy.power_state.value
    # Floppy is not in the system's BootSourceOverrideTarget@Redfish.AllowableValues: sushy refuses it.
    r["floppy"] = expect_error(lambda: sy.set_system_boot_options(
        target=sushy.BootSource.FLOPPY, enabled=sushy.BootSourceOverrideEnabled.ONCE))
    return r

auth = sushy_auth.SessionAuth(d["user"], d["password"])
r = system_steps(auth)
r["session_uri"] = auth.get_session_resource_id()
r["session_key"] = auth.get_session_key() is not None
auth.close()
out["session"] = r
out["basic"] = system_steps(sushy_auth.BasicAuth(d["user"], d["password"]))

out["wrong_session"] = expect_error(lambda: sushy.Sushy(
    d["url"], auth=sushy_auth.SessionAuth(d["user"], "not-" + d["password"]), verify=d["ca"]))
out["wrong_basic"] = expect_error(lambda: sushy.Sushy(
    d["url"], auth=sushy_auth.BasicAuth(d["user"], "not-" + d["password"]), verify=d["ca"]).get_system(d["system"]))

# What sushy's own checks refuse reaches the BMC through its Connector.
c = Connector(d["url"], verify=d["ca"])
c.set_http_basic_auth(d["user"], d["password"])
out["bad_target"] = expect_error(lambda: c.patch(d["system"], data={"Boot": {"BootSourceOverrideTarget": "Floppy"}}))
out["bad_reset"] = expect_error(lambda: c.post(d["system"] + "/Actions/ComputerSystem.Reset", data={"ResetType": "Bogus"}))
c.close()

# Virtual media: sushy 4.3 finds it under the Manager only.
v = conf["vmedia"]
auth = sushy_auth.SessionAuth(v["user"], v["password"])
s = sushy.Sushy(v["url"], auth=auth, verify=v["ca"])
coll = s.get_manager("/redfish/v1/Managers/BMC").virtual_media
r = {"members": sorted(coll.members_identities)}
cd = coll.get_member("/redfish/v1/Managers/BMC/VirtualMedia/CD1")
cd.set_verify_certificate(True)
cd.refresh()
r["verify"] = cd.verify_certificate
r["untrusted"] = expect_error(lambda: cd.insert_media(conf["image"]))
cert = cd.certificates.create_member(conf["image_ca_pem"], sushy.CertificateType.PEM)
r["cert"] = cert.path if cert is not None else None
cd.insert_media(conf["image"])
cd.refresh()
r["inserted"] = [cd.inserted, cd.image]
cd.eject_media()
cd.refresh()
r["ejected"] = [cd.inserted, cd.image]
auth.close()
out["vmedia"] = r

print(json.dumps(out))
`

// sushyError is what sushyScript reports of a sushy exception.
type sushyError struct {
	Class  string     `json:"class"`
	Status int        `json:"status"`
	Code   string     `json:"code"`
	Detail string     `json:"detail"`
	IDs    []string   `json:"ids"`
	Args   [][]string `json:"args"`
}

type sushySystem struct {
	RedfishVersion string      `json:"redfish_version"`
	Systems        []string    `json:"systems"`
	Identity       string      `json:"identity"`
	PowerInitial   string      `json:"power_initial"`
	AllowedResets  []string    `json:"allowed_resets"`
	BootSet        []string    `json:"boot_set"`
	PowerOn        string      `json:"power_on"`
	BootAfterOn    string      `json:"boot_after_on"`
	PowerOff       string      `json:"power_off"`
	Floppy         *sushyError `json:"floppy"`
	SessionURI     string      `json:"session_uri"`
	SessionKey     bool        `json:"session_key"`
}

type sushyResults struct {
	Session      sushySystem `json:"session"`
	Basic        sushySystem `json:"basic"`
	WrongSession *sushyError `json:"wrong_session"`
	WrongBasic   *sushyError `json:"wrong_basic"`
	BadTarget    *sushyError `json:"bad_target"`
	BadReset     *sushyError `json:"bad_reset"`
	VMedia       struct {
		Members   []string    `json:"members"`
		Verify    bool        `json:"verify"`
		Untrusted *sushyError `json:"untrusted"`
		Cert      string      `json:"cert"`
		Inserted  []any       `json:"inserted"`
		Ejected   []any       `json:"ejected"`
	} `json:"vmedia"`
}

// TestConformanceSushy drives the emulator with OpenStack's sushy (Debian's python3-sushy 4.3.3, run
// by Debian's /usr/bin/python3): session and basic auth, the system, reset, the boot override,
// errors, and virtual media fetched from an HTTPS image server the BMC verifies with the CA POSTed to
// the slot's Certificates. Two BMCs: "dmtf" (virtual media under the System, which sushy 4.3 does not
// look for) and "manager-vmedia" (under the Manager; it refuses InsertMedia's Inserted and
// WriteProtected, which sushy leaves out when they have their default values).
func TestConformanceSushy(t *testing.T) {
	t.Parallel()
	python := requireSushy(t)
	dmtf := labredfish.Start(t, labredfish.Options{Profile: "dmtf"})
	vm := labredfish.Start(t, labredfish.Options{Profile: "manager-vmedia"})
	img := startImageServer(t)
	dir := t.TempDir()
	bmcConf := func(b labredfish.BMC, name string) map[string]string {
		ca := filepath.Join(dir, name+"-ca.pem")
		if err := os.WriteFile(ca, b.CAPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		return map[string]string{"url": "https://" + b.Addr, "user": b.User, "password": b.Password, "ca": ca,
			"system": "/redfish/v1/Systems/" + b.SystemID}
	}
	conf := writeSecret(t, dir, "sushy.json", map[string]any{"dmtf": bmcConf(dmtf, "dmtf"), "vmedia": bmcConf(vm, "vmedia"),
		"image": img.URL, "image_ca_pem": string(img.CAPEM)})
	script := filepath.Join(dir, "conformance.py")
	if err := os.WriteFile(script, []byte(sushyScript), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, script)
	cmd.Env = append(peerEnv(dir), "SUSHY_CONF="+conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sushy script: %v\nstdout:\n%s\nstderr:\n%s", err, redact(stdout.String(), dmtf, vm), redact(stderr.String(), dmtf, vm))
	}
	var got sushyResults
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("sushy script printed no results: %v\n%s", err, stdout.String())
	}
	t.Logf("sushy: %s", redact(stdout.String(), dmtf, vm))
	reg := loadRegistry(t)
	sysPath := "/redfish/v1/Systems/" + dmtf.SystemID

	for name, r := range map[string]sushySystem{"session": got.Session, "basic": got.Basic} {
		if r.RedfishVersion == "" || !slices.Equal(r.Systems, []string{sysPath}) || r.Identity != dmtf.SystemID {
			t.Errorf("%s: version %q, systems %v, identity %q", name, r.RedfishVersion, r.Systems, r.Identity)
		}
		if !slices.Equal(r.AllowedResets, sorted(dmtfResetTypes)) {
			t.Errorf("%s: allowed resets %v, want %v", name, r.AllowedResets, sorted(dmtfResetTypes))
		}
		if r.PowerInitial != "Off" || r.PowerOn != "On" || r.PowerOff != "Off" {
			t.Errorf("%s: power %s → on %s → force off %s", name, r.PowerInitial, r.PowerOn, r.PowerOff)
		}
		// DSP2046 Boot.BootSourceOverrideEnabled "Once": the next boot uses it, then it is Disabled.
		if !slices.Equal(r.BootSet, []string{"Cd", "Once"}) || r.BootAfterOn != "Disabled" {
			t.Errorf("%s: boot override set %v, after power-on %q", name, r.BootSet, r.BootAfterOn)
		}
		if r.Floppy == nil || r.Floppy.Class != "InvalidParameterValueError" {
			t.Errorf("%s: sushy let a target outside the AllowableValues through: %+v", name, r.Floppy)
		}
	}
	if !got.Session.SessionKey || !strings.HasPrefix(got.Session.SessionURI, "/redfish/v1/SessionService/Sessions/") {
		t.Errorf("session auth: key %v, session %q", got.Session.SessionKey, got.Session.SessionURI)
	}
	wantSushyError(t, reg, "wrong password, session", got.WrongSession, "AccessError", http.StatusUnauthorized, "NoValidSession")
	wantSushyError(t, reg, "wrong password, basic", got.WrongBasic, "AccessError", http.StatusUnauthorized, "NoValidSession")
	wantSushyError(t, reg, "bad boot target", got.BadTarget, "BadRequestError", http.StatusBadRequest, "PropertyValueNotInList", "Floppy", "Boot/BootSourceOverrideTarget")
	wantSushyError(t, reg, "bad reset type", got.BadReset, "BadRequestError", http.StatusBadRequest, "PropertyValueNotInList", "Bogus", "ResetType")

	// The session run logged in once and out once; the basic run never touched the SessionService.
	reqs := requests(t, dmtf)
	var logins, logouts int
	for _, q := range reqs {
		switch {
		case q.Method == http.MethodPost && q.Path == "/redfish/v1/SessionService/Sessions" && q.Status == http.StatusCreated:
			logins++
		case q.Method == http.MethodDelete && q.Path == got.Session.SessionURI && q.Status == http.StatusNoContent:
			logouts++
		}
	}
	if logins != 1 || logouts != 1 {
		t.Errorf("sessions: %d logins, %d logouts of %s, want 1 and 1", logins, logouts, got.Session.SessionURI)
	}

	v := got.VMedia
	slot := "/redfish/v1/Managers/BMC/VirtualMedia/CD1"
	if !slices.Equal(v.Members, []string{slot, "/redfish/v1/Managers/BMC/VirtualMedia/Floppy1"}) || !v.Verify {
		t.Errorf("virtual media: members %v, VerifyCertificate %v", v.Members, v.Verify)
	}
	// Before the CA is in the slot's Certificates the BMC refuses the image server.
	wantSushyError(t, reg, "insert from an untrusted server", v.Untrusted, "BadRequestError", http.StatusBadRequest, "ResourceAtUriUnauthorized")
	if !strings.HasPrefix(v.Cert, slot+"/Certificates/") {
		t.Errorf("certificate created at %q", v.Cert)
	}
	if len(v.Inserted) != 2 || v.Inserted[0] != true || v.Inserted[1] != img.URL || len(v.Ejected) != 2 || v.Ejected[0] != false || v.Ejected[1] != "" {
		t.Errorf("insert: %v, eject: %v", v.Inserted, v.Ejected)
	}
	if n := img.gets.Load(); n != 1 {
		t.Errorf("the image server served %d GETs, want 1 (the trusted insert)", n)
	}
	// sushy sent InsertMedia without Inserted/WriteProtected, which this profile refuses: the
	// refused insert was the untrusted one only.
	var inserts []int
	for _, q := range requests(t, vm) {
		if q.Path == slot+"/Actions/VirtualMedia.InsertMedia" {
			inserts = append(inserts, q.Status)
		}
	}
	if !slices.Equal(inserts, []int{http.StatusBadRequest, http.StatusNoContent}) {
		t.Errorf("InsertMedia answers %v, want [400 204]", inserts)
	}
}

func wantSushyError(t *testing.T, reg registry, what string, e *sushyError, class string, status int, id string, args ...string) {
	t.Helper()
	if e == nil {
		t.Errorf("%s: no exception", what)
		return
	}
	if e.Class != class || e.Status != status || e.Code != baseRegistry+id || len(e.IDs) == 0 || e.IDs[0] != baseRegistry+id {
		t.Errorf("%s: %+v, want %s, %d, %s", what, e, class, status, baseRegistry+id)
		return
	}
	// sushy's detail is the message of the most severe ExtendedInfo entry: the extended message
	// reached the user.
	if want := reg.text(id, e.Args[0]...); e.Detail != want {
		t.Errorf("%s: detail %q, want %q", what, e.Detail, want)
	}
	if args != nil && !slices.Equal(e.Args[0], args) {
		t.Errorf("%s: MessageArgs %q, want %q", what, e.Args[0], args)
	}
}

// TestConformanceGofish drives the emulator with gofish v0.20.0 directly: session and basic auth,
// systems, reset, the boot override with ETags, and virtual media.
func TestConformanceGofish(t *testing.T) {
	t.Parallel()
	b := labredfish.Start(t, labredfish.Options{Profile: "dmtf"})
	img := startImageServer(t)
	ctx := t.Context()
	endpoint := "https://" + b.Addr
	c, err := gofish.ConnectContext(ctx, gofish.ClientConfig{Endpoint: endpoint, Username: b.User, Password: b.Password, HTTPClient: b.Client()})
	if err != nil {
		t.Fatalf("gofish session login: %v", err)
	}
	sess, err := c.GetSession()
	if err != nil || sess.ID == "" || sess.Token == "" {
		t.Fatalf("gofish session: %+v, %v", sess, err)
	}

	systems, err := c.Service.Systems()
	if err != nil || len(systems) != 1 {
		t.Fatalf("systems: %d, %v", len(systems), err)
	}
	sys := systems[0]
	var resets []string
	for _, r := range sys.SupportedResetTypes {
		resets = append(resets, string(r))
	}
	if sys.ID != b.SystemID || sys.PowerState != redfish.OffPowerState || !slices.Equal(resets, dmtfResetTypes) {
		t.Errorf("system %s: PowerState %s, ResetTypes %v", sys.ID, sys.PowerState, resets)
	}
	refresh := func(t *testing.T) *redfish.ComputerSystem {
		t.Helper()
		s, err := redfish.GetComputerSystem(c, sys.ODataID)
		if err != nil {
			t.Fatalf("get system: %v", err)
		}
		return s
	}

	t.Run("boot override with ETags", func(t *testing.T) {
		once := redfish.Boot{BootSourceOverrideEnabled: redfish.OnceBootSourceOverrideEnabled, BootSourceOverrideTarget: redfish.CdBootSourceOverrideTarget}
		if err := sys.SetBoot(once); err != nil {
			t.Fatalf("SetBoot Once Cd: %v", err)
		}
		// sys still carries the ETag of its GET, which the PATCH above made stale. gofish sends it
		// as If-Match: RFC 7232 § 3.1 and DSP0266 § "ETags" (a service that returns ETags honours
		// If-Match on PATCH) make that 412 Precondition Failed, and nothing changes.
		err := sys.SetBoot(redfish.Boot{BootSourceOverrideEnabled: redfish.ContinuousBootSourceOverrideEnabled, BootSourceOverrideTarget: redfish.PxeBootSourceOverrideTarget})
		var ge *common.Error
		if !errors.As(err, &ge) || ge.HTTPReturnedStatusCode != http.StatusPreconditionFailed || ge.Code != baseRegistry+"GeneralError" {
			t.Fatalf("SetBoot with a stale ETag: %v, want 412 %sGeneralError", err, baseRegistry)
		}
		fresh := refresh(t)
		if fresh.Boot.BootSourceOverrideEnabled != redfish.OnceBootSourceOverrideEnabled || fresh.Boot.BootSourceOverrideTarget != redfish.CdBootSourceOverrideTarget {
			t.Fatalf("after the refused PATCH: %+v", fresh.Boot)
		}
		// With the current ETag the same PATCH goes through.
		if err := fresh.SetBoot(once); err != nil {
			t.Fatalf("SetBoot with the current ETag: %v", err)
		}
	})

	t.Run("reset", func(t *testing.T) {
		s := refresh(t)
		if err := s.Reset(redfish.OnResetType); err != nil {
			t.Fatalf("Reset On: %v", err)
		}
		// The power-on used the Once override and changed the system's ETag; s still holds the
		// old one, which gofish also sends as If-Match on action POSTs. DSP0266 § "ETags" asks for
		// If-Match on PUT and PATCH; an action's target is not the resource the ETag belongs to,
		// so the emulator (like sushy, which sends none) leaves action POSTs unconditional.
		if err := s.Reset(redfish.ForceOffResetType); err != nil {
			t.Fatalf("Reset ForceOff with the system's previous ETag: %v", err)
		}
		var states []string
		for _, q := range requests(t, b) {
			if q.Path == sys.ODataID+"/Actions/ComputerSystem.Reset" {
				states = append(states, strconv.Itoa(q.Status))
			}
		}
		after := refresh(t)
		if after.PowerState != redfish.OffPowerState || after.Boot.BootSourceOverrideEnabled != redfish.DisabledBootSourceOverrideEnabled || !slices.Equal(states, []string{"204", "204"}) {
			t.Errorf("after On and ForceOff: PowerState %s, override %s, reset answers %v", after.PowerState, after.Boot.BootSourceOverrideEnabled, states)
		}
	})

	t.Run("virtual media", func(t *testing.T) {
		vms, err := refresh(t).VirtualMedia()
		if err != nil || len(vms) != 2 {
			t.Fatalf("virtual media: %d, %v", len(vms), err)
		}
		i := slices.IndexFunc(vms, func(v *redfish.VirtualMedia) bool { return v.ID == "CD1" })
		if i < 0 || !vms[i].SupportsMediaInsert || !vms[i].SupportsMediaEject || vms[i].ODataID != sys.ODataID+"/VirtualMedia/CD1" {
			t.Fatalf("no CD1 slot with InsertMedia and EjectMedia under the system: %+v", vms)
		}
		cd := vms[i]
		resp, err := c.Post(cd.ODataID+"/Certificates", map[string]string{"CertificateString": string(img.CAPEM), "CertificateType": "PEM"})
		if err != nil {
			t.Fatalf("POST the image server's CA: %v", err)
		}
		loc := resp.Header.Get("Location")
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || !strings.HasPrefix(loc, cd.ODataID+"/Certificates/") {
			t.Fatalf("POST certificate: %d, Location %q", resp.StatusCode, loc)
		}
		resp, err = c.Patch(cd.ODataID, map[string]bool{"VerifyCertificate": true})
		if err != nil {
			t.Fatalf("PATCH VerifyCertificate: %v", err)
		}
		resp.Body.Close()
		// gofish's InsertMedia sends Image, Inserted and WriteProtected (and the slot's stale ETag as
		// If-Match, see reset); sushy leaves Inserted and WriteProtected out when they are true.
		// Both are right: DSP2046 VirtualMedia.InsertMedia makes them optional, defaulting to true,
		// and the "dmtf" profile takes either (the "manager-vmedia" one refuses them, as Supermicro
		// does, see TestConformanceQuirkProfiles).
		if err := cd.InsertMedia(img.URL, true, true); err != nil {
			t.Fatalf("InsertMedia: %v", err)
		}
		got, err := redfish.GetVirtualMedia(c, cd.ODataID)
		if err != nil || !got.Inserted || got.Image != img.URL || got.ConnectedVia != redfish.URIConnectedVia || !got.VerifyCertificate || img.gets.Load() != 1 {
			t.Fatalf("after InsertMedia: %+v, %v (image GETs %d)", got, err, img.gets.Load())
		}
		if err := got.EjectMedia(); err != nil {
			t.Fatalf("EjectMedia: %v", err)
		}
		got, err = redfish.GetVirtualMedia(c, cd.ODataID)
		if err != nil || got.Inserted || got.Image != "" {
			t.Fatalf("after EjectMedia: %+v, %v", got, err)
		}
	})

	t.Run("basic auth and logout", func(t *testing.T) {
		loginsBefore := countRequests(requests(t, b), http.MethodPost, "/redfish/v1/SessionService/Sessions")
		basic, err := gofish.ConnectContext(ctx, gofish.ClientConfig{Endpoint: endpoint, Username: b.User, Password: b.Password, HTTPClient: b.Client(), BasicAuth: true})
		if err != nil {
			t.Fatalf("gofish basic auth: %v", err)
		}
		if systems, err := basic.Service.Systems(); err != nil || len(systems) != 1 || systems[0].ID != b.SystemID {
			t.Fatalf("systems over basic auth: %v", err)
		}
		if n := countRequests(requests(t, b), http.MethodPost, "/redfish/v1/SessionService/Sessions"); n != loginsBefore {
			t.Errorf("basic auth made %d session logins", n-loginsBefore)
		}

		c.Logout()
		// gofish keeps the session's URI (the login's Location) as its ID.
		if !hasRequest(requests(t, b), http.MethodDelete, sess.ID, http.StatusNoContent) {
			t.Errorf("gofish's Logout did not delete session %s", sess.ID)
		}
		if n := getJSON(t, b, "/redfish/v1/SessionService/Sessions")["Members@odata.count"]; n != 0.0 {
			t.Errorf("sessions left after Logout: %v", n)
		}
		if _, err := redfish.GetComputerSystem(c, sys.ODataID); !isGofishError(err, http.StatusUnauthorized, "NoValidSession") {
			t.Errorf("the logged-out token still works: %v", err)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		_, err := gofish.ConnectContext(ctx, gofish.ClientConfig{Endpoint: endpoint, Username: b.User, Password: "not-" + b.Password, HTTPClient: b.Client()})
		if !isGofishError(err, http.StatusUnauthorized, "NoValidSession") {
			t.Errorf("session login with a wrong password: %v", err)
		}
	})
}

func isGofishError(err error, status int, id string) bool {
	var ge *common.Error
	return errors.As(err, &ge) && ge.HTTPReturnedStatusCode == status && ge.Code == baseRegistry+id &&
		len(ge.ExtendedInfos) > 0 && ge.ExtendedInfos[0].MessageID == baseRegistry+id
}

// TestConformanceBmclib drives the emulator with bmclib v2.3.5 the way pkg/power configures it: the
// gofish (Redfish) provider alone, TLS verified against the BMC's CA, a per-provider timeout.
func TestConformanceBmclib(t *testing.T) {
	t.Parallel()
	b := labredfish.Start(t, labredfish.Options{Profile: "dmtf"})
	ctx := t.Context()
	newClient := func(t *testing.T, caPEM []byte) *bmclib.Client {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			t.Fatal("no CA certificate")
		}
		cl := bmclib.NewClient("127.0.0.1", b.User, b.Password, bmclib.WithRedfishPort(strconv.Itoa(b.Port)),
			bmclib.WithSecureTLS(pool), bmclib.WithPerProviderTimeout(15*time.Second))
		cl.Registry.Drivers = cl.Registry.For("gofish")
		if len(cl.Registry.Drivers) != 1 {
			t.Fatalf("bmclib has %d gofish providers", len(cl.Registry.Drivers))
		}
		return cl
	}
	sys := "/redfish/v1/Systems/" + b.SystemID

	t.Run("TLS is verified", func(t *testing.T) {
		other, _ := pkitest.Issue(t)
		cl := newClient(t, other)
		if err := cl.Open(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("bmclib with another CA opened the BMC: %v", err)
		}
	})

	cl := newClient(t, b.CAPEM)
	if err := cl.Open(ctx); err != nil {
		t.Fatalf("bmclib Open: %v", err)
	}
	power := func(want string) {
		t.Helper()
		if st, err := cl.GetPowerState(ctx); err != nil || st != want {
			t.Errorf("power state %q, %v; want %q", st, err, want)
		}
	}
	power("Off")
	if ok, err := cl.SetBootDevice(ctx, "cdrom", false, false); err != nil || !ok {
		t.Fatalf("SetBootDevice cdrom: %v, %v", ok, err)
	}
	ov, err := cl.GetBootDeviceOverride(ctx)
	if err != nil || ov.Device != "cdrom" || ov.IsPersistent || ov.IsEFIBoot {
		t.Errorf("boot override read back: %+v, %v", ov, err)
	}
	boot := getJSON(t, b, sys)["Boot"]
	if str(boot, "BootSourceOverrideTarget") != "Cd" || str(boot, "BootSourceOverrideEnabled") != "Once" || str(boot, "BootSourceOverrideMode") != "Legacy" {
		t.Errorf("boot override on the BMC: %v", boot)
	}
	// bmclib's SetBootDevice PATCHes the Boot object it read, changed, and falls back to the
	// override fields alone when that is refused: the first PATCH must already be accepted, or the
	// fallback hides a service that refuses its own representation.
	for _, q := range requests(t, b) {
		if q.Method == http.MethodPatch && q.Status != http.StatusOK {
			t.Errorf("bmclib's boot PATCH was answered %d", q.Status)
		}
	}

	if ok, err := cl.SetPowerState(ctx, "on"); err != nil || !ok {
		t.Fatalf("power on: %v, %v", ok, err)
	}
	power("On")
	if s := getJSON(t, b, sys); str(s, "Boot", "BootSourceOverrideEnabled") != "Disabled" {
		t.Errorf("the power-on did not use the Once override: %v", s["Boot"])
	}
	if ok, err := cl.SetPowerState(ctx, "off"); err != nil || !ok {
		t.Fatalf("power off: %v, %v", ok, err)
	}
	power("Off")
	if err := cl.Close(ctx); err != nil {
		t.Errorf("bmclib Close: %v", err)
	}
	if n := getJSON(t, b, "/redfish/v1/SessionService/Sessions")["Members@odata.count"]; n != 0.0 {
		t.Errorf("sessions left after bmclib's Close: %v", n)
	}
}

// TestConformanceErrors checks error answers with plain net/http: the HTTP status and DSP0266's
// extended error (§ "Error responses": error.code and error.message, and @Message.ExtendedInfo with
// a MessageId of the Base registry, whose Message is the registry's text with MessageArgs in it).
func TestConformanceErrors(t *testing.T) {
	t.Parallel()
	b := labredfish.Start(t, labredfish.Options{Profile: "dmtf"})
	reg := loadRegistry(t)
	sys := "/redfish/v1/Systems/" + b.SystemID
	reset := sys + "/Actions/ComputerSystem.Reset"
	for _, tc := range []struct {
		name, method, path, body string
		noAuth                   bool
		header                   map[string]string
		status                   int
		id                       string
		args                     []string
		respHeader               [2]string // a header the answer must carry
	}{
		{name: "malformed JSON", method: http.MethodPatch, path: sys, body: `{"Boot": {`, status: 400, id: "MalformedJSON"},
		{name: "empty JSON object", method: http.MethodPatch, path: sys, body: `{}`, status: 400, id: "EmptyJSON"},
		{name: "unknown property", method: http.MethodPatch, path: sys, body: `{"Bogus": 1}`, status: 400, id: "PropertyUnknown", args: []string{"Bogus"}},
		{name: "unknown Boot property", method: http.MethodPatch, path: sys, body: `{"Boot": {"Bogus": "x"}}`, status: 400, id: "PropertyUnknown", args: []string{"Boot/Bogus"}},
		{name: "read-only property", method: http.MethodPatch, path: sys, body: `{"PowerState": "On"}`, status: 400, id: "PropertyNotWritable", args: []string{"PowerState"}},
		{name: "value not allowed", method: http.MethodPatch, path: sys, body: `{"Boot": {"BootSourceOverrideEnabled": "Always"}}`, status: 400, id: "PropertyValueNotInList", args: []string{"Always", "Boot/BootSourceOverrideEnabled"}},
		{name: "stale If-Match", method: http.MethodPatch, path: sys, body: `{"Boot": {"BootSourceOverrideEnabled": "Once"}}`, header: map[string]string{"If-Match": `"sys-stale"`}, status: 412, id: "GeneralError"},
		{name: "missing ResetType", method: http.MethodPost, path: reset, body: `{}`, status: 400, id: "ActionParameterMissing", args: []string{"ComputerSystem.Reset", "ResetType"}},
		{name: "ResetType not offered", method: http.MethodPost, path: reset, body: `{"ResetType": "Bogus"}`, status: 400, id: "PropertyValueNotInList", args: []string{"Bogus", "ResetType"}},
		{name: "unknown action parameter", method: http.MethodPost, path: reset, body: `{"ResetType": "On", "Delay": 5}`, status: 400, id: "ActionParameterUnknown", args: []string{"ComputerSystem.Reset", "Delay"}},
		{name: "unauthenticated", method: http.MethodGet, path: sys, noAuth: true, status: 401, id: "NoValidSession", respHeader: [2]string{"WWW-Authenticate", `Basic realm="Redfish"`}},
		{name: "unknown token", method: http.MethodGet, path: sys, noAuth: true, header: map[string]string{"X-Auth-Token": "0123456789abcdef"}, status: 401, id: "NoValidSession"},
		{name: "wrong password", method: http.MethodGet, path: sys, noAuth: true, header: map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(b.User+":not-"+b.Password))}, status: 401, id: "NoValidSession"},
		{name: "unknown resource", method: http.MethodGet, path: "/redfish/v1/Systems/nope", status: 404, id: "ResourceMissingAtURI", args: []string{"/redfish/v1/Systems/nope"}},
		{name: "method not allowed", method: http.MethodDelete, path: sys, status: 405, id: "GeneralError", respHeader: [2]string{"Allow", "GET, HEAD, PATCH"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, b, tc.method, tc.path, tc.body, !tc.noAuth, tc.header)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s %s: %d, want %d\n%s", tc.method, tc.path, resp.StatusCode, tc.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
			if tc.respHeader[0] != "" && resp.Header.Get(tc.respHeader[0]) != tc.respHeader[1] {
				t.Errorf("%s: %q, want %q", tc.respHeader[0], resp.Header.Get(tc.respHeader[0]), tc.respHeader[1])
			}
			var e errorBody
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, body)
			}
			checkErrorBody(t, reg, e, tc.id, tc.args...)
		})
	}
	// Nothing above changed the system.
	if s := getJSON(t, b, sys); s["PowerState"] != "Off" || str(s, "Boot", "BootSourceOverrideEnabled") != "Disabled" {
		t.Errorf("refused requests changed the system: %v %v", s["PowerState"], s["Boot"])
	}
}

// TestConformanceTasks checks the "tasks" profile, where InsertMedia runs as a Task (DSP0266
// § "Asynchronous operations"): 202 Accepted with a task monitor in Location, the monitor answering
// 202 until the operation ends and then the operation's own answer; the Task's TaskState.
func TestConformanceTasks(t *testing.T) {
	t.Parallel()
	b := labredfish.Start(t, labredfish.Options{Profile: "tasks"})
	img := startImageServer(t)
	reg := loadRegistry(t)
	slot := "/redfish/v1/Systems/" + b.SystemID + "/VirtualMedia/CD1"
	const locations = "/redfish/v1/CertificateService/CertificateLocations"

	resp, body := do(t, b, http.MethodPost, slot+"/Certificates", mustJSON(t, map[string]string{"CertificateString": string(img.CAPEM), "CertificateType": "PEM"}), true, nil)
	certURI := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusCreated || !strings.HasPrefix(certURI, slot+"/Certificates/") {
		t.Fatalf("POST certificate: %d %q\n%s", resp.StatusCode, certURI, body)
	}
	// CertificateLocations links the live certificate, and each of its links resolves.
	links := asList(field(getJSON(t, b, locations), "Links", "Certificates"))
	var ids []string
	for _, l := range links {
		ids = append(ids, str(l, "@odata.id"))
		if _, err := b.Get(str(l, "@odata.id")); err != nil {
			t.Errorf("CertificateLocations links a certificate that is not there: %v", err)
		}
	}
	if !slices.Contains(ids, certURI) {
		t.Errorf("CertificateLocations %v lacks %s", ids, certURI)
	}
	if resp, body := do(t, b, http.MethodPatch, slot, `{"VerifyCertificate": true}`, true, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("PATCH VerifyCertificate: %d\n%s", resp.StatusCode, body)
	}

	// insert starts InsertMedia, checks the 202 and polls the monitor; it returns the Task and the
	// monitor's final answer.
	insert := func() (task map[string]any, final *http.Response, finalBody []byte) {
		t.Helper()
		resp, body := do(t, b, http.MethodPost, slot+"/Actions/VirtualMedia.InsertMedia", mustJSON(t, map[string]string{"Image": img.URL}), true, nil)
		monitor := resp.Header.Get("Location")
		var accepted map[string]any
		_ = json.Unmarshal(body, &accepted)
		if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(monitor, "/redfish/v1/TaskService/") || str(accepted, "TaskMonitor") != monitor {
			t.Fatalf("InsertMedia: %d, Location %q\n%s", resp.StatusCode, monitor, body)
		}
		// The 202's body is the Task, not yet in a final state (DSP2046 Task.TaskState: New,
		// Starting and Running come before Completed or Exception).
		if s := str(accepted, "TaskState"); s != "Running" && s != "New" && s != "Starting" {
			t.Errorf("the 202's Task is %q", s)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, body := do(t, b, http.MethodGet, monitor, "", true, nil)
			if resp.StatusCode != http.StatusAccepted {
				final, finalBody = resp, body
				break
			}
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("the monitor's 202 has no Retry-After")
			}
			if time.Now().After(deadline) {
				t.Fatalf("the task monitor still answers 202 after 20 s")
			}
			time.Sleep(100 * time.Millisecond) // faster than its Retry-After (1 s): the fetch is local
		}
		return getJSON(t, b, str(accepted, "@odata.id")), final, finalBody
	}

	task, final, _ := insert()
	if final.StatusCode != http.StatusNoContent {
		t.Errorf("the finished monitor answered %d, want InsertMedia's 204", final.StatusCode)
	}
	msgs := asList(task["Messages"])
	if task["TaskState"] != "Completed" || task["TaskStatus"] != "OK" || len(msgs) == 0 || str(msgs[0], "MessageId") != baseRegistry+"Success" {
		t.Errorf("task: %v", task)
	}
	if s := getJSON(t, b, slot); s["Inserted"] != true || s["Image"] != img.URL || img.gets.Load() != 1 {
		t.Errorf("slot after the task: Inserted %v Image %v (image GETs %d)", s["Inserted"], s["Image"], img.gets.Load())
	}

	// A failing insert: eject, take the CA away, insert again.
	if resp, body := do(t, b, http.MethodPost, slot+"/Actions/VirtualMedia.EjectMedia", `{}`, true, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("EjectMedia: %d\n%s", resp.StatusCode, body)
	}
	if resp, body := do(t, b, http.MethodDelete, certURI, "", true, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE certificate: %d\n%s", resp.StatusCode, body)
	}
	if ids := getJSON(t, b, locations); strings.Contains(fmt.Sprint(ids), certURI) {
		t.Errorf("CertificateLocations still links the deleted %s", certURI)
	}
	task, final, finalBody := insert()
	if final.StatusCode != http.StatusBadRequest {
		t.Errorf("the failed task's monitor answered %d, want 400", final.StatusCode)
	}
	var e errorBody
	if err := json.Unmarshal(finalBody, &e); err != nil {
		t.Fatalf("the failed task's monitor: %v\n%s", err, finalBody)
	}
	checkErrorBody(t, reg, e, "ResourceAtUriUnauthorized")
	msgs = asList(task["Messages"])
	if task["TaskState"] != "Exception" || task["TaskStatus"] != "Critical" || len(msgs) == 0 || str(msgs[0], "MessageId") != baseRegistry+"ResourceAtUriUnauthorized" {
		t.Errorf("failed task: %v", task)
	}
	if s := getJSON(t, b, slot); s["Inserted"] != false || img.gets.Load() != 1 {
		t.Errorf("slot after the failed task: Inserted %v (image GETs %d)", s["Inserted"], img.gets.Load())
	}
	if n := len(asList(getJSON(t, b, "/redfish/v1/TaskService/Tasks")["Members"])); n != 2 {
		t.Errorf("%d tasks, want 2", n)
	}
}

// TestConformanceQuirkProfiles checks the vendor profiles through gofish and net/http: virtual
// media under the Manager only, and the ResetTypes the profile offers.
func TestConformanceQuirkProfiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		profile string
		resets  []string
	}{
		{"manager-vmedia", managerVMediaResetTypes},
		{"hpe-ilo", hpeILOResetTypes},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			t.Parallel()
			b := labredfish.Start(t, labredfish.Options{Profile: tc.profile})
			c, err := gofish.ConnectContext(t.Context(), gofish.ClientConfig{Endpoint: "https://" + b.Addr, Username: b.User, Password: b.Password, HTTPClient: b.Client(), BasicAuth: true})
			if err != nil {
				t.Fatal(err)
			}
			systems, err := c.Service.Systems()
			if err != nil || len(systems) != 1 {
				t.Fatalf("systems: %v", err)
			}
			var resets []string
			for _, r := range systems[0].SupportedResetTypes {
				resets = append(resets, string(r))
			}
			if !slices.Equal(resets, tc.resets) {
				t.Errorf("ResetType@Redfish.AllowableValues %v, want %v", resets, tc.resets)
			}
			sys := getJSON(t, b, systems[0].ODataID)
			if _, ok := sys["VirtualMedia"]; ok {
				t.Errorf("the System links VirtualMedia: %v", sys["VirtualMedia"])
			}
			if resp, _ := do(t, b, http.MethodGet, systems[0].ODataID+"/VirtualMedia", "", true, nil); resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET the System's VirtualMedia: %d, want 404", resp.StatusCode)
			}
			// A ResetType the profile does not offer is refused.
			if resp, body := do(t, b, http.MethodPost, systems[0].ODataID+"/Actions/ComputerSystem.Reset", `{"ResetType": "PowerCycle"}`, true, nil); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("PowerCycle: %d\n%s", resp.StatusCode, body)
			}

			managers, err := c.Service.Managers()
			if err != nil || len(managers) != 1 || managers[0].ODataID != "/redfish/v1/Managers/BMC" {
				t.Fatalf("managers: %v", err)
			}
			vms, err := managers[0].VirtualMedia()
			var paths []string
			for _, v := range vms {
				paths = append(paths, v.ODataID)
			}
			slices.Sort(paths)
			if err != nil || !slices.Equal(paths, []string{"/redfish/v1/Managers/BMC/VirtualMedia/CD1", "/redfish/v1/Managers/BMC/VirtualMedia/Floppy1"}) {
				t.Fatalf("the Manager's virtual media: %v, %v", paths, err)
			}
			if tc.profile == "manager-vmedia" {
				// Supermicro X11/X12 refuse InsertMedia's Inserted and WriteProtected, which gofish's
				// InsertMedia always sends (bmclib retries without them; sushy leaves defaults out).
				cd := vms[slices.IndexFunc(vms, func(v *redfish.VirtualMedia) bool { return v.ID == "CD1" })]
				err := cd.InsertMedia("https://127.0.0.1:1/node.iso", true, true)
				if !isGofishError(err, http.StatusBadRequest, "ActionParameterUnknown") {
					t.Errorf("gofish InsertMedia with Inserted and WriteProtected: %v", err)
				}
			}
		})
	}
}

// --- helpers ---

// registry is the mockup's Base message registry: MessageId (without prefix) → message text.
type registry map[string]string

func loadRegistry(t *testing.T) registry {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(labredfish.MockupDir(t), "Registries", "Base.1.5.0.json"))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		Messages map[string]struct{ Message string }
	}
	if err := json.Unmarshal(data, &reg); err != nil {
		t.Fatal(err)
	}
	out := registry{}
	for id, m := range reg.Messages {
		out[id] = m.Message
	}
	return out
}

// text is the registry's message id with args in place of %1, %2…
func (r registry) text(id string, args ...string) string {
	s := r[id]
	for i := len(args); i > 0; i-- {
		s = strings.ReplaceAll(s, "%"+strconv.Itoa(i), args[i-1])
	}
	return s
}

// errorBody is DSP0266's error response.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Info    []struct {
			MessageID   string `json:"MessageId"`
			Message     string
			MessageArgs []string
			Severity    string
			Resolution  string
		} `json:"@Message.ExtendedInfo"`
	} `json:"error"`
}

// checkErrorBody checks e against DSP0266 § "Error responses": code is the first message's
// MessageId, message its Message, which is the Base registry's text for id with args (nil: any
// args, as long as the text is the registry's with them).
func checkErrorBody(t *testing.T, reg registry, e errorBody, id string, args ...string) {
	t.Helper()
	if _, ok := reg[id]; !ok {
		t.Fatalf("the test expects %s, which the Base registry lacks", id)
	}
	if len(e.Error.Info) == 0 {
		t.Fatalf("no @Message.ExtendedInfo: %+v", e)
	}
	m := e.Error.Info[0]
	if m.MessageID != baseRegistry+id || e.Error.Code != m.MessageID {
		t.Errorf("MessageId %q, code %q; want %s", m.MessageID, e.Error.Code, baseRegistry+id)
	}
	if args != nil && !slices.Equal(m.MessageArgs, args) {
		t.Errorf("MessageArgs %q, want %q", m.MessageArgs, args)
	}
	if want := reg.text(id, m.MessageArgs...); m.Message != want || e.Error.Message != want {
		t.Errorf("message %q / %q, want the registry's %q", m.Message, e.Error.Message, want)
	}
	if m.Severity == "" || m.Resolution == "" {
		t.Errorf("no Severity or Resolution: %+v", m)
	}
}

// do sends one request to b (with basic auth unless auth is false) with a raw body, so that
// malformed JSON can be sent. It returns the answer and its body.
func do(t *testing.T, b labredfish.BMC, method, path, body string, auth bool, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, "https://"+b.Addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth {
		req.SetBasicAuth(b.User, b.Password)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := b.Client()
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

func getJSON(t *testing.T, b labredfish.BMC, path string) map[string]any {
	t.Helper()
	data, err := b.Get(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return v
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// field walks decoded JSON objects by keys (nil if a key is absent).
func field(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

// str is field's string ("" if absent or not a string).
func str(v any, keys ...string) string {
	s, _ := field(v, keys...).(string)
	return s
}

func asList(v any) []any { l, _ := v.([]any); return l }

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func requests(t *testing.T, b labredfish.BMC) []labredfish.Request {
	t.Helper()
	r, err := b.Requests()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hasRequest(reqs []labredfish.Request, method, path string, status int) bool {
	return slices.ContainsFunc(reqs, func(q labredfish.Request) bool {
		return q.Method == method && q.Path == path && q.Status == status
	})
}

func hasMethod(reqs []labredfish.Request, method string) bool {
	return slices.ContainsFunc(reqs, func(q labredfish.Request) bool { return q.Method == method })
}

func countRequests(reqs []labredfish.Request, method, path string) int {
	n := 0
	for _, q := range reqs {
		if q.Method == method && q.Path == path {
			n++
		}
	}
	return n
}

// writeSecret writes v as JSON into dir/name, 0600 (it holds a password).
func writeSecret(t *testing.T, dir, name string, v any) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(mustJSON(t, v)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// redact replaces the BMCs' passwords, and their basic-auth header values, in a client's output.
func redact(s string, bmcs ...labredfish.BMC) string {
	for _, b := range bmcs {
		s = strings.ReplaceAll(s, base64.StdEncoding.EncodeToString([]byte(b.User+":"+b.Password)), "<redacted>")
		s = strings.ReplaceAll(s, b.Password, "<redacted>")
	}
	return s
}

// peerEnv is the whole environment of a Python client: no proxy settings, and in particular no
// REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE, which python-requests prefers to a Session's own verify
// setting (Session.merge_environment_settings replaces a request's verify=None with the
// environment's bundle before merging in session.verify) — so sushy's verify=CAFILE would silently
// be replaced by whatever bundle the caller's environment names.
func peerEnv(home string) []string {
	return []string{"PATH=/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"}
}

// requireSushy returns Debian's python3 when it imports sushy (python3-sushy). Debian's interpreter
// by path, not the first python3 on PATH: the package installs into Debian's dist-packages.
func requireSushy(t *testing.T) string {
	t.Helper()
	const python = "/usr/bin/python3"
	out, err := exec.Command(python, "-c", "import sushy").CombinedOutput()
	if err == nil {
		return python
	}
	why := fmt.Sprintf("%s needs OpenStack's sushy for %s (%s -c 'import sushy': %v %s); `make deps` installs python3-sushy", t.Name(), python, python, err, bytes.TrimSpace(out))
	if labns.InCI() {
		t.Fatalf("REAL PEER MISSING: %s", why)
	}
	t.Skipf("SKIPPED: real peer missing: %s", why)
	return ""
}

// imageServer is an HTTPS server with a CA of its own (not the BMC's) serving a small image at
// URL, which the BMC fetches for InsertMedia.
type imageServer struct {
	URL   string
	CAPEM []byte
	gets  atomic.Int32
}

func startImageServer(t *testing.T) *imageServer {
	t.Helper()
	ca, leaf := pkitest.Issue(t)
	s := &imageServer{CAPEM: ca}
	image := bytes.Repeat([]byte("not really an ISO 9660 image\n"), 4096)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/node.iso" {
			http.NotFound(w, r)
			return
		}
		s.gets.Add(1)
		http.ServeContent(w, r, "node.iso", time.Time{}, bytes.NewReader(image))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes of untrusted inserts
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.URL = srv.URL + "/node.iso"
	return s
}
