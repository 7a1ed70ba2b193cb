package redfishbmc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// insertParams are InsertMedia's parameters (DSP2046 VirtualMedia v1.6 InsertMedia).
var insertParams = []string{"Image", "Inserted", "WriteProtected", "MediaType", "TransferMethod", "TransferProtocolType", "UserName", "Password"}

// fetchTimeout bounds one image fetch (the node ISO is a few hundred MB, on a lab segment).
const fetchTimeout = 10 * time.Minute

// slotFor finds the slot p is (rest "") or is under (rest "/Actions/…", "/Certificates…").
func (s *Server) slotFor(p string) (*slot, string) {
	for sp, sl := range s.slots {
		if p == sp || strings.HasPrefix(p, sp+"/") {
			return sl, strings.TrimPrefix(p, sp)
		}
	}
	return nil, ""
}

func (s *Server) vmediaCollection(w http.ResponseWriter, r *http.Request, p string) *apiError {
	under := "System"
	if strings.HasPrefix(p, s.mgrPath) {
		under = "Manager"
	}
	if !slices.Contains(s.prof.VirtualMediaUnder, under) {
		return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
	}
	var ids []string
	for sp := range s.slots {
		if strings.HasPrefix(sp, p+"/") {
			ids = append(ids, sp)
		}
	}
	return s.readOnly(w, r, collection(p, "#VirtualMediaCollection.VirtualMediaCollection", "Virtual Media Services", ids), "")
}

// slotResourceLocked is the mockup's slot with its live state. Called with s.mu held.
func (s *Server) slotResourceLocked(sl *slot) (map[string]any, string) {
	res := clone(sl.static)
	res["@odata.id"] = sl.path
	res["Image"] = sl.image
	res["ImageName"] = ""
	if sl.image != "" {
		if u, err := url.Parse(sl.image); err == nil {
			res["ImageName"] = path.Base(u.Path)
		}
	}
	res["Inserted"] = sl.inserted
	res["WriteProtected"] = sl.writeProt
	res["ConnectedVia"] = "NotConnected"
	if sl.inserted {
		res["ConnectedVia"] = "URI"
	}
	res["TransferMethod"] = sl.transfer
	res["TransferProtocolType"] = sl.protocol
	if sl.transfer == "" {
		delete(res, "TransferMethod")
	}
	if sl.protocol == "" {
		delete(res, "TransferProtocolType")
	}
	res["VerifyCertificate"] = sl.verify
	res["Certificates"] = map[string]any{"@odata.id": sl.path + "/Certificates"}
	insert := map[string]any{"target": sl.path + "/Actions/VirtualMedia.InsertMedia",
		"TransferMethod@Redfish.AllowableValues":       []string{"Stream", "Upload"},
		"TransferProtocolType@Redfish.AllowableValues": []string{"HTTP", "HTTPS"}}
	res["Actions"] = map[string]any{
		"#VirtualMedia.InsertMedia": insert,
		"#VirtualMedia.EjectMedia":  map[string]any{"target": sl.path + "/Actions/VirtualMedia.EjectMedia"},
	}
	return res, `"vm-` + strconv.Itoa(sl.etag) + `"`
}

func (s *Server) vmedia(w http.ResponseWriter, r *http.Request, sl *slot, rest string) *apiError {
	switch {
	case rest == "":
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.mu.Lock()
			res, etag := s.slotResourceLocked(sl)
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, res, etag)
			return nil
		case http.MethodPatch:
			return s.patchSlot(w, r, sl)
		}
		return methodNotAllowed(w, "GET, HEAD, PATCH")
	case rest == "/Actions/VirtualMedia.InsertMedia":
		if r.Method != http.MethodPost {
			return methodNotAllowed(w, "POST")
		}
		return s.insert(w, r, sl)
	case rest == "/Actions/VirtualMedia.EjectMedia":
		if r.Method != http.MethodPost {
			return methodNotAllowed(w, "POST")
		}
		return s.eject(w, r, sl)
	case rest == "/Certificates" || strings.HasPrefix(rest, "/Certificates/"):
		return s.certificates(w, r, sl, strings.TrimPrefix(strings.TrimPrefix(rest, "/Certificates"), "/"))
	}
	return fail(http.StatusNotFound, "ResourceMissingAtURI", r.URL.Path)
}

// patchSlot sets VerifyCertificate (VirtualMedia v1.4.0); every other property is refused.
func (s *Server) patchSlot(w http.ResponseWriter, r *http.Request, sl *slot) *apiError {
	body, aerr := decodePatch(r)
	if aerr != nil {
		return aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	res, etag := s.slotResourceLocked(sl)
	if !etagMatches(r.Header.Get("If-Match"), etag) {
		return preconditionFailed()
	}
	var errs []msg
	verify := sl.verify
	for k, v := range body {
		switch {
		case k == "VerifyCertificate":
			b, ok := v.(bool)
			if !ok {
				errs = append(errs, msg{"PropertyValueTypeError", []string{fmt.Sprint(v), k}})
			}
			verify = b
		case res[k] != nil:
			errs = append(errs, msg{"PropertyNotWritable", []string{k}})
		default:
			errs = append(errs, msg{"PropertyUnknown", []string{k}})
		}
	}
	if errs != nil {
		return &apiError{status: http.StatusBadRequest, msgs: errs}
	}
	if verify != sl.verify {
		sl.verify = verify
		sl.etag++
	}
	res, etag = s.slotResourceLocked(sl)
	writeJSON(w, http.StatusOK, res, etag)
	return nil
}

// insertRequest is a checked InsertMedia.
type insertRequest struct {
	image          *url.URL
	inserted       bool
	writeProtected bool
	transfer       string
	protocol       string
	user, password string
}

// checkInsert validates InsertMedia's parameters (DSP2046 VirtualMedia.InsertMedia): Image is
// required, an http or https URL; TransferMethod Upload (the BMC fetches the whole image before the
// host sees it; the default) or Stream (the host reads it through the BMC on demand: stream.go);
// TransferProtocolType HTTP or HTTPS, matching the URL. A value outside the offered ones is
// PropertyValueNotInList (value, parameter), as for ComputerSystem.Reset's ResetType (see reset):
// the Base registry's ActionParameterNotSupported names an unsupported parameter, not a value.
func (s *Server) checkInsert(body map[string]any, sl *slot) (insertRequest, *apiError) {
	const action = "VirtualMedia.InsertMedia"
	q := insertRequest{inserted: true, writeProtected: true}
	var errs []msg
	accepted := insertParams
	if s.prof.InsertParams != nil {
		accepted = s.prof.InsertParams
	}
	str := func(k string) (string, bool) {
		v, ok := body[k]
		if !ok {
			return "", false
		}
		out, isStr := v.(string)
		if !isStr {
			errs = append(errs, msg{"ActionParameterValueTypeError", []string{fmt.Sprint(v), k, action}})
		}
		return out, isStr
	}
	boolean := func(k string, dst *bool) {
		if v, ok := body[k]; ok {
			b, isBool := v.(bool)
			if !isBool {
				errs = append(errs, msg{"ActionParameterValueTypeError", []string{fmt.Sprint(v), k, action}})
			}
			*dst = b
		}
	}
	for k := range body {
		if !slices.Contains(accepted, k) {
			errs = append(errs, msg{"ActionParameterUnknown", []string{action, k}})
		}
	}
	if img, ok := str("Image"); !ok {
		if _, present := body["Image"]; !present {
			errs = append(errs, msg{"ActionParameterMissing", []string{action, "Image"}})
		}
	} else if u, err := url.Parse(img); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, msg{"ActionParameterValueFormatError", []string{img, "Image", action}})
	} else {
		q.image = u
	}
	boolean("Inserted", &q.inserted)
	boolean("WriteProtected", &q.writeProtected)
	if mt, ok := str("MediaType"); ok && !slices.Contains(sl.mediaTypes, mt) {
		errs = append(errs, msg{"PropertyValueNotInList", []string{mt, "MediaType"}})
	}
	if tm, ok := str("TransferMethod"); ok {
		if tm != "Upload" && tm != "Stream" {
			errs = append(errs, msg{"PropertyValueNotInList", []string{tm, "TransferMethod"}})
		}
		q.transfer = tm
	}
	if tp, ok := str("TransferProtocolType"); ok {
		switch {
		case tp != "HTTP" && tp != "HTTPS":
			errs = append(errs, msg{"PropertyValueNotInList", []string{tp, "TransferProtocolType"}})
		case q.image != nil && !strings.EqualFold(tp, q.image.Scheme):
			errs = append(errs, msg{"ActionParameterValueFormatError", []string{tp, "TransferProtocolType", action}})
		}
		q.protocol = tp
	}
	q.user, _ = str("UserName")
	q.password, _ = str("Password")
	if errs != nil {
		return q, &apiError{status: http.StatusBadRequest, msgs: errs}
	}
	if q.transfer == "" {
		q.transfer = "Upload"
	}
	if q.protocol == "" {
		q.protocol = strings.ToUpper(q.image.Scheme)
	}
	return q, nil
}

// insert carries out InsertMedia: the image is fetched and attached before the answer (204), or, with
// an AsyncInsert profile, in a Task whose monitor the 202 names. A slot already holding media, or
// busy with another insert, answers 409: eject first (DSP2046 leaves it to the service; iDRAC and
// iLO refuse the same way).
func (s *Server) insert(w http.ResponseWriter, r *http.Request, sl *slot) *apiError {
	body, aerr := decode(r)
	if aerr != nil {
		return aerr
	}
	q, aerr := s.checkInsert(body, sl)
	if aerr != nil {
		return aerr
	}
	s.mu.Lock()
	if sl.inserted || sl.busy {
		s.mu.Unlock()
		return fail(http.StatusConflict, "ResourceInUse").withResolution("The slot holds media (or is being filled): eject it first with VirtualMedia.EjectMedia.")
	}
	sl.busy = true
	var verify bool
	pool := x509.NewCertPool()
	var certsPEM []string
	for _, c := range sl.certs {
		pool.AppendCertsFromPEM([]byte(c.pem))
		certsPEM = append(certsPEM, c.pem)
	}
	verify = sl.verify
	s.mu.Unlock()

	run := func() *apiError {
		defer func() { s.mu.Lock(); sl.busy = false; s.mu.Unlock() }()
		file, media := "", ""
		var st *stream
		if q.inserted {
			var err *apiError
			if file, err = s.fetch(q, sl, verify, pool); err != nil {
				return err
			}
			media = file
			if q.transfer == "Stream" {
				var serr error
				if st, serr = startStream(s.stateDir, q.image.String(), q.user, q.password, verify, certsPEM); serr != nil {
					s.log.Error("stream the image", "error", serr)
					return fail(http.StatusInternalServerError, "InternalError").withResolution("The BMC could not stream the image: " + serr.Error())
				}
				media = st.URI
			}
			if err := s.m.SetMedia(media); err != nil {
				if file != "" {
					_ = os.Remove(file)
				}
				st.stop()
				s.log.Error("attach the CD", "error", err)
				return fail(http.StatusInternalServerError, "InternalError").withResolution("The host did not take the image: " + err.Error())
			}
		}
		s.mu.Lock()
		sl.image, sl.inserted, sl.writeProt, sl.transfer, sl.protocol, sl.file, sl.stream = q.image.String(), q.inserted, q.writeProtected, q.transfer, q.protocol, file, st
		sl.etag++
		s.mu.Unlock()
		return nil
	}
	if s.prof.AsyncInsert {
		s.startTask(w, "Insert "+q.image.Redacted()+" into "+sl.path, run)
		return nil
	}
	if err := run(); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fetch downloads q.image into the BMC's state directory (TransferMethod Upload), verifying an https
// server against pool when verify is on (an empty pool trusts nothing) and not at all when it is
// off, as BMCs do. For TransferMethod Stream it fetches the first byte only (a range request, which
// streaming needs: a server that answers it whole is SourceDoesNotSupportProtocol) and returns "".
// Failures are the client's to fix (400): an untrusted certificate is ResourceAtUriUnauthorized, an
// unreachable server CouldNotEstablishConnection, a non-2xx answer AccessDenied or
// ResourceMissingAtURI.
func (s *Server) fetch(q insertRequest, sl *slot, verify bool, pool *x509.CertPool) (string, *apiError) {
	img := q.image.String()
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if !verify {
		tlsConf = &tls.Config{InsecureSkipVerify: true} // #nosec G402 -- VerifyCertificate false: the BMC trusts any server, as real ones do
	}
	tr := &http.Transport{TLSClientConfig: tlsConf, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, img, nil)
	if err != nil {
		return "", fail(http.StatusBadRequest, "ActionParameterValueFormatError", img, "Image", "VirtualMedia.InsertMedia")
	}
	if q.user != "" {
		req.SetBasicAuth(q.user, q.password)
	}
	if q.transfer == "Stream" {
		req.Header.Set("Range", "bytes=0-0")
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		var uerr *tls.CertificateVerificationError
		var unk x509.UnknownAuthorityError
		var host x509.HostnameError
		if errors.As(err, &uerr) || errors.As(err, &unk) || errors.As(err, &host) {
			how := "add the CA that signed it to the slot's Certificates"
			if len(sl.certs) == 0 {
				how = "the slot's Certificates are empty: POST the image server's CA there"
			}
			return "", fail(http.StatusBadRequest, "ResourceAtUriUnauthorized", img, err.Error()).withResolution("VerifyCertificate is on and the image server's certificate does not verify: " + how + ", or turn VerifyCertificate off.")
		}
		return "", fail(http.StatusBadRequest, "CouldNotEstablishConnection", img).withResolution("The BMC could not fetch the image (" + err.Error() + "): check that the BMC's network reaches the server.")
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return "", fail(http.StatusBadRequest, "ResourceMissingAtURI", img)
	case resp.StatusCode/100 != 2:
		return "", fail(http.StatusBadRequest, "AccessDenied", img).withResolution("The image server answered " + resp.Status + ".")
	case q.transfer == "Stream" && resp.StatusCode != http.StatusPartialContent:
		return "", fail(http.StatusBadRequest, "SourceDoesNotSupportProtocol", img, "HTTP range requests").withResolution("TransferMethod Stream reads the image in ranges and the server answered a range request " + resp.Status + ": serve the image with range support, or use TransferMethod Upload.")
	case q.transfer == "Stream":
		s.log.Info("image streamable", "image", q.image.Redacted(), "verified", verify)
		return "", nil
	}
	f, err := os.CreateTemp(s.stateDir, "media-*.part")
	if err != nil {
		return "", fail(http.StatusInternalServerError, "InternalError")
	}
	n, err := io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fail(http.StatusBadRequest, "CouldNotEstablishConnection", img).withResolution("The image transfer broke off after " + strconv.FormatInt(n, 10) + " bytes: " + err.Error())
	}
	final := strings.TrimSuffix(f.Name(), ".part") + ".iso"
	if err := os.Rename(f.Name(), final); err != nil {
		_ = os.Remove(f.Name())
		return "", fail(http.StatusInternalServerError, "InternalError")
	}
	s.log.Info("image fetched", "image", q.image.Redacted(), "bytes", n, "took", time.Since(start).Round(time.Millisecond), "verified", verify)
	return final, nil
}

// eject takes the media out (EjectMedia, no parameters): 204, also when the slot is empty.
func (s *Server) eject(w http.ResponseWriter, r *http.Request, sl *slot) *apiError {
	body, aerr := decode(r)
	if aerr != nil {
		return aerr
	}
	for k := range body {
		return fail(http.StatusBadRequest, "ActionParameterUnknown", "VirtualMedia.EjectMedia", k)
	}
	s.mu.Lock()
	if sl.busy {
		s.mu.Unlock()
		return fail(http.StatusConflict, "ResourceInUse").withResolution("An insert into this slot is running: wait for its task.")
	}
	file, wasInserted, st := sl.file, sl.inserted, sl.stream
	s.mu.Unlock()
	if wasInserted {
		if err := s.m.SetMedia(""); err != nil {
			s.log.Error("detach the CD", "error", err)
			return fail(http.StatusInternalServerError, "InternalError").withResolution("The host did not release the image: " + err.Error())
		}
	}
	s.mu.Lock()
	sl.image, sl.inserted, sl.file, sl.transfer, sl.protocol, sl.stream = "", false, "", "", "", nil
	sl.etag++
	s.mu.Unlock()
	if file != "" {
		_ = os.Remove(file)
	}
	st.stop()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// certificates serves the slot's CertificateCollection (VirtualMedia v1.4.0): GET, POST of a PEM
// certificate (201 with Location), and GET/DELETE of a member.
func (s *Server) certificates(w http.ResponseWriter, r *http.Request, sl *slot, id string) *apiError {
	base := sl.path + "/Certificates"
	if id == "" {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.mu.Lock()
			var ids []string
			for _, c := range sl.certs {
				ids = append(ids, base+"/"+c.id)
			}
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, collection(base, "#CertificateCollection.CertificateCollection", "Certificates", ids), "")
			return nil
		case http.MethodPost:
			return s.addCertificate(w, r, sl, base)
		}
		return methodNotAllowed(w, "GET, HEAD, POST")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(sl.certs, func(c cert) bool { return c.id == id })
	if i < 0 {
		return fail(http.StatusNotFound, "ResourceMissingAtURI", base+"/"+id)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeJSON(w, http.StatusOK, certResource(base, sl.certs[i]), "")
	case http.MethodDelete:
		sl.certs = slices.Delete(sl.certs, i, i+1)
		sl.etag++
		w.WriteHeader(http.StatusNoContent)
	default:
		return methodNotAllowed(w, "GET, HEAD, DELETE")
	}
	return nil
}

func (s *Server) addCertificate(w http.ResponseWriter, r *http.Request, sl *slot, base string) *apiError {
	body, aerr := decode(r)
	if aerr != nil {
		return aerr
	}
	var errs []msg
	for k := range body {
		if k != "CertificateString" && k != "CertificateType" {
			errs = append(errs, msg{"PropertyUnknown", []string{k}})
		}
	}
	pemText, ok := body["CertificateString"].(string)
	if !ok {
		errs = append(errs, msg{"PropertyMissing", []string{"CertificateString"}})
	}
	typ, ok := body["CertificateType"].(string)
	if !ok {
		errs = append(errs, msg{"PropertyMissing", []string{"CertificateType"}})
	} else if typ != "PEM" && typ != "PEMchain" {
		errs = append(errs, msg{"PropertyValueNotInList", []string{typ, "CertificateType"}})
	}
	if pemText != "" {
		if blk, _ := pem.Decode([]byte(pemText)); blk == nil || blk.Type != "CERTIFICATE" {
			errs = append(errs, msg{"PropertyValueFormatError", []string{"(not a PEM certificate)", "CertificateString"}})
		} else if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			errs = append(errs, msg{"PropertyValueFormatError", []string{"(" + err.Error() + ")", "CertificateString"}})
		}
	}
	if errs != nil {
		return &apiError{status: http.StatusBadRequest, msgs: errs}
	}
	s.mu.Lock()
	sl.nextCert++
	c := cert{id: strconv.Itoa(sl.nextCert), pem: pemText}
	sl.certs = append(sl.certs, c)
	sl.etag++
	s.mu.Unlock()
	w.Header().Set("Location", base+"/"+c.id)
	writeJSON(w, http.StatusCreated, certResource(base, c), "")
	return nil
}

func certResource(base string, c cert) map[string]any {
	res := map[string]any{"@odata.id": base + "/" + c.id, "@odata.type": "#Certificate.v1_5_0.Certificate",
		"Id": c.id, "Name": "Certificate " + c.id, "CertificateString": c.pem, "CertificateType": "PEM"}
	if blk, _ := pem.Decode([]byte(c.pem)); blk != nil {
		if x, err := x509.ParseCertificate(blk.Bytes); err == nil {
			res["Subject"] = map[string]any{"CommonName": x.Subject.CommonName}
			res["Issuer"] = map[string]any{"CommonName": x.Issuer.CommonName}
			res["ValidNotBefore"] = x.NotBefore.UTC().Format(time.RFC3339)
			res["ValidNotAfter"] = x.NotAfter.UTC().Format(time.RFC3339)
		}
	}
	return res
}

// certLocationsPath is the CertificateService's CertificateLocations resource.
const certLocationsPath = "/redfish/v1/CertificateService/CertificateLocations"

// certificateLocations is the mockup's CertificateLocations with its links to virtual media
// certificates replaced by the slots' live ones. The mockup links a certificate in its CD1 slot,
// which the live slot (empty at start) does not hold, so the link answered 404 (ilorest's crawler
// followed it). DSP2046 CertificateLocations.Links.Certificates: the Certificate resources installed
// on this service.
func (s *Server) certificateLocations() map[string]any {
	res := clone(s.t.res[certLocationsPath])
	links, _ := res["Links"].(map[string]any)
	if links == nil {
		links = map[string]any{}
		res["Links"] = links
	}
	out := []any{}
	for _, l := range asSlice(links["Certificates"]) {
		if id, _ := l.(map[string]any)["@odata.id"].(string); !strings.Contains(id, "/VirtualMedia/") {
			out = append(out, l)
		}
	}
	s.mu.Lock()
	var live []string
	for _, sl := range s.slots {
		for _, c := range sl.certs {
			live = append(live, sl.path+"/Certificates/"+c.id)
		}
	}
	s.mu.Unlock()
	slices.Sort(live)
	for _, id := range live {
		out = append(out, map[string]any{"@odata.id": id})
	}
	links["Certificates"] = out
	return res
}
