package haproxy

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ServerStat is one server's line of HAProxy's statistics (the management guide's "CSV format":
// pxname, svname, status, stot).
type ServerStat struct {
	Backend, Server string
	// Status is "UP", "DOWN", "MAINT", "no check", or a transition such as "UP 1/2".
	Status string
	// Sessions is the total number of connections the server was given (stot).
	Sessions int64
}

// ParseStats reads the servers' lines (not FRONTEND/BACKEND) of the CSV statistics page
// (http://127.0.0.1:StatsPort/stats;csv). Errors: not HAProxy's CSV (no "# pxname" header with
// svname, status and stot columns), a malformed line.
func ParseStats(b []byte) ([]ServerStat, error) {
	b = bytes.TrimPrefix(bytes.TrimSpace(b), []byte("# "))
	r := csv.NewReader(bytes.NewReader(b))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("haproxy statistics: %w", err)
	}
	if len(recs) == 0 || len(recs[0]) == 0 || recs[0][0] != "pxname" {
		return nil, fmt.Errorf("haproxy statistics: no pxname header: not HAProxy's CSV")
	}
	col := func(name string) int { return slices.Index(recs[0], name) }
	sv, st, stot := col("svname"), col("status"), col("stot")
	if sv < 0 || st < 0 || stot < 0 {
		return nil, fmt.Errorf("haproxy statistics: header lacks svname, status or stot")
	}
	var out []ServerStat
	for i, rec := range recs[1:] {
		if len(rec) <= max(sv, st, stot) {
			return nil, fmt.Errorf("haproxy statistics line %d: %d fields", i+2, len(rec))
		}
		if rec[sv] == "FRONTEND" || rec[sv] == "BACKEND" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(rec[stot]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("haproxy statistics line %d: stot %q: %w", i+2, rec[stot], err)
		}
		out = append(out, ServerStat{Backend: rec[0], Server: rec[sv], Status: rec[st], Sessions: n})
	}
	return out, nil
}
