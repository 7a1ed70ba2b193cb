// Package redfishbmc is the lab's Redfish BMC: an emulator of our own, because no real BMC runs on
// these machines and nobody ships an emulator they can install (sushy-tools was third-party code that
// shared/ may not carry, and PyPI is not reachable). It is test harness, never product.
//
// The static tree is DMTF's public-rackmount1 mockup (shared/peers/redfish-mockups), copied with its
// System Id rewritten (PrepareTree). On top of it the parts a provisioning client drives are live,
// following DSP0266 (the Redfish specification) and DSP2046 (the schema guide):
//
//   - authentication: sessions (POST SessionService/Sessions → X-Auth-Token and Location, DELETE to
//     log out, idle timeout SessionService.SessionTimeout) and HTTP basic auth, each switchable
//     (Profile); the service root, /redfish, $metadata and odata are readable without it (DSP0266
//     § "Authentication requirements");
//   - ComputerSystem: PowerState, ComputerSystem.Reset with the profile's ResetTypes, and the boot
//     override (Boot.BootSourceOverrideTarget/Enabled/Mode) by PATCH, with ETags and If-Match
//     (412 on a stale one), "Once" reverting to "Disabled" at the boot that used it;
//   - VirtualMedia slots (under the System, the Manager or both, per profile): InsertMedia, which
//     really fetches the image over HTTP(S), verifying TLS against the slot's Certificates when
//     VerifyCertificate is on, and attaches it to the host as its CD: whole before the answer
//     (TransferMethod Upload, the default) or read on demand through nbdkit's curl plugin
//     (TransferMethod Stream); EjectMedia; the Certificates
//     collection (POST, DELETE); answered at once, or with a task monitor (202, TaskService) when the
//     profile says so (DSP0266 § "Asynchronous operations");
//   - errors as DSP0266's extended error format, with messages from the mockup's own Base registry.
//
// The host is a Machine: none (power state only) or a QEMU virtual machine driven over QMP, so that a
// power-on really boots it. One BMC is one process (Main), which test/labredfish starts for a test.
package redfishbmc

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Profile is the shape of the BMC: which DSP0266 options it implements and which vendor quirks it has.
type Profile struct {
	// Name is the profile's name (Profiles' key).
	Name string
	// Sessions: the service has a SessionService (X-Auth-Token logins). Off: the service root links
	// none and SessionService answers 404, as sushy-tools and older BMCs.
	Sessions bool
	// BasicAuth: HTTP basic auth is accepted on every request.
	BasicAuth bool
	// VirtualMediaUnder lists where the VirtualMedia collection is: "System" (DSP2046 since
	// ComputerSystem v1.13, newer iDRACs, the DMTF mockup), "Manager" (HPE iLO, Supermicro, older
	// iDRACs), or both.
	VirtualMediaUnder []string
	// ResetTypes are the ComputerSystem.Reset ResetTypes offered (ResetType@Redfish.AllowableValues).
	ResetTypes []string
	// InsertParams, when set, are the only InsertMedia parameters accepted; any other is refused with
	// ActionParameterUnknown (Supermicro X11/X12 refuse Inserted and WriteProtected).
	InsertParams []string
	// AsyncInsert: InsertMedia answers 202 Accepted with a task monitor, and the fetch runs as a Task.
	AsyncInsert bool
}

// Profiles are the named profiles: "dmtf" (the mockup as it is: sessions and basic auth, virtual
// media under the System, the mockup's ResetTypes and PowerCycle), "no-sessions" (basic auth only, as
// sushy-tools and older BMCs), "manager-vmedia" (Supermicro X12-like: virtual media under the
// Manager only, InsertMedia taking no Inserted/WriteProtected, ResetTypes without PowerCycle and
// PushPowerButton), "hpe-ilo" (virtual media under the Manager, sessions, iLO 5's ResetTypes: no
// GracefulRestart, no ForceOn, no PowerCycle) and "tasks" (dmtf, with InsertMedia as a Task).
var Profiles = map[string]Profile{
	"dmtf": {Name: "dmtf", Sessions: true, BasicAuth: true, VirtualMediaUnder: []string{"System"},
		ResetTypes: []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton", "PowerCycle"}},
	"no-sessions": {Name: "no-sessions", BasicAuth: true, VirtualMediaUnder: []string{"System"},
		ResetTypes: []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"}},
	"manager-vmedia": {Name: "manager-vmedia", Sessions: true, BasicAuth: true, VirtualMediaUnder: []string{"Manager"},
		ResetTypes:   []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"},
		InsertParams: []string{"Image", "UserName", "Password", "TransferProtocolType"}},
	"hpe-ilo": {Name: "hpe-ilo", Sessions: true, BasicAuth: true, VirtualMediaUnder: []string{"Manager"},
		ResetTypes: []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "Nmi", "PushPowerButton"}},
	"tasks": {Name: "tasks", Sessions: true, BasicAuth: true, VirtualMediaUnder: []string{"System"}, AsyncInsert: true,
		ResetTypes: []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton", "PowerCycle"}},
}

// overrideEnabled are BootSourceOverrideEnabled's values (DSP2046). Of the mockup's allowable
// BootSourceOverrideTarget values, Pxe, Cd and Hdd move that device first; the others are accepted
// and boot the machine's own order.
var overrideEnabled = []string{"Disabled", "Once", "Continuous"}

// sessionTimeout is SessionService.SessionTimeout, in seconds, that the emulator serves and enforces.
const sessionTimeout = 600

// Server is one emulated BMC: an http.Handler serving /redfish.
type Server struct {
	t        *tree
	prof     Profile
	user     string
	password string
	stateDir string
	log      *slog.Logger
	m        Machine
	sysPath  string
	mgrPath  string

	mu       sync.Mutex
	sessions map[string]*session // Id → session
	nextID   int
	boot     bootState
	sysETag  int
	slots    map[string]*slot // @odata.id → slot
	tasks    map[string]*task // Id → task
	nextTask int
}

type session struct {
	id, token, user string
	last            time.Time
}

type bootState struct {
	enabled, target, mode string
	// uefiTarget is Boot.UefiTargetBootSourceOverride, the UEFI device path booted when the target
	// is UefiTarget (read-write in DSP2046 ComputerSystem.Boot); it starts as the mockup's.
	uefiTarget string
}

type cert struct {
	id, pem string
}

type slot struct {
	path       string
	static     map[string]any // the mockup's resource
	image      string
	inserted   bool
	writeProt  bool
	transfer   string // TransferMethod
	protocol   string // TransferProtocolType
	verify     bool
	certs      []cert
	nextCert   int
	file       string  // the fetched image on the BMC's disk (Upload)
	stream     *stream // the image streamed to the host (Stream)
	etag       int
	busy       bool // an insert is running
	mediaTypes []string
}

// newServer builds the service over the loaded tree; m is the host (nil: power state only).
func newServer(t *tree, prof Profile, systemID, user, password, stateDir, firmware string, log *slog.Logger, newMachine func(nextBoot func() Boot) (Machine, error)) (*Server, error) {
	s := &Server{t: t, prof: prof, user: user, password: password, stateDir: stateDir, log: log,
		sysPath: "/redfish/v1/Systems/" + systemID, mgrPath: "/redfish/v1/Managers/BMC",
		sessions: map[string]*session{}, slots: map[string]*slot{}, tasks: map[string]*task{}}
	sys := t.res[s.sysPath]
	if sys == nil {
		return nil, fmt.Errorf("the tree has no %s (was it prepared for system id %s?)", s.sysPath, systemID)
	}
	if t.res[s.mgrPath] == nil {
		return nil, fmt.Errorf("the tree has no %s", s.mgrPath)
	}
	mode := "Legacy"
	if firmware == "UEFI" {
		mode = "UEFI"
	}
	uefiTarget, _ := asMap(sys["Boot"])["UefiTargetBootSourceOverride"].(string)
	s.boot = bootState{enabled: "Disabled", target: "None", mode: mode, uefiTarget: uefiTarget}
	// Slots: the mockup's, under the System; a copy of each under the Manager for profiles that have
	// virtual media there.
	coll := t.res[s.sysPath+"/VirtualMedia"]
	members, _ := coll["Members"].([]any)
	for _, mm := range members {
		id, _ := mm.(map[string]any)["@odata.id"].(string)
		res := t.res[id]
		if res == nil {
			continue
		}
		for _, under := range prof.VirtualMediaUnder {
			p := id
			if under == "Manager" {
				p = s.mgrPath + "/VirtualMedia/" + id[strings.LastIndex(id, "/")+1:]
			}
			var types []string
			for _, v := range asSlice(res["MediaTypes"]) {
				if str, ok := v.(string); ok {
					types = append(types, str)
				}
			}
			s.slots[p] = &slot{path: p, static: res, writeProt: true, mediaTypes: types}
		}
	}
	var err error
	if newMachine == nil {
		s.m = &powerOnly{nextBoot: s.consumeBoot}
	} else if s.m, err = newMachine(s.consumeBoot); err != nil {
		return nil, err
	}
	return s, nil
}

// consumeBoot is the boot a start of the host uses: the override when enabled ("Once" reverts to
// "Disabled", DSP2046 BootSourceOverrideEnabled), else the machine's own order.
func (s *Server) consumeBoot() Boot {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := Boot{Target: "None", UEFI: s.boot.mode == "UEFI"}
	switch s.boot.enabled {
	case "Once":
		b.Target = s.boot.target
		s.boot.enabled = "Disabled"
		s.sysETag++
	case "Continuous":
		b.Target = s.boot.target
	}
	s.log.Info("host start", "boot", b.Target, "uefi", b.UEFI)
	return b
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// clone deep-copies a decoded JSON value.
func clone(v map[string]any) map[string]any {
	b, _ := json.Marshal(v)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// ServeHTTP routes one request (see the package doc). No request reaches a handler unauthenticated
// except the service root, /redfish, $metadata, odata and the session login.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: 200}
	start := time.Now()
	defer func() {
		s.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "took", time.Since(start).Round(time.Microsecond))
	}()
	if err := s.serve(rec, r); err != nil {
		if err.status == http.StatusUnauthorized && s.prof.BasicAuth {
			rec.Header().Set("WWW-Authenticate", `Basic realm="Redfish"`)
		}
		s.t.writeError(rec, err)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) *apiError {
	p := r.URL.Path
	if p != "/redfish/v1/" {
		p = strings.TrimSuffix(p, "/")
	}
	if p == "/redfish/v1" {
		p = "/redfish/v1/"
	}
	switch {
	case p == "/redfish":
		return s.readOnly(w, r, map[string]any{"v1": "/redfish/v1/"}, "")
	case p == "/redfish/v1/":
		return s.readOnly(w, r, s.serviceRoot(), "")
	case p == "/redfish/v1/$metadata":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return methodNotAllowed(w, "GET")
		}
		w.Header().Set("Content-Type", "application/xml")
		_, _ = w.Write(s.t.metadata)
		return nil
	case p == "/redfish/v1/odata":
		return s.readOnly(w, r, s.t.res[p], "")
	case p == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost && s.prof.Sessions:
		return s.login(w, r)
	}
	who, err := s.authenticate(r)
	if err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(p, "/redfish/v1/SessionService"):
		if !s.prof.Sessions {
			return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
		}
		return s.sessionService(w, r, p, who)
	case p == s.sysPath:
		return s.system(w, r)
	case p == s.sysPath+"/Actions/ComputerSystem.Reset":
		return s.reset(w, r)
	case p == s.mgrPath:
		m := clone(s.t.res[p])
		if slices.Contains(s.prof.VirtualMediaUnder, "Manager") {
			m["VirtualMedia"] = map[string]any{"@odata.id": s.mgrPath + "/VirtualMedia"}
		}
		return s.readOnly(w, r, m, "")
	case p == s.sysPath+"/VirtualMedia" || p == s.mgrPath+"/VirtualMedia":
		return s.vmediaCollection(w, r, p)
	case strings.HasPrefix(p, "/redfish/v1/TaskService/"):
		return s.taskService(w, r, p)
	case p == certLocationsPath && s.t.res[p] != nil:
		return s.readOnly(w, r, s.certificateLocations(), "")
	}
	if sl, rest := s.slotFor(p); sl != nil {
		return s.vmedia(w, r, sl, rest)
	}
	if strings.HasPrefix(p, s.sysPath+"/VirtualMedia/") {
		return fail(http.StatusNotFound, "ResourceMissingAtURI", p) // slots this profile has elsewhere
	}
	if res := s.t.res[p]; res != nil {
		return s.readOnly(w, r, res, "")
	}
	return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
}

// serviceRoot is the mockup's, without the SessionService when the profile has none, and with the
// query features the emulator does not implement turned off.
func (s *Server) serviceRoot() map[string]any {
	root := clone(s.t.res["/redfish/v1/"])
	if !s.prof.Sessions {
		delete(root, "SessionService")
		delete(root, "Links")
	}
	root["ProtocolFeaturesSupported"] = map[string]any{
		"ExpandQuery": map[string]any{"ExpandAll": false, "Levels": false, "Links": false, "NoLinks": false},
		"SelectQuery": false, "FilterQuery": false, "OnlyMemberQuery": false, "ExcerptQuery": false}
	return root
}

// readOnly answers GET (and HEAD) with res; other methods get 405 (DSP0266: the Allow header lists
// the methods the resource supports).
func (s *Server) readOnly(w http.ResponseWriter, r *http.Request, res map[string]any, etag string) *apiError {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	writeJSON(w, http.StatusOK, res, etag)
	return nil
}

func methodNotAllowed(w http.ResponseWriter, allow string) *apiError {
	w.Header().Set("Allow", allow)
	return fail(http.StatusMethodNotAllowed, "GeneralError").withResolution("This resource supports " + allow + " only.")
}

// writeJSON writes v with the Redfish headers; a non-empty etag is sent as ETag and @odata.etag.
func writeJSON(w http.ResponseWriter, status int, v map[string]any, etag string) {
	if etag != "" {
		v = clone(v)
		v["@odata.etag"] = etag
		w.Header().Set("ETag", etag)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("OData-Version", "4.0")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// authenticate accepts a live session's X-Auth-Token, or HTTP basic auth when the profile has it.
// It returns the session's Id ("" for basic auth).
func (s *Server) authenticate(r *http.Request) (string, *apiError) {
	if tok := r.Header.Get("X-Auth-Token"); tok != "" && s.prof.Sessions {
		s.mu.Lock()
		defer s.mu.Unlock()
		for id, se := range s.sessions {
			if subtle.ConstantTimeCompare([]byte(se.token), []byte(tok)) == 1 {
				if time.Since(se.last) > sessionTimeout*time.Second {
					delete(s.sessions, id)
					break
				}
				se.last = time.Now()
				return id, nil
			}
		}
		return "", fail(http.StatusUnauthorized, "NoValidSession").withResolution("The X-Auth-Token is not a live session's (logged out or idle past SessionTimeout): create a session again.")
	}
	if u, pw, ok := r.BasicAuth(); ok && s.prof.BasicAuth {
		if s.credentialsOK(u, pw) {
			return "", nil
		}
		return "", fail(http.StatusUnauthorized, "NoValidSession").withResolution("Wrong user name or password.")
	}
	how := "an X-Auth-Token from POST /redfish/v1/SessionService/Sessions"
	switch {
	case s.prof.BasicAuth && s.prof.Sessions:
		how += ", or HTTP basic auth"
	case s.prof.BasicAuth:
		how = "HTTP basic auth (this service has no SessionService)"
	}
	return "", fail(http.StatusUnauthorized, "NoValidSession").withResolution("Authenticate with " + how + ".")
}

func (s *Server) credentialsOK(u, pw string) bool {
	return subtle.ConstantTimeCompare([]byte(u), []byte(s.user))&subtle.ConstantTimeCompare([]byte(pw), []byte(s.password)) == 1
}

// decode reads a JSON object body. DSP0266: a body that is not JSON is MalformedJSON (400).
func decode(r *http.Request) (map[string]any, *apiError) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, fail(http.StatusBadRequest, "UnrecognizedRequestBody")
	}
	var v map[string]any
	if len(strings.TrimSpace(string(b))) == 0 {
		return map[string]any{}, nil
	}
	if err := json.Unmarshal(b, &v); err != nil || v == nil {
		return nil, fail(http.StatusBadRequest, "MalformedJSON")
	}
	return v, nil
}

// decodePatch reads a PATCH body: a JSON object with at least one property (an empty one is
// EmptyJSON, DSP0266 § "Modification requests").
func decodePatch(r *http.Request) (map[string]any, *apiError) {
	body, err := decode(r)
	if err == nil && len(body) == 0 {
		err = fail(http.StatusBadRequest, "EmptyJSON")
	}
	return body, err
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// login creates a session (DSP0266 § "Session login"): 201 with X-Auth-Token and Location.
func (s *Server) login(w http.ResponseWriter, r *http.Request) *apiError {
	body, err := decode(r)
	if err != nil {
		return err
	}
	var errs []msg
	for _, k := range []string{"UserName", "Password"} {
		if v, ok := body[k]; !ok {
			errs = append(errs, msg{"PropertyMissing", []string{k}})
		} else if _, ok := v.(string); !ok {
			errs = append(errs, msg{"PropertyValueTypeError", []string{fmt.Sprint(v), k}})
		}
	}
	if errs != nil {
		return &apiError{status: http.StatusBadRequest, msgs: errs}
	}
	u, pw := body["UserName"].(string), body["Password"].(string)
	if !s.credentialsOK(u, pw) {
		return fail(http.StatusUnauthorized, "NoValidSession").withResolution("Wrong user name or password.")
	}
	s.mu.Lock()
	s.nextID++
	se := &session{id: strconv.Itoa(s.nextID), token: newToken(), user: u, last: time.Now()}
	s.sessions[se.id] = se
	s.mu.Unlock()
	loc := "/redfish/v1/SessionService/Sessions/" + se.id
	w.Header().Set("X-Auth-Token", se.token)
	w.Header().Set("Location", loc)
	writeJSON(w, http.StatusCreated, sessionResource(se), "")
	return nil
}

func sessionResource(se *session) map[string]any {
	return map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions/" + se.id, "@odata.type": "#Session.v1_3_0.Session",
		"Id": se.id, "Name": "User Session " + se.id, "UserName": se.user}
}

func (s *Server) sessionService(w http.ResponseWriter, r *http.Request, p, who string) *apiError {
	const base = "/redfish/v1/SessionService"
	switch {
	case p == base:
		res := clone(s.t.res[base])
		res["SessionTimeout"] = sessionTimeout
		return s.readOnly(w, r, res, "")
	case p == base+"/Sessions":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return methodNotAllowed(w, "GET, HEAD, POST")
		}
		s.mu.Lock()
		var ids []string
		for id := range s.sessions {
			ids = append(ids, p+"/"+id)
		}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, collection(p, "#SessionCollection.SessionCollection", "Session Collection", ids), "")
		return nil
	case strings.HasPrefix(p, base+"/Sessions/"):
		id := strings.TrimPrefix(p, base+"/Sessions/")
		s.mu.Lock()
		se := s.sessions[id]
		s.mu.Unlock()
		if se == nil {
			return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			writeJSON(w, http.StatusOK, sessionResource(se), "")
		case http.MethodDelete:
			s.mu.Lock()
			delete(s.sessions, id)
			s.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		default:
			return methodNotAllowed(w, "GET, HEAD, DELETE")
		}
		return nil
	}
	return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
}

func collection(p, typ, name string, members []string) map[string]any {
	sort.Strings(members)
	ms := []any{}
	for _, m := range members {
		ms = append(ms, map[string]any{"@odata.id": m})
	}
	return map[string]any{"@odata.id": p, "@odata.type": typ, "Name": name, "Members": ms, "Members@odata.count": len(ms)}
}

// etagMatches compares an If-Match header with the current ETag, accepting the weak form and the
// value with or without quotes (some clients strip them).
func etagMatches(ifMatch, etag string) bool {
	if ifMatch == "" || ifMatch == "*" {
		return true
	}
	norm := func(v string) string { return strings.Trim(strings.TrimPrefix(strings.TrimSpace(v), "W/"), `"`) }
	for _, v := range strings.Split(ifMatch, ",") {
		if norm(v) == norm(etag) {
			return true
		}
	}
	return false
}

func preconditionFailed() *apiError {
	return fail(http.StatusPreconditionFailed, "GeneralError").withResolution("The If-Match ETag is not the resource's current one: read the resource again and retry with its ETag.")
}
