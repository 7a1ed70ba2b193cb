package applianced

import "testing"

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
