package applianced

import (
	"bytes"
	"strings"
	"testing"
)

func TestSystemdQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/usr/bin/appliance": "/usr/bin/appliance",
		"/a b/c":             `"/a b/c"`,
		`x"y`:                `"x\"y"`,
		"$HOME":              `"$$HOME"`,
		"100%":               `"100%%"`,
		"":                   `""`,
	} {
		if got := systemdQuote(in); got != want {
			t.Errorf("systemdQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestUnitKillModeProcess: appliance.service must let keepalived (started detached by serve for the
// API VIP) outlive a crash or restart of serve; systemd's default KillMode=control-group would kill it.
func TestUnitKillModeProcess(t *testing.T) {
	var buf bytes.Buffer
	if err := unitTemplate.Execute(&buf, map[string]string{"Exec": "/usr/bin/appliance serve"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "\nKillMode=process\n") {
		t.Errorf("unit lacks KillMode=process:\n%s", buf.String())
	}
}
