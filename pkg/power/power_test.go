package power

import (
	"strings"
	"testing"
)

func TestParseState(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want State
	}{
		{"Chassis Power is on\n", StateOn},
		{"Chassis Power is off", StateOff},
		{"On", StateOn},
		{"Off", StateOff},
		{"off", StateOff},
		{" ON ", StateOn},
		{"PoweringOn", StateUnknown},
		{"PoweringOff", StateUnknown},
		{"Paused", StateUnknown},
		{"", StateUnknown},
		{"Chassis Power is unknown", StateUnknown},
	} {
		if got := ParseState(tc.in); got != tc.want {
			t.Errorf("ParseState(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseBootFlags(t *testing.T) {
	for _, tc := range []struct {
		out     string
		want    BootDevice
		wantErr bool
	}{
		{"Boot parameter version: 1\nBoot parameter 5 is valid/unlocked\nBoot parameter data: 0014000000\n", BootCDROM, false},
		{"Boot parameter data: 8004000000", BootPXE, false},
		{"Boot parameter data: c008000000", BootDisk, false},
		{"Boot parameter data: zz", "", true},
		{"Boot parameter data: 00", "", true},
		{"nothing here", "", true},
	} {
		got, err := parseBootFlags([]byte(tc.out))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseBootFlags(%q) = %q, %v; want %q, err=%t", tc.out, got, err, tc.want, tc.wantErr)
		}
	}
}

func FuzzParseState(f *testing.F) {
	for _, s := range []string{"Chassis Power is on", "Off", "PoweringOn", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		switch ParseState(s) {
		case StateOn, StateOff, StateUnknown:
		default:
			t.Fatalf("ParseState(%q) returned a value outside on/off/unknown", s)
		}
	})
}

func FuzzParseBootFlags(f *testing.F) {
	f.Add([]byte("Boot parameter data: 0014000000"))
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = parseBootFlags(b) })
}

func containsSecret(s string, secrets ...string) bool {
	for _, sec := range secrets {
		if sec != "" && strings.Contains(s, sec) {
			return true
		}
	}
	return false
}
