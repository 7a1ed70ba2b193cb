package debrepo

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

const sampleRelease = `Origin: Debian
Label: Debian
Suite: oldstable
Codename: bookworm
Date: Sat, 11 Jul 2026 10:16:37 UTC
Valid-Until: Sat, 18 Jul 2026 10:16:37 UTC
Architectures: all amd64 arm64
Components: main contrib
Description: Debian 12.15
MD5Sum:
 f230d61720e789abf5df55d6026230c6 50060337 main/binary-amd64/Packages
SHA256:
 515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f 50060337 main/binary-amd64/Packages
 6777ea16514725f9427f48c240d92e0a6b8496138e37a1491d8597e66774e309 12084798 main/binary-amd64/Packages.gz
`

func TestParseRelease(t *testing.T) {
	r, err := ParseRelease([]byte(sampleRelease))
	if err != nil {
		t.Fatal(err)
	}
	if r.Codename != "bookworm" || r.Suite != "oldstable" || !r.Date.Equal(time.Date(2026, 7, 11, 10, 16, 37, 0, time.UTC)) ||
		!r.ValidUntil.Equal(time.Date(2026, 7, 18, 10, 16, 37, 0, time.UTC)) || len(r.Architectures) != 3 || len(r.Components) != 2 {
		t.Errorf("parsed %+v", r)
	}
	if fh := r.SHA256["main/binary-amd64/Packages.gz"]; fh.Size != 12084798 || !strings.HasPrefix(fh.SHA256, "6777ea") {
		t.Errorf("SHA256 entry %+v", fh)
	}
	// Marshal → Parse keeps every field.
	again, err := ParseRelease(r.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Marshal(), r.Marshal()) {
		t.Errorf("Marshal is not stable:\n%s\n%s", r.Marshal(), again.Marshal())
	}

	for _, tc := range []struct{ name, in, want string }{
		{"no SHA256", "Origin: x\nMD5Sum:\n 00 1 a\n", "no SHA256 field"},
		{"short hash", "SHA256:\n abc 1 main/Packages\n", "is not `<sha256> <size> <name>`"},
		{"escaping path", "SHA256:\n " + strings.Repeat("a", 64) + " 1 ../Packages\n", "not a clean relative path"},
		{"absolute path", "SHA256:\n " + strings.Repeat("a", 64) + " 1 /etc/passwd\n", "not a clean relative path"},
		{"bad date", "Date: yesterday\nSHA256:\n", "Date"},
		{"empty", "", "empty"},
	} {
		_, err := ParseRelease([]byte(tc.in))
		if !errors.Is(err, ErrRelease) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrRelease %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckValid(t *testing.T) {
	r, _ := ParseRelease([]byte(sampleRelease))
	for _, tc := range []struct {
		now  time.Time
		want string
	}{
		{r.Date.Add(time.Hour), ""},
		{r.ValidUntil.Add(time.Hour), "expired"},
		{r.Date.Add(-time.Hour), "in the future"},
	} {
		err := r.CheckValid(tc.now)
		if tc.want == "" && err != nil || tc.want != "" && (!errors.Is(err, ErrExpired) || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("at %v: got %v, want %q", tc.now, err, tc.want)
		}
	}
}

func TestParsePackagesErrors(t *testing.T) {
	good := "Package: hello\nVersion: 1\nArchitecture: amd64\nFilename: pool/h/hello.deb\nSize: 3\nSHA256: " + strings.Repeat("ab", 32) + "\n"
	if ps, err := ParsePackages(strings.NewReader(good + "\n" + good)); err != nil || len(ps) != 2 {
		t.Fatalf("good: %v %v", ps, err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"no Package", "Version: 1\n", "paragraph 1: no Package field"},
		{"no Filename", "Package: a1\nVersion: 1\nArchitecture: all\nSize: 1\n", `(a1): Filename ""`},
		{"escaping Filename", strings.Replace(good, "pool/h/hello.deb", "../../etc/passwd", 1), "not a clean relative path"},
		{"bad Size", strings.Replace(good, "Size: 3", "Size: -3", 1), "Size"},
		{"bad SHA256", strings.Replace(good, "SHA256: ab", "SHA256: zz", 1), "SHA256"},
		{"second paragraph", good + "\nPackage: x2\n", "paragraph 2 (x2)"},
	} {
		_, err := ParsePackages(strings.NewReader(tc.in))
		if !errors.Is(err, ErrPackages) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrPackages %q", tc.name, err, tc.want)
		}
	}
}

func FuzzParseRelease(f *testing.F) {
	f.Add([]byte(sampleRelease))
	f.Add([]byte("SHA256:\n 00 1 a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRelease(data)
		if err != nil {
			return
		}
		for name := range r.SHA256 {
			if !cleanRelPath(name) {
				t.Fatalf("accepted path %q", name)
			}
		}
		_ = r.Marshal()
	})
}

func FuzzParsePackages(f *testing.F) {
	f.Add([]byte("Package: hello\nVersion: 1\nArchitecture: amd64\nFilename: pool/h/hello.deb\nSize: 3\nSHA256: " + strings.Repeat("ab", 32) + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := ParsePackages(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, p := range ps {
			if !cleanRelPath(p.Filename) || len(p.SHA256) != 64 || p.Size < 0 {
				t.Fatalf("accepted %+v", p)
			}
		}
	})
}

// FuzzVerifyInRelease: no mutation of a signed InRelease verifies with other content, and nothing
// panics.
func FuzzVerifyInRelease(f *testing.F) {
	s, err := GenerateRepoKey(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		f.Fatal(err)
	}
	signed, err := s.ClearSign([]byte(sampleRelease), time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		f.Fatal(err)
	}
	pub, _ := s.PublicKeyring()
	el, err := parseKeyring(pub)
	if err != nil {
		f.Fatal(err)
	}
	kr := &Keyring{Path: "fuzz.gpg", entities: el}
	now := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	if _, err := VerifyInRelease(signed, kr, now); err != nil {
		f.Fatal(err)
	}
	f.Add(signed)
	f.Add([]byte("-----BEGIN PGP SIGNED MESSAGE-----\n\nx\n-----BEGIN PGP SIGNATURE-----\n\n-----END PGP SIGNATURE-----\n"))
	want, _ := ParseRelease([]byte(sampleRelease))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := VerifyInRelease(data, kr, now)
		if err != nil {
			return
		}
		// Only whitespace at line ends may differ (OpenPGP text signatures ignore it).
		got, err := ParseRelease(v.Signed)
		if err != nil || !bytes.Equal(got.Marshal(), want.Marshal()) {
			t.Fatalf("verified altered text:\n%s", v.Signed)
		}
	})
}
