package debrepo

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"

	"github.com/airgap-appliance/appliance/test/labns"
)

func TestFetchIndex(t *testing.T) {
	u := newUpstream(t, closureDebs, RepoOptions{ValidFor: 48 * time.Hour})
	ctx := context.Background()
	client := u.srv.Client()
	now := repoDate.Add(time.Hour)

	idx, err := FetchIndex(ctx, client, u.source(), "amd64", now)
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.SignerFingerprints) != 1 || idx.SignerFingerprints[0] != u.signer.Fingerprint() {
		t.Errorf("signers %v, want %s", idx.SignerFingerprints, u.signer.Fingerprint())
	}
	if len(idx.Packages) != len(u.repo.Packages) {
		t.Fatalf("got %d packages, want %d", len(idx.Packages), len(u.repo.Packages))
	}
	for i, p := range idx.Packages {
		w := u.repo.Packages[i]
		if p.Name != w.Name || p.Version != w.Version || p.SHA256 != w.SHA256 || p.Size != w.Size || p.Filename != w.Filename ||
			p.Component != "main" || p.URL != u.srv.URL+"/debian/"+w.Filename || p.SourceURI != u.source().URI {
			t.Errorf("package %d: got %+v, want %+v", i, p, w)
		}
	}
	if idx.Packages[0].Depends != "bravo (>= 2.0)" || idx.Packages[1].PreDepends != "charlie++" {
		t.Errorf("relationships: alpha Depends %q, bravo Pre-Depends %q", idx.Packages[0].Depends, idx.Packages[1].PreDepends)
	}

	t.Run("signed by another key", func(t *testing.T) {
		other := testKey(t)
		src := u.source()
		src.Keyring = writeKeyring(t, other, t.TempDir(), "other.gpg")
		_, err := FetchIndex(ctx, client, src, "amd64", now)
		var se *SignatureError
		if !errors.As(err, &se) || !errors.Is(err, ErrSignature) {
			t.Fatalf("got %v, want a *SignatureError", err)
		}
		msg := err.Error()
		for _, want := range []string{src.URI + " stable: InRelease", u.signer.Fingerprint(), other.KeyID(), "not in the keyring"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q lacks %q", msg, want)
			}
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("error is not one line: %q", msg)
		}
	})
	t.Run("Packages.gz differs from Release", func(t *testing.T) {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		_, _ = zw.Write(bytes.Replace(readFile(t, filepath.Join(u.dir, "dists/stable/main/binary-amd64/Packages")), []byte("3.0-1"), []byte("3.0-9"), 1))
		_ = zw.Close()
		u.set(map[string][]byte{"/debian/dists/stable/main/binary-amd64/Packages.gz": z.Bytes()})
		defer u.set(nil)
		_, err := FetchIndex(ctx, client, u.source(), "amd64", now)
		if !errors.Is(err, ErrHashMismatch) || !strings.Contains(err.Error(), "main/binary-amd64/Packages.gz") || !strings.Contains(err.Error(), u.source().URI+" stable") {
			t.Fatalf("got %v, want ErrHashMismatch naming the source and Packages.gz", err)
		}
	})
	t.Run("xz-only index, as Debian's bookworm-updates serves", func(t *testing.T) {
		// The .xz is made by the real xz(1); the Release lists it and the uncompressed Packages only.
		plainPath := filepath.Join(u.dir, "dists/stable/main/binary-amd64/Packages")
		xzBin := labns.RequireTool(t, "xz")
		xzData, err := exec.Command(xzBin, "-c", plainPath).Output()
		if err != nil {
			t.Fatalf("xz: %v", err)
		}
		rel, err := ParseRelease(readFile(t, filepath.Join(u.dir, "dists/stable/Release")))
		if err != nil {
			t.Fatal(err)
		}
		delete(rel.SHA256, "main/binary-amd64/Packages.gz")
		sum := sha256.Sum256(xzData)
		rel.SHA256["main/binary-amd64/Packages.xz"] = FileHash{Size: int64(len(xzData)), SHA256: hex.EncodeToString(sum[:])}
		in, err := u.signer.ClearSign(rel.Marshal(), repoDate)
		if err != nil {
			t.Fatal(err)
		}
		over := map[string][]byte{"/debian/dists/stable/InRelease": in, "/debian/dists/stable/main/binary-amd64/Packages.gz": nil,
			"/debian/dists/stable/main/binary-amd64/Packages.xz": xzData, "/debian/dists/stable/main/binary-amd64/Packages": nil}
		u.set(over)
		defer u.set(nil)
		idx, err := FetchIndex(ctx, client, u.source(), "amd64", now)
		if err != nil {
			t.Fatal(err)
		}
		if len(idx.Packages) != len(u.repo.Packages) {
			t.Fatalf("got %d packages from Packages.xz, want %d", len(idx.Packages), len(u.repo.Packages))
		}
		// A .xz whose text differs from the listed uncompressed Packages is refused.
		bad, err := exec.Command("bash", "-c", "sed s/3.0-1/3.0-9/ "+plainPath+" | "+xzBin+" -c").Output()
		if err != nil {
			t.Fatal(err)
		}
		sum = sha256.Sum256(bad)
		rel.SHA256["main/binary-amd64/Packages.xz"] = FileHash{Size: int64(len(bad)), SHA256: hex.EncodeToString(sum[:])}
		if in, err = u.signer.ClearSign(rel.Marshal(), repoDate); err != nil {
			t.Fatal(err)
		}
		over["/debian/dists/stable/InRelease"], over["/debian/dists/stable/main/binary-amd64/Packages.xz"] = in, bad
		u.set(over)
		if _, err := FetchIndex(ctx, client, u.source(), "amd64", now); !errors.Is(err, ErrHashMismatch) || !strings.Contains(err.Error(), "uncompressed main/binary-amd64/Packages.xz") {
			t.Fatalf("got %v, want ErrHashMismatch for the uncompressed text of Packages.xz", err)
		}
	})
	t.Run("uncompressed Packages differs", func(t *testing.T) {
		plain := readFile(t, filepath.Join(u.dir, "dists/stable/main/binary-amd64/Packages"))
		u.set(map[string][]byte{
			"/debian/dists/stable/main/binary-amd64/Packages.gz": nil,
			"/debian/dists/stable/main/binary-amd64/Packages":    bytes.Replace(plain, []byte("3.0-1"), []byte("3.0-9"), 1),
		})
		defer u.set(nil)
		if _, err := FetchIndex(ctx, client, u.source(), "amd64", now); !errors.Is(err, ErrHashMismatch) {
			t.Fatalf("got %v, want ErrHashMismatch", err)
		}
	})
	t.Run("Release and Release.gpg without InRelease", func(t *testing.T) {
		u.set(map[string][]byte{"/debian/dists/stable/InRelease": nil})
		defer u.set(nil)
		if _, err := FetchIndex(ctx, client, u.source(), "amd64", now); err != nil {
			t.Fatal(err)
		}
		rel := readFile(t, filepath.Join(u.dir, "dists/stable/Release"))
		u.set(map[string][]byte{"/debian/dists/stable/InRelease": nil, "/debian/dists/stable/Release": bytes.Replace(rel, []byte("Label: airgap"), []byte("Label: airgaq"), 1)})
		_, err := FetchIndex(ctx, client, u.source(), "amd64", now)
		if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), "Release.gpg") || !strings.Contains(err.Error(), "BAD signature by key "+u.signer.Fingerprint()) {
			t.Fatalf("got %v, want a BAD signature on Release.gpg", err)
		}
		u.set(map[string][]byte{"/debian/dists/stable/InRelease": nil, "/debian/dists/stable/Release.gpg": nil})
		if _, err := FetchIndex(ctx, client, u.source(), "amd64", now); !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), "not signed") {
			t.Fatalf("got %v, want an unsigned-repository error", err)
		}
	})
	t.Run("tampered InRelease", func(t *testing.T) {
		in := readFile(t, filepath.Join(u.dir, "dists/stable/InRelease"))
		for name, data := range map[string][]byte{
			"changed byte":  bytes.Replace(in, []byte("Label: airgap"), []byte("Label: airgaq"), 1),
			"trailing text": append(append([]byte{}, in...), "Label: evil\n"...),
			"leading text":  append([]byte("Origin: evil\n\n"), in...),
			// go-crypto's clearsign.Decode panics on this (found by FuzzVerifyInRelease).
			"empty body": []byte("-----BEGIN PGP SIGNED MESSAGE-----\n\n-----BEGIN PGP SIGNATURE-----\n"),
		} {
			u.set(map[string][]byte{"/debian/dists/stable/InRelease": data})
			if _, err := FetchIndex(ctx, client, u.source(), "amd64", now); !errors.Is(err, ErrSignature) {
				t.Errorf("%s: got %v, want ErrSignature", name, err)
			}
		}
		u.set(nil)
	})
	t.Run("expired", func(t *testing.T) {
		_, err := FetchIndex(ctx, client, u.source(), "amd64", repoDate.Add(49*time.Hour))
		if !errors.Is(err, ErrExpired) || !strings.Contains(err.Error(), "Valid-Until") {
			t.Fatalf("got %v, want ErrExpired", err)
		}
		// Before the Date the signature itself is from the future: refused too.
		if _, err := FetchIndex(ctx, client, u.source(), "amd64", repoDate.Add(-time.Hour)); !errors.Is(err, ErrSignature) {
			t.Fatalf("before Date: got %v, want ErrSignature", err)
		}
	})
	t.Run("armored keyring", func(t *testing.T) {
		var b bytes.Buffer
		w, _ := armor.Encode(&b, openpgp.PublicKeyType, nil)
		_, _ = w.Write(readFile(t, u.keyring))
		_ = w.Close()
		src := u.source()
		src.Keyring = filepath.Join(t.TempDir(), "upstream.asc")
		if err := os.WriteFile(src.Keyring, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := FetchIndex(ctx, client, src, "amd64", now); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("architecture not listed", func(t *testing.T) {
		if _, err := FetchIndex(ctx, client, u.source(), "arm64", now); !errors.Is(err, ErrRelease) || !strings.Contains(err.Error(), "binary-arm64") {
			t.Fatalf("got %v, want ErrRelease naming binary-arm64", err)
		}
	})
}

// TestVerifyDebianInRelease verifies the real InRelease files apt downloaded from deb.debian.org
// (under /var/lib/apt/lists) against Debian's own keyring, and refuses them with a keyring of
// another key, naming Debian's signing keys.
func TestVerifyDebianInRelease(t *testing.T) {
	const keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	files, _ := filepath.Glob("/var/lib/apt/lists/*debian*_InRelease")
	if _, err := os.Stat(keyring); err != nil || len(files) == 0 {
		if labns.InCI() {
			t.Fatalf("need %s (debian-archive-keyring) and Debian InRelease files in /var/lib/apt/lists (apt-get update)", keyring)
		}
		t.Skipf("SKIPPED: no %s or no Debian InRelease in /var/lib/apt/lists", keyring)
	}
	kr, err := ReadKeyring(keyring)
	if err != nil {
		t.Fatal(err)
	}
	if len(kr.KeyIDs()) < 2 {
		t.Fatalf("Debian keyring: only %v", kr.KeyIDs())
	}
	other := mustKeyring(t, testKey(t))
	for _, f := range files {
		data := readFile(t, f)
		// Verify at the Release's own Date: Valid-Until (security, updates) may have passed since.
		date, _, _ := strings.Cut(string(data[bytes.Index(data, []byte("\nDate: "))+7:]), "\n")
		now, err := parseReleaseTime(date)
		if err != nil {
			t.Fatal(err)
		}
		// A day later: the release team's signature is made some minutes after the Date.
		now = now.Add(24 * time.Hour)
		v, err := VerifyInRelease(data, kr, now)
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
			continue
		}
		rel, err := ParseRelease(v.Signed)
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
			continue
		}
		if err := rel.CheckValid(now); err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
		}
		t.Logf("%s: suite %s, %d index files, signatures by %v, verified: %v", filepath.Base(f), rel.Suite, len(rel.SHA256), v.Issuers, v.SignerFingerprints)
		if len(v.Issuers) < len(v.SignerFingerprints) || len(v.SignerFingerprints) == 0 {
			t.Errorf("%s: issuers %v, verified %v", filepath.Base(f), v.Issuers, v.SignerFingerprints)
		}
		_, err = VerifyInRelease(data, other, now)
		if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), "signed by "+strings.Join(v.Issuers, ", ")) {
			t.Errorf("%s with another keyring: got %v, want ErrSignature naming %v", filepath.Base(f), err, v.Issuers)
		}
	}
}
