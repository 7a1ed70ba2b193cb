package bootstrap

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// nodeBoard shows one line per node while the converge phase waits: the node's state and the step
// its hostagent reported last (packages, "kubeadm running: waiting for cp1 to finish kubeadm", …),
// the same steps the e2e timeline prints. On a terminal the lines are redrawn in place (ANSI cursor
// up + erase line, at most once per call of flush); otherwise each change is printed as a plain line.
type nodeBoard struct {
	w       io.Writer
	tty     bool
	start   time.Time
	names   []string
	lines   map[string]string
	dirty   bool
	drawn   int
	printed map[string]string
}

// newNodeBoard returns a board for the nodes in order, writing to w (a terminal when w is an
// *os.File whose descriptor is one).
func newNodeBoard(w io.Writer, names []string) *nodeBoard {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &nodeBoard{w: w, tty: tty, start: time.Now(), names: names, lines: map[string]string{}, printed: map[string]string{}}
}

// set records node's line; a plain (non-terminal) board prints it when it changed.
func (b *nodeBoard) set(node, line string) {
	if b.lines[node] == line {
		return
	}
	b.lines[node] = line
	b.dirty = true
	if !b.tty && b.printed[node] != line {
		b.printed[node] = line
		fmt.Fprintf(b.w, "      %-12s %s  (+%.1fs)\n", node, line, time.Since(b.start).Seconds())
	}
}

// flush redraws a terminal board when a line changed.
func (b *nodeBoard) flush() {
	if !b.tty || !b.dirty {
		return
	}
	var sb strings.Builder
	if b.drawn > 0 {
		fmt.Fprintf(&sb, "\x1b[%dA", b.drawn)
	}
	for _, n := range b.names {
		fmt.Fprintf(&sb, "\x1b[2K      %-12s %s\n", n, b.lines[n])
	}
	fmt.Fprintf(&sb, "\x1b[2K      %.0fs\n", time.Since(b.start).Seconds())
	b.drawn = len(b.names) + 1
	b.dirty = false
	_, _ = io.WriteString(b.w, sb.String())
}

// nodeLine describes a node's record for the board: its state, then its newest step report.
func nodeLine(s agentapi.NodeStatus) string {
	var last agentapi.Report
	for _, r := range s.Steps {
		if r.Time.After(last.Time) {
			last = r
		}
	}
	line := s.State
	switch {
	case s.State == agentapi.StateFailed && s.Reason != "":
		line += ": " + s.Reason
	case last.Step != "" && s.State != agentapi.StateReady:
		line += " · " + last.Step + " " + last.Status
		if last.Detail != "" {
			line += ": " + last.Detail
		}
	}
	if len(line) > 110 {
		line = line[:107] + "..."
	}
	return line
}
