package redfishbmc

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// task is a long operation run in the background (DSP0266 § "Asynchronous operations"): the request
// is answered 202 Accepted with a task monitor in Location; the monitor answers 202 while the task
// runs and then the operation's own answer (204, or its error); the Task resource under
// TaskService/Tasks tells TaskState, TaskStatus and Messages.
type task struct {
	id, name   string
	state      string // TaskState: Running, Completed, Exception
	start, end time.Time
	err        *apiError
}

const (
	tasksPath    = "/redfish/v1/TaskService/Tasks"
	monitorsPath = "/redfish/v1/TaskService/TaskMonitors"
)

// startTask runs op as a task and answers 202 with its monitor.
func (s *Server) startTask(w http.ResponseWriter, name string, op func() *apiError) {
	s.mu.Lock()
	s.nextTask++
	tk := &task{id: strconv.Itoa(s.nextTask), name: name, state: "Running", start: time.Now()}
	s.tasks[tk.id] = tk
	res := s.taskResourceLocked(tk)
	s.mu.Unlock()
	go func() {
		err := op()
		s.mu.Lock()
		defer s.mu.Unlock()
		tk.end, tk.err = time.Now(), err
		tk.state = "Completed"
		if err != nil {
			tk.state = "Exception"
		}
	}()
	w.Header().Set("Location", monitorsPath+"/"+tk.id)
	writeJSON(w, http.StatusAccepted, res, "")
}

func (s *Server) taskResourceLocked(tk *task) map[string]any {
	res := map[string]any{"@odata.id": tasksPath + "/" + tk.id, "@odata.type": "#Task.v1_7_0.Task", "Id": tk.id, "Name": tk.name,
		"TaskState": tk.state, "StartTime": tk.start.UTC().Format(time.RFC3339), "TaskMonitor": monitorsPath + "/" + tk.id}
	switch tk.state {
	case "Running":
		res["TaskStatus"] = "OK"
		res["Messages"] = []any{}
	case "Completed":
		res["TaskStatus"], res["PercentComplete"] = "OK", 100
		res["EndTime"] = tk.end.UTC().Format(time.RFC3339)
		res["Messages"] = []any{map[string]any{"MessageId": s.t.registry + ".Success", "Message": s.t.messages["Success"].Message, "Severity": "OK", "MessageSeverity": "OK"}}
	case "Exception":
		res["TaskStatus"], res["PercentComplete"] = "Critical", 100
		res["EndTime"] = tk.end.UTC().Format(time.RFC3339)
		m := tk.err.msgs[0]
		text := s.t.messages[m.id].Message
		for j := len(m.args); j > 0; j-- {
			text = strings.ReplaceAll(text, "%"+strconv.Itoa(j), m.args[j-1])
		}
		res["Messages"] = []any{map[string]any{"MessageId": s.t.registry + "." + m.id, "Message": text, "MessageArgs": m.args,
			"Severity": "Critical", "MessageSeverity": "Critical", "Resolution": tk.err.resolution}}
	}
	return res
}

func (s *Server) taskService(w http.ResponseWriter, r *http.Request, p string) *apiError {
	switch {
	case p == tasksPath:
		s.mu.Lock()
		var ids []string
		for id := range s.tasks {
			ids = append(ids, tasksPath+"/"+id)
		}
		s.mu.Unlock()
		return s.readOnly(w, r, collection(p, "#TaskCollection.TaskCollection", "Task Collection", ids), "")
	case strings.HasPrefix(p, tasksPath+"/"):
		s.mu.Lock()
		tk := s.tasks[strings.TrimPrefix(p, tasksPath+"/")]
		var res map[string]any
		if tk != nil {
			res = s.taskResourceLocked(tk)
		}
		s.mu.Unlock()
		if tk == nil {
			return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
		}
		return s.readOnly(w, r, res, "")
	case strings.HasPrefix(p, monitorsPath+"/"):
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return methodNotAllowed(w, "GET, HEAD")
		}
		s.mu.Lock()
		tk := s.tasks[strings.TrimPrefix(p, monitorsPath+"/")]
		var res map[string]any
		var state string
		var err *apiError
		if tk != nil {
			res, state, err = s.taskResourceLocked(tk), tk.state, tk.err
		}
		s.mu.Unlock()
		switch {
		case tk == nil:
			return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
		case state == "Running":
			w.Header().Set("Location", p)
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusAccepted, res, "")
		case err != nil:
			return err
		default:
			w.WriteHeader(http.StatusNoContent)
		}
		return nil
	}
	if res := s.t.res[p]; res != nil {
		return s.readOnly(w, r, res, "")
	}
	return fail(http.StatusNotFound, "ResourceMissingAtURI", p)
}
