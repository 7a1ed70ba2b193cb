package bundlespec

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want Size
		err  string // "" for success
	}{
		{"0", 0, ""},
		{"1048576", 1 << 20, ""},
		{"512B", 512, ""},
		{"4GiB", 4 << 30, ""},
		{"4 GiB", 4 << 30, ""},
		{"1.5KiB", 1536, ""},
		{"4.7GB", 4_700_000_000, ""},
		{"700MB", 700_000_000, ""},
		{"1kB", 1000, ""},
		{"1KB", 1000, ""},
		{"2TiB", 2 << 40, ""},
		{"1TB", 1_000_000_000_000, ""},
		{"9223372036854775807", MaxSize, ""},
		{"9223372036854775808", 0, "larger than"},
		{"8EiB", 0, `unknown unit "EiB"`},
		{"4gib", 0, `did you mean "GiB"?`},
		{"4kb", 0, `did you mean "kB"?`},
		{"1.1KiB", 0, "not a whole number of bytes"},
		{"0.5B", 0, "not a whole number of bytes"},
		{"", 0, "write a whole number of bytes"},
		{"GiB", 0, "write a whole number of bytes"},
		{"-1", 0, "write a whole number of bytes"},
		{".5GiB", 0, "write a whole number of bytes"},
		{"4  GiB", 0, "write a whole number of bytes"},
		{"0x10", 0, "write a whole number of bytes"},
		{"1e9", 0, "write a whole number of bytes"},
		{strings.Repeat("9", 41), 0, "too long"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		case tt.err != "" && (err == nil || !errors.Is(err, ErrSize) || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParseSize(%q) = %d, %v; want an ErrSize containing %q", tt.in, got, err, tt.err)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tt := range []struct {
		in   Size
		want string
	}{
		{0, "0"}, {1, "1"}, {1000, "1kB"}, {1024, "1KiB"}, {1536, "1536"}, {4 << 30, "4GiB"},
		{4_700_000_000, "4700MB"}, {1 << 40, "1TiB"}, {3_000_000_000_000, "3TB"}, {1_000_001, "1000001"}, {MaxSize, "9223372036854775807"},
	} {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("Size(%d).String() = %q, want %q", uint64(tt.in), got, tt.want)
		}
		back, err := ParseSize(tt.in.String())
		if err != nil || back != tt.in {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in.String(), back, err, uint64(tt.in))
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4GiB", "4.7GB", "1.1KiB", "0", "18446744073709551616", "1 kB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n > MaxSize {
			t.Fatalf("ParseSize(%q) = %d > MaxSize", s, n)
		}
		if back, err := ParseSize(n.String()); err != nil || back != n {
			t.Fatalf("ParseSize(%q) = %d; String %q parses to %d, %v", s, n, n.String(), back, err)
		}
	})
}
