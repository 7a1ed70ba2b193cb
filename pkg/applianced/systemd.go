package applianced

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/util"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// ServeUnit is the systemd unit that runs `appliance serve` on a host booted with systemd.
const ServeUnit = "appliance.service"

// unitDir is where the serve phase installs ServeUnit (a variable for tests).
var unitDir = "/etc/systemd/system"

// systemdBooted reports whether systemd is PID 1 (sd_booted: /run/systemd/system exists).
func systemdBooted() bool { return util.IsRunningSystemd() }

var unitTemplate = template.Must(template.New("unit").Parse(`# Written by appliance bootstrap; rewritten when the configuration changes.
[Unit]
Description=Bootstrap appliance HTTPS front (OCI registry mirror, package repo, Ignition)
Documentation=https://github.com/airgap-appliance/appliance
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
ExecStart={{.Exec}}
Environment=OTEL_TRACES_EXPORTER=none
Restart=on-failure
RestartSec=2s
# serve starts keepalived for the API VIP detached; it must outlive a crash or restart of serve (the
# next serve adopts it), so only serve itself is signalled. appliance stop ends keepalived.
KillMode=process
NoNewPrivileges=yes
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
`))

// systemdQuote quotes one ExecStart argument (systemd.syntax(7): double quotes, backslash escapes).
func systemdQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"'\\$%;") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `$$`, `%`, `%%`)
	return `"` + r.Replace(s) + `"`
}

// startUnit installs ServeUnit running argv and makes it active with that exact content: a changed
// unit is reloaded and restarted, an unchanged inactive one started, an unchanged active one left
// alone. It returns the service's MainPID and whether anything changed.
func startUnit(ctx context.Context, argv []string) (int, bool, error) {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = systemdQuote(a)
	}
	var buf bytes.Buffer
	if err := unitTemplate.Execute(&buf, map[string]string{"Exec": strings.Join(q, " ")}); err != nil {
		return 0, false, err
	}
	path := unitDir + "/" + ServeUnit
	changed, err := atomicfile.Write(path, buf.Bytes(), 0o644)
	if err != nil {
		return 0, false, err
	}
	conn, err := dbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	if changed {
		if err := conn.ReloadContext(ctx); err != nil {
			return 0, false, fmt.Errorf("systemctl daemon-reload: %w", err)
		}
		if _, _, err := conn.EnableUnitFilesContext(ctx, []string{path}, false, true); err != nil {
			return 0, false, fmt.Errorf("enable %s: %w", ServeUnit, err)
		}
	}
	active, err := conn.GetUnitPropertyContext(ctx, ServeUnit, "ActiveState")
	if err != nil {
		return 0, false, fmt.Errorf("%s state: %w", ServeUnit, err)
	}
	isActive := strings.Trim(active.Value.String(), `"`) == "active"
	if changed || !isActive {
		// A buffered channel: an unread job channel deadlocks the D-Bus connection (LAB.md).
		done := make(chan string, 1)
		if _, err := conn.RestartUnitContext(ctx, ServeUnit, "replace", done); err != nil {
			return 0, false, fmt.Errorf("restart %s: %w", ServeUnit, err)
		}
		select {
		case res := <-done:
			if res != "done" {
				return 0, false, fmt.Errorf("restart %s: job %s (journalctl -u %s)", ServeUnit, res, ServeUnit)
			}
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(healthWait):
			return 0, false, fmt.Errorf("restart %s: no answer from systemd in %v", ServeUnit, healthWait)
		}
		changed = true
	}
	p, err := conn.GetServicePropertyContext(ctx, ServeUnit, "MainPID")
	if err != nil {
		return 0, changed, err
	}
	pid, _ := strconv.Atoi(strings.Trim(p.Value.String(), `"`))
	if pid == 0 {
		if v, ok := p.Value.Value().(uint32); ok {
			pid = int(v)
		}
	}
	return pid, changed, nil
}

// stopUnit stops ServeUnit (used by `appliance stop` on systemd hosts).
func stopUnit(ctx context.Context) (bool, error) {
	if _, err := os.Stat(unitDir + "/" + ServeUnit); err != nil {
		return false, nil
	}
	conn, err := dbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return false, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	if _, err := conn.StopUnitContext(ctx, ServeUnit, "replace", done); err != nil {
		return false, err
	}
	select {
	case <-done:
	case <-time.After(stopWait + 5*time.Second):
		return false, fmt.Errorf("stop %s: no answer from systemd", ServeUnit)
	}
	return true, nil
}
