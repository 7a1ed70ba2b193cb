package redfishbmc

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
)

// systemResource is the mockup's ComputerSystem with the live PowerState, boot override, ResetTypes
// and VirtualMedia link. Called with s.mu held.
func (s *Server) systemResourceLocked() (map[string]any, string) {
	res := clone(s.t.res[s.sysPath])
	res["PowerState"] = s.m.PowerState()
	boot, _ := res["Boot"].(map[string]any)
	if boot == nil {
		boot = map[string]any{}
	}
	boot["BootSourceOverrideEnabled"] = s.boot.enabled
	boot["BootSourceOverrideTarget"] = s.boot.target
	boot["BootSourceOverrideMode"] = s.boot.mode
	if _, ok := boot["UefiTargetBootSourceOverride"]; ok || s.boot.uefiTarget != "" {
		boot["UefiTargetBootSourceOverride"] = s.boot.uefiTarget
	}
	boot["BootSourceOverrideEnabled@Redfish.AllowableValues"] = overrideEnabled
	boot["BootSourceOverrideMode@Redfish.AllowableValues"] = []string{"UEFI", "Legacy"}
	res["Boot"] = boot
	actions, _ := res["Actions"].(map[string]any)
	if actions == nil {
		actions = map[string]any{}
	}
	actions["#ComputerSystem.Reset"] = map[string]any{"target": s.sysPath + "/Actions/ComputerSystem.Reset",
		"ResetType@Redfish.AllowableValues": s.prof.ResetTypes}
	res["Actions"] = actions
	if !slices.Contains(s.prof.VirtualMediaUnder, "System") {
		delete(res, "VirtualMedia")
	}
	return res, `"sys-` + strconv.Itoa(s.sysETag) + `"`
}

func (s *Server) system(w http.ResponseWriter, r *http.Request) *apiError {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.mu.Lock()
		res, etag := s.systemResourceLocked()
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, res, etag)
		return nil
	case http.MethodPatch:
		return s.patchSystem(w, r)
	}
	return methodNotAllowed(w, "GET, HEAD, PATCH")
}

// patchSystem applies Boot.BootSourceOverrideEnabled/Target/Mode and UefiTargetBootSourceOverride
// (DSP2046 ComputerSystem.Boot; all four are read-write there). Everything else is refused: a
// property the resource has is PropertyNotWritable, one it lacks PropertyUnknown, a wrong value
// PropertyValueNotInList or PropertyValueTypeError, all in one 400 that changes nothing. A stale
// If-Match is 412.
func (s *Server) patchSystem(w http.ResponseWriter, r *http.Request) *apiError {
	body, aerr := decodePatch(r)
	if aerr != nil {
		return aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	res, etag := s.systemResourceLocked()
	if !etagMatches(r.Header.Get("If-Match"), etag) {
		return preconditionFailed()
	}
	next := s.boot
	var errs []msg
	for k, v := range body {
		if k == "Boot" {
			boot, ok := v.(map[string]any)
			if !ok {
				errs = append(errs, msg{"PropertyValueTypeError", []string{fmt.Sprint(v), "Boot"}})
				continue
			}
			allowedTargets := asSlice(res["Boot"].(map[string]any)["BootSourceOverrideTarget@Redfish.AllowableValues"])
			for bk, bv := range boot {
				str, isStr := bv.(string)
				var allowed []string
				var dst *string
				anyValue := false
				switch bk {
				case "UefiTargetBootSourceOverride":
					// Read-write in DSP2046, and sent back by clients that PATCH the Boot object they
					// read (bmclib's SetBootDevice): refusing it as PropertyNotWritable failed
					// bmclib's first PATCH and left it to its fallback.
					anyValue, dst = true, &next.uefiTarget
				case "BootSourceOverrideEnabled":
					allowed, dst = overrideEnabled, &next.enabled
				case "BootSourceOverrideTarget":
					for _, a := range allowedTargets {
						allowed = append(allowed, fmt.Sprint(a))
					}
					dst = &next.target
				case "BootSourceOverrideMode":
					allowed, dst = []string{"UEFI", "Legacy"}, &next.mode
				default:
					if _, known := res["Boot"].(map[string]any)[bk]; known {
						errs = append(errs, msg{"PropertyNotWritable", []string{"Boot/" + bk}})
					} else {
						errs = append(errs, msg{"PropertyUnknown", []string{"Boot/" + bk}})
					}
					continue
				}
				switch {
				case !isStr:
					errs = append(errs, msg{"PropertyValueTypeError", []string{fmt.Sprint(bv), "Boot/" + bk}})
				case !anyValue && !slices.Contains(allowed, str):
					errs = append(errs, msg{"PropertyValueNotInList", []string{str, "Boot/" + bk}})
				default:
					*dst = str
				}
			}
			continue
		}
		if _, known := res[k]; known {
			errs = append(errs, msg{"PropertyNotWritable", []string{k}})
		} else {
			errs = append(errs, msg{"PropertyUnknown", []string{k}})
		}
	}
	if errs != nil {
		return &apiError{status: http.StatusBadRequest, msgs: errs}
	}
	if next != s.boot {
		s.boot = next
		s.sysETag++
	}
	res, etag = s.systemResourceLocked()
	writeJSON(w, http.StatusOK, res, etag)
	return nil
}

// reset carries out ComputerSystem.Reset: 204 when done; 400 for a missing, unknown or unoffered
// ResetType or an unknown parameter; 409 when the power state refuses it (ForceRestart while off).
func (s *Server) reset(w http.ResponseWriter, r *http.Request) *apiError {
	const action = "ComputerSystem.Reset"
	if r.Method != http.MethodPost {
		return methodNotAllowed(w, "POST")
	}
	body, aerr := decode(r)
	if aerr != nil {
		return aerr
	}
	var errs []msg
	for k := range body {
		if k != "ResetType" {
			errs = append(errs, msg{"ActionParameterUnknown", []string{action, k}})
		}
	}
	v, ok := body["ResetType"]
	rt, isStr := v.(string)
	switch {
	case !ok:
		errs = append(errs, msg{"ActionParameterMissing", []string{action, "ResetType"}})
	case !isStr:
		errs = append(errs, msg{"ActionParameterValueTypeError", []string{fmt.Sprint(v), "ResetType", action}})
	case !slices.Contains(s.prof.ResetTypes, rt):
		// A ResetType outside ResetType@Redfish.AllowableValues is a value error, not an unsupported
		// parameter: the Base registry's ActionParameterNotSupported takes a parameter *name* ("The
		// parameter %1 for the action %2 is not supported"), so it told redfishtool's and sushy's users
		// that a parameter "Bogus" was sent. The mockup's Base 1.5.0 has no
		// ActionParameterValueNotInList (a later Base version's); PropertyValueNotInList is its message
		// for a value outside the acceptable list (DSP0266 § "Error responses": the message describes
		// the error).
		errs = append(errs, msg{"PropertyValueNotInList", []string{rt, "ResetType"}})
	}
	if errs != nil {
		e := &apiError{status: http.StatusBadRequest, msgs: errs}
		if ok && isStr && !slices.Contains(s.prof.ResetTypes, rt) {
			e.resolution = fmt.Sprintf("ResetType %s is not offered here: use one of ResetType@Redfish.AllowableValues %v.", rt, s.prof.ResetTypes)
		}
		return e
	}
	if err := s.m.Reset(rt); err != nil {
		if errors.Is(err, errResetRefused) {
			return fail(http.StatusConflict, "ResourceInUse").withResolution(fmt.Sprintf("ResetType %s is refused while the system is %s.", rt, s.m.PowerState()))
		}
		s.log.Error("reset failed", "resetType", rt, "error", err)
		return fail(http.StatusInternalServerError, "InternalError").withResolution("The host did not carry out " + rt + ": " + err.Error())
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
