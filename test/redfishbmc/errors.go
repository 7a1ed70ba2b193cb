package redfishbmc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// apiError is one failed request: the HTTP status and the messages of the Base registry (ids without
// the registry prefix, e.g. "PropertyUnknown") with their arguments. It is written as DSP0266's error
// response (§ "Error responses"): {"error": {"code", "message", "@Message.ExtendedInfo": [Message…]}}.
type apiError struct {
	status int
	msgs   []msg
	// resolution replaces the registry's Resolution of the first message when set: what the client
	// must change, in this request's terms.
	resolution string
}

type msg struct {
	id   string
	args []string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%d %s%v", e.status, e.msgs[0].id, e.msgs[0].args)
}

// fail is an apiError with one message.
func fail(status int, id string, args ...string) *apiError {
	return &apiError{status: status, msgs: []msg{{id, args}}}
}

// withResolution sets the resolution of e's first message.
func (e *apiError) withResolution(r string) *apiError { e.resolution = r; return e }

// writeError writes e with the messages' texts from the tree's Base registry (%1… replaced by the
// arguments). A message id the registry lacks is a bug of the emulator's and is written as
// GeneralError with the id in its resolution, never as a 5xx.
func (t *tree) writeError(w http.ResponseWriter, e *apiError) {
	var infos []map[string]any
	for i, m := range e.msgs {
		rm, ok := t.messages[m.id]
		id := m.id
		if !ok {
			rm, id = t.messages["GeneralError"], "GeneralError"
			rm.Resolution = "The emulator has no registry message " + m.id + "; " + rm.Resolution
		}
		text := rm.Message
		for j := len(m.args); j > 0; j-- {
			text = strings.ReplaceAll(text, fmt.Sprintf("%%%d", j), m.args[j-1])
		}
		res := rm.Resolution
		if i == 0 && e.resolution != "" {
			res = e.resolution
		}
		args := m.args
		if args == nil {
			args = []string{}
		}
		infos = append(infos, map[string]any{
			"@odata.type":     "#Message.v1_1_1.Message",
			"MessageId":       t.registry + "." + id,
			"Message":         text,
			"MessageArgs":     args,
			"Severity":        rm.Severity,
			"MessageSeverity": rm.Severity,
			"Resolution":      res,
		})
	}
	body := map[string]any{"error": map[string]any{
		"code":                  infos[0]["MessageId"],
		"message":               infos[0]["Message"],
		"@Message.ExtendedInfo": infos,
	}}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(body)
}
