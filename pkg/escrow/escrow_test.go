package escrow

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

func TestMain(m *testing.M) {
	scryptWorkFactor = 10 // 2^18 costs a second and 256 MiB per seal
	os.Exit(m.Run())
}

// fakeState builds a state directory as a bootstrap run leaves it: the escrowed files and, beside
// them, what the escrow leaves out. It returns the directory and the cluster CA's pin.
func fakeState(t testing.TB) (string, string) {
	t.Helper()
	dir := t.TempDir()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if _, _, err := pki.EnsureCA(statedir.PKI(dir), "appliance CA lab", now); err != nil {
		t.Fatal(err)
	}
	cca, _, err := pki.EnsureCA(statedir.ClusterPKI(dir), "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pki.EnsureNodeTokens(statedir.PKI(dir), []string{"cp1", "cp2", "w1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pki.EnsureKubeadmSecrets(statedir.ClusterPKI(dir), pki.BootstrapTokenTTL, now); err != nil {
		t.Fatal(err)
	}
	write := func(p, content string, mode fs.FileMode) {
		t.Helper()
		abs := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(abs, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	// Escrowed.
	write("pki/vrrp-auth", "s3cret\n", 0o600)
	write("kubernetes/pod-ranges.json", `{"pods":"10.233.0.0/16","nodes":{"cp1":"10.233.0.0/24"}}`+"\n", 0o600)
	write("nodes/cp1/status.json", `{"state":"ready"}`, 0o600)
	write("nodes/cp1/kubeadm-done.json", `{"time":"2026-11-29T12:00:00Z","bootID":"b"}`, 0o600)
	write("nodes/cp1/history.jsonl", `{"event":"added"}`+"\n", 0o600)
	write("enrolment/w1.json", `{"node":"w1"}`, 0o600)
	write("enrolment/approved/w1.json", `{"node":"w1"}`, 0o600)
	write("appliance/keepalived.json", `{"instances":[{"virtualRouterID":7}]}`, 0o600)
	write("handoff/state.json", `{"stage":"done"}`, 0o644)
	write("handoff/certs/cp1/serving.crt", "cert", 0o644)
	write("handoff/certs/cp1/serving.key", "key", 0o600)
	write("keepalived/handed-off", "", 0o600)
	// Left out.
	write("bootstrap.lock", "", 0o600)
	write("journal.jsonl", `{"phase":"pki"}`+"\n", 0o600)
	write("bundle-verify.json", "{}", 0o644)
	write("pki/serving.crt", "cert", 0o644)
	write("pki/serving.key", "key", 0o600)
	write("pki/tokens/.cp1.tmp-1-2", "half a token", 0o600)
	write("kubernetes/admin.conf", "kubeconfig", 0o600)
	write("registry/docker/registry/v2/blobs/x", "layer", 0o644)
	write("rendered/cp1/hostagent.yaml", "token: x", 0o600)
	write("nodes/cp1/events.jsonl", `{"step":"config"}`+"\n", 0o600)
	write("serve/serve.log", "log", 0o600)
	write("appliance/firewall.json", "{}", 0o600)
	write("keepalived/keepalived.conf", "conf", 0o600)
	write("agent-upgrade.json", "{}", 0o600)
	write(".dry-run-123/ca.key", "scratch", 0o600)
	return dir, agentapi.PinOf(cca.Cert)
}

// wantPaths are the files fakeState escrows.
var wantPaths = []string{
	"appliance/keepalived.json",
	"enrolment/approved/w1.json",
	"enrolment/w1.json",
	"handoff/certs/cp1/serving.crt",
	"handoff/certs/cp1/serving.key",
	"handoff/state.json",
	"keepalived/handed-off",
	"kubernetes/pod-ranges.json",
	"nodes/cp1/history.jsonl",
	"nodes/cp1/kubeadm-done.json",
	"nodes/cp1/status.json",
	"pki/ca.crt",
	"pki/ca.key",
	"pki/kubernetes/ca.crt",
	"pki/kubernetes/ca.key",
	"pki/kubernetes/kubeadm-secrets.json",
	"pki/tokens/cp1",
	"pki/tokens/cp2",
	"pki/tokens/w1",
	"pki/vrrp-auth",
}

var testInfo = Info{ClusterName: "lab", ApplianceVersion: "v0.0.0-test", Created: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)}

// x25519 returns a new key pair as this package's types.
func x25519(t testing.TB) (Recipient, Identity) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRecipient(id.Recipient().String())
	if err != nil {
		t.Fatal(err)
	}
	ids, err := ParseIdentities(strings.NewReader("# created: now\n" + id.String() + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return r, ids[0]
}

func passphrase(t testing.TB, pass string) (Recipient, Identity) {
	t.Helper()
	r, err := PassphraseRecipient([]byte(pass))
	if err != nil {
		t.Fatal(err)
	}
	id, err := PassphraseIdentity([]byte(pass))
	if err != nil {
		t.Fatal(err)
	}
	return r, id
}

// TestRoundTrip seals a state to each kind of recipient, opens it, restores it into an empty
// directory and compares every file with the original; the excluded files stay behind.
func TestRoundTrip(t *testing.T) {
	state, pin := fakeState(t)
	xr, xid := x25519(t)
	xr2, xid2 := x25519(t)
	pr, pid := passphrase(t, "correct horse battery staple")
	hid, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	hr, err := ParseRecipient(hid.Recipient().String())
	if err != nil {
		t.Fatal(err)
	}
	hids, err := ParseIdentities(strings.NewReader(hid.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name       string
		recipients []Recipient
		identity   Identity
	}{
		{"x25519", []Recipient{xr}, xid},
		{"second of two x25519 keys", []Recipient{xr, xr2}, xid2},
		{"passphrase", []Recipient{pr}, pid},
		{"hybrid", []Recipient{hr}, hids[0]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			blob, m, err := Seal(state, tt.recipients, testInfo)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(blob, []byte("BEGIN")) || bytes.Contains(blob, []byte("s3cret")) {
				t.Fatal("the blob holds plaintext")
			}
			e, err := Open(blob, []Identity{tt.identity}, Expect{ClusterCAPin: pin, ClusterName: "lab"})
			if err != nil {
				t.Fatal(err)
			}
			if got := e.Paths(); !slices.Equal(got, wantPaths) {
				t.Errorf("escrowed %v\nwant %v", got, wantPaths)
			}
			if e.Manifest.ContentDigest != m.ContentDigest || e.Manifest.ClusterCAPin != pin || e.Manifest.ClusterName != "lab" ||
				!e.Manifest.Created.Equal(testInfo.Created) || e.Manifest.ApplianceVersion != "v0.0.0-test" {
				t.Errorf("manifest %+v, sealed %+v", e.Manifest, m)
			}
			for _, f := range e.Manifest.Files {
				orig, err := os.ReadFile(filepath.Join(state, f.Path))
				if err != nil {
					t.Fatal(err)
				}
				got, _ := e.ReadFile(f.Path)
				if !bytes.Equal(got, orig) {
					t.Errorf("%s differs", f.Path)
				}
				if f.Path == "handoff/state.json" && f.Mode != 0o644 || f.Path == "pki/ca.key" && f.Mode != 0o600 {
					t.Errorf("%s: mode %04o not kept", f.Path, f.Mode)
				}
			}

			target := filepath.Join(t.TempDir(), "state")
			rm, err := Restore(blob, []Identity{tt.identity}, Expect{ClusterCAPin: pin}, target)
			if err != nil {
				t.Fatal(err)
			}
			if rm.ContentDigest != m.ContentDigest {
				t.Errorf("restored digest %s, sealed %s", rm.ContentDigest, m.ContentDigest)
			}
			var restored []string
			err = filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				r, _ := filepath.Rel(target, p)
				switch {
				case d.IsDir() && info.Mode().Perm() != 0o700:
					t.Errorf("directory %s: mode %04o, want 0700", r, info.Mode().Perm())
				case !d.IsDir() && info.Mode().Perm() != 0o600:
					t.Errorf("%s: mode %04o, want 0600", r, info.Mode().Perm())
				}
				if !d.IsDir() {
					restored = append(restored, filepath.ToSlash(r))
					orig, _ := os.ReadFile(filepath.Join(state, r))
					if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
						t.Errorf("restored %s differs", r)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(restored, wantPaths) {
				t.Errorf("restored %v\nwant %v", restored, wantPaths)
			}
			// The restored state seals to the same content.
			again, err := Inspect(target, testInfo)
			if err != nil || again.ContentDigest != m.ContentDigest {
				t.Errorf("the restored state's digest: %v %v, want %s", again, err, m.ContentDigest)
			}
		})
	}
}

// TestDeterministic: two seals of the same state have the same plaintext, byte for byte, and
// different ciphertexts; the content digest ignores the time and version and follows the files.
func TestDeterministic(t *testing.T) {
	state, _ := fakeState(t)
	r, id := x25519(t)
	plain := func(info Info) []byte {
		blob, _, err := Seal(state, []Recipient{r}, info)
		if err != nil {
			t.Fatal(err)
		}
		p, err := decrypt(blob, []Identity{id})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := plain(testInfo), plain(testInfo)
	if sha256.Sum256(a) != sha256.Sum256(b) {
		t.Error("two seals of the same state have different plaintexts")
	}
	b1, _, _ := Seal(state, []Recipient{r}, testInfo)
	b2, _, _ := Seal(state, []Recipient{r}, testInfo)
	if bytes.Equal(b1, b2) {
		t.Error("two seals have the same ciphertext: age's file key is not fresh")
	}

	digest := func(info Info) string {
		m, err := Inspect(state, info)
		if err != nil {
			t.Fatal(err)
		}
		return m.ContentDigest
	}
	d0 := digest(testInfo)
	later := testInfo
	later.Created, later.ApplianceVersion = later.Created.Add(time.Hour), "v9"
	if digest(later) != d0 {
		t.Error("the content digest depends on the time or version")
	}
	// A log the escrow leaves out does not change it; a token does.
	if err := os.WriteFile(filepath.Join(state, "nodes/cp1/events.jsonl"), []byte("more\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if digest(testInfo) != d0 {
		t.Error("an excluded file changed the content digest")
	}
	if _, err := pki.RotateNodeToken(statedir.PKI(state), "w1"); err != nil {
		t.Fatal(err)
	}
	if digest(testInfo) == d0 {
		t.Error("a rotated token did not change the content digest")
	}
}

// TestRefusals: a wrong key or passphrase, a changed byte, another cluster and a non-empty target
// are refused with their sentinel error, and the target is left as it was.
func TestRefusals(t *testing.T) {
	state, pin := fakeState(t)
	xr, xid := x25519(t)
	_, otherID := x25519(t)
	pr, pid := passphrase(t, "correct horse battery staple")
	_, wrongPass := passphrase(t, "Correct horse battery staple")
	xblob, _, err := Seal(state, []Recipient{xr}, testInfo)
	if err != nil {
		t.Fatal(err)
	}
	pblob, _, err := Seal(state, []Recipient{pr}, testInfo)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(b []byte, i int) []byte {
		c := bytes.Clone(b)
		if i < 0 {
			i += len(c)
		}
		c[i] ^= 0x01
		return c
	}
	hdrEnd := bytes.Index(xblob, []byte("\n---")) // the end of age's text header
	otherState, _ := fakeState(t)
	otherBlob, _, err := Seal(otherState, []Recipient{xr}, testInfo)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPin := fakeState(t)

	for _, tt := range []struct {
		name string
		blob []byte
		ids  []Identity
		want Expect
		err  error
		msg  string
	}{
		{"another key", xblob, []Identity{otherID}, Expect{ClusterCAPin: pin}, ErrWrongIdentity, "sealed to other keys or another passphrase"},
		{"no identity", xblob, nil, Expect{ClusterCAPin: pin}, ErrWrongIdentity, "no identity given"},
		{"a passphrase for a key's escrow", xblob, []Identity{pid}, Expect{ClusterCAPin: pin}, ErrWrongIdentity, ""},
		{"a wrong passphrase", pblob, []Identity{wrongPass}, Expect{ClusterCAPin: pin}, ErrWrongIdentity, ""},
		{"a key for a passphrase's escrow", pblob, []Identity{xid}, Expect{ClusterCAPin: pin}, ErrWrongIdentity, ""},
		{"last byte changed", flip(xblob, -1), []Identity{xid}, Expect{ClusterCAPin: pin}, ErrTampered, ""},
		{"a payload byte changed", flip(xblob, hdrEnd+200), []Identity{xid}, Expect{ClusterCAPin: pin}, ErrTampered, ""},
		{"header MAC changed", flip(xblob, hdrEnd+6), []Identity{xid}, Expect{ClusterCAPin: pin}, ErrTampered, ""},
		{"cut short", xblob[:len(xblob)-20], []Identity{xid}, Expect{ClusterCAPin: pin}, ErrTampered, ""},
		{"not an escrow", []byte("hello"), []Identity{xid}, Expect{ClusterCAPin: pin}, ErrTampered, ""},
		{"another cluster's escrow", otherBlob, []Identity{xid}, Expect{ClusterCAPin: pin}, ErrOtherCluster, `holds the state of cluster "lab" (cluster CA sha256:`},
		{"this escrow, another live cluster", xblob, []Identity{xid}, Expect{ClusterCAPin: otherPin}, ErrOtherCluster, "but the cluster's CA is " + otherPin},
		{"another cluster name", xblob, []Identity{xid}, Expect{ClusterCAPin: pin, ClusterName: "prod"}, ErrOtherCluster, `but clusterName is "prod"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Open(tt.blob, tt.ids, tt.want); !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Open: %v, want %v containing %q", err, tt.err, tt.msg)
			}
			target := t.TempDir()
			if _, err := Restore(tt.blob, tt.ids, tt.want, target); !errors.Is(err, tt.err) {
				t.Errorf("Restore: %v, want %v", err, tt.err)
			}
			if entries, _ := os.ReadDir(target); len(entries) != 0 {
				t.Errorf("a refused restore wrote %v", entries)
			}
		})
	}

	t.Run("non-empty target", func(t *testing.T) {
		target := t.TempDir()
		keep := filepath.Join(target, "journal.jsonl")
		if err := os.WriteFile(keep, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Restore(xblob, []Identity{xid}, Expect{ClusterCAPin: pin}, target)
		if !errors.Is(err, ErrNotEmpty) || !strings.Contains(err.Error(), "holds journal.jsonl: restore into an empty state directory") {
			t.Errorf("Restore: %v", err)
		}
		if entries, _ := os.ReadDir(target); len(entries) != 1 {
			t.Errorf("target now holds %v", entries)
		}
	})
	t.Run("interrupted restore", func(t *testing.T) {
		target := t.TempDir()
		if err := os.Mkdir(filepath.Join(target, restorePrefix+"1"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := Restore(xblob, []Identity{xid}, Expect{ClusterCAPin: pin}, target); !errors.Is(err, ErrNotEmpty) || !strings.Contains(err.Error(), "an earlier restore was interrupted") {
			t.Errorf("Restore: %v", err)
		}
	})
	t.Run("empty lost+found is empty", func(t *testing.T) {
		target := t.TempDir()
		if err := os.Mkdir(filepath.Join(target, "lost+found"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := Restore(xblob, []Identity{xid}, Expect{ClusterCAPin: pin}, target); err != nil {
			t.Errorf("Restore: %v", err)
		}
	})
	t.Run("no expected cluster", func(t *testing.T) {
		target := t.TempDir()
		if _, err := Restore(xblob, []Identity{xid}, Expect{}, target); err == nil || !strings.Contains(err.Error(), "the live cluster's CA pin is required") {
			t.Errorf("Restore: %v", err)
		}
	})
}

// TestForgedContent: a key holder can make a blob that decrypts, but not one that writes outside
// Contents or disagrees with its manifest.
func TestForgedContent(t *testing.T) {
	state, pin := fakeState(t)
	r, id := x25519(t)
	_, m, err := Seal(state, []Recipient{r}, testInfo)
	if err != nil {
		t.Fatal(err)
	}
	forge := func(mutate func(m *Manifest, files map[string][]byte)) []byte {
		t.Helper()
		mm := *m
		mm.Files = slices.Clone(m.Files)
		files := map[string][]byte{}
		for _, f := range mm.Files {
			files[f.Path], _ = os.ReadFile(filepath.Join(state, f.Path))
		}
		mutate(&mm, files)
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		mj, _ := json.Marshal(mm)
		add := func(name string, data []byte) {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(data))}); err != nil {
				t.Fatal(err)
			}
			_, _ = tw.Write(data)
		}
		add(manifestName, mj)
		for _, f := range mm.Files {
			add(statePrefix+f.Path, files[f.Path])
		}
		_ = tw.Close()
		_ = zw.Close()
		var out bytes.Buffer
		w, _ := age.Encrypt(&out, r.r)
		_, _ = w.Write(buf.Bytes())
		_ = w.Close()
		return out.Bytes()
	}
	add := func(p string, data []byte) func(*Manifest, map[string][]byte) {
		return func(mm *Manifest, files map[string][]byte) {
			sum := sha256.Sum256(data)
			mm.Files = append(mm.Files, File{Path: p, Mode: 0o600, Size: int64(len(data)), SHA256: hexOf(sum[:])})
			slices.SortFunc(mm.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
			files[p] = data
			mm.ContentDigest = mm.digest()
		}
	}
	for _, tt := range []struct {
		name   string
		mutate func(*Manifest, map[string][]byte)
		msg    string
	}{
		{"unchanged", func(*Manifest, map[string][]byte) {}, ""},
		{"a path outside Contents", add("rendered/cp1/hostagent.yaml", []byte("x")), "rendered/cp1/hostagent.yaml is not a file the escrow keeps"},
		{"a path up and out", add("pki/tokens/../../../etc/cron.d/x", []byte("x")), "is not a file the escrow keeps"},
		{"a hidden file", add("pki/tokens/.x", []byte("x")), "pki/tokens/.x is not a file the escrow keeps"},
		{"a file that does not match its digest", func(mm *Manifest, files map[string][]byte) { files["pki/tokens/w1"][0] ^= 1 }, "pki/tokens/w1 does not match its SHA-256"},
		{"a manifest whose digest is stale", func(mm *Manifest, files map[string][]byte) { mm.ClusterName = "prod" }, "content digest does not match"},
		{"a CA pin that is not the certificate's", func(mm *Manifest, files map[string][]byte) {
			mm.ClusterCAPin = "sha256:" + strings.Repeat("0", 64)
			mm.ContentDigest = mm.digest()
		}, "CA pin for pki/kubernetes does not match"},
		{"a newer format", func(mm *Manifest, files map[string][]byte) { mm.Format = 2 }, "format 2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(forge(tt.mutate), []Identity{id}, Expect{ClusterCAPin: pin})
			if tt.msg == "" {
				if err != nil {
					t.Errorf("Open: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Open: %v, want %q", err, tt.msg)
			}
		})
	}
}

func TestSealRefusals(t *testing.T) {
	xr, _ := x25519(t)
	pr, _ := passphrase(t, "pass")
	state, _ := fakeState(t)
	if _, _, err := Seal(state, nil, testInfo); !errors.Is(err, ErrNoRecipient) {
		t.Errorf("no recipient: %v", err)
	}
	if _, _, err := Seal(state, []Recipient{xr, pr}, testInfo); !errors.Is(err, ErrNoRecipient) || !strings.Contains(err.Error(), "a passphrase must be the escrow's only recipient") {
		t.Errorf("passphrase and key: %v", err)
	}
	if _, _, err := Seal(state, []Recipient{{}}, testInfo); !errors.Is(err, ErrNoRecipient) {
		t.Errorf("zero recipient: %v", err)
	}
	if _, _, err := Seal(state, []Recipient{xr}, Info{}); err == nil {
		t.Error("no cluster name: sealed")
	}
	if _, _, err := Seal(t.TempDir(), []Recipient{xr}, testInfo); err == nil || !strings.Contains(err.Error(), "pki/ca.crt is missing") {
		t.Errorf("empty state: %v", err)
	}
	// A CA key that is not the certificate's.
	other, _ := fakeState(t)
	key, _ := os.ReadFile(filepath.Join(other, "pki/kubernetes/ca.key"))
	if err := os.WriteFile(filepath.Join(state, "pki/kubernetes/ca.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Seal(state, []Recipient{xr}, testInfo); err == nil || !strings.Contains(err.Error(), "pki/kubernetes/ca.key is not the key of pki/kubernetes/ca.crt") {
		t.Errorf("mismatched key: %v", err)
	}
	// A symlink where a token belongs.
	state2, _ := fakeState(t)
	tok := filepath.Join(state2, "pki/tokens/cp2")
	if err := os.Remove(tok); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", tok); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Seal(state2, []Recipient{xr}, testInfo); err == nil || !strings.Contains(err.Error(), "is not a regular file") {
		t.Errorf("symlink: %v", err)
	}
	// Without Kubernetes: no cluster CA, no pin.
	state3, _ := fakeState(t)
	if err := os.RemoveAll(filepath.Join(state3, "pki/kubernetes")); err != nil {
		t.Fatal(err)
	}
	if m, err := Inspect(state3, testInfo); err != nil || m.ClusterCAPin != "" || m.ApplianceCAPin == "" {
		t.Errorf("without Kubernetes: %+v %v", m, err)
	}
}

func TestParseRecipient(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	good := id.Recipient().String()
	for _, tt := range []struct {
		in, msg string
	}{
		{good, ""},
		{"  " + good + "\n", ""},
		{id.String(), "is an age private key (AGE-SECRET-KEY-…), which must never be in bootstrap.yaml"},
		{"ssh-ed25519 AAAAC3Nza", `"ssh-ed25519 AAAAC3Nza" is not an age public key`},
		{"", `"" is not an age public key`},
		{good[:len(good)-1] + "q", "is not a valid age public key"},
		{"age1pq1xyz", "is not a valid age public key"},
	} {
		r, err := ParseRecipient(tt.in)
		switch {
		case tt.msg == "" && (err != nil || r.String() != good):
			t.Errorf("ParseRecipient(%q) = %v, %v", tt.in, r, err)
		case tt.msg != "" && (err == nil || !strings.Contains(err.Error(), tt.msg)):
			t.Errorf("ParseRecipient(%q): %v, want %q", tt.in, err, tt.msg)
		case err != nil && strings.Contains(err.Error(), "AGE-SECRET-KEY-1"):
			t.Errorf("the error repeats the private key: %v", err)
		}
	}
	if _, err := PassphraseRecipient(nil); err == nil {
		t.Error("empty passphrase accepted")
	}
	pr, _ := passphrase(t, "a")
	if pr.String() != "passphrase" || strings.Contains(RecipientsDigest([]Recipient{pr}), "a") && RecipientsDigest([]Recipient{pr}) == "" {
		t.Errorf("passphrase recipient shows as %q", pr.String())
	}
	r1, _ := x25519(t)
	r2, _ := x25519(t)
	if RecipientsDigest([]Recipient{r1, r2}) != RecipientsDigest([]Recipient{r2, r1}) || RecipientsDigest([]Recipient{r1}) == RecipientsDigest([]Recipient{r2}) {
		t.Error("RecipientsDigest depends on the order or not on the keys")
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
