package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// fileFixture writes real credential files (an OpenSSH private key, a known_hosts file, a PEM CA,
// passwords) into a temporary directory and returns the lab configuration pointing at them, with
// node 3 switched to Redfish so that every file kind is referenced.
type fileFixture struct {
	dir string
	c   *BootstrapConfiguration
}

func newFileFixture(t *testing.T) *fileFixture {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, data []byte, perm os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, perm); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hostKey, priv := testHostKey(t)
	block, err := ssh.MarshalPrivateKey(priv, "appliance")
	if err != nil {
		t.Fatal(err)
	}
	key := write("id_ed25519", pem.EncodeToMemory(block), 0o600)
	knownHosts := write("known_hosts", []byte("10.100.0.11 "+hostKey+"\n"), 0o644)
	ca := write("ca.pem", selfSignedPEM(t), 0o644)
	pw := write("bmc.password", []byte("hunter2\n"), 0o600)
	vrrp := write("vrrp.password", []byte("12345678\n"), 0o600)
	snippet := write("extra.ign", []byte(`{"ignition":{"version":"3.5.0"}}`), 0o644)
	bundle := filepath.Join(dir, "bundle")
	if err := os.Mkdir(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	c := labConfig(t)
	c.Bundle.Path = bundle
	pub := filepath.Join(dir, "bundle-signing.pub")
	if err := os.WriteFile(pub, []byte("ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U=\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Bundle.PublicKeyFiles = []string{pub}
	c.StateDir = filepath.Join(dir, "state")
	c.APIServer.Keepalived.AuthPasswordFile = vrrp
	c.APIServer.Keepalived.AdvertInterval = DefaultAdvertIntervalPASS // as SetDefaults sets it with a password file
	c.Ignition.All = []string{snippet}
	c.Nodes[0].Ignition = []string{snippet}
	for i := range 3 {
		c.Nodes[i].Power.PrivateKeyFile, c.Nodes[i].Power.KnownHostsFile = key, knownHosts
	}
	c.Nodes[3].Power.PasswordFile = pw
	c.Nodes = append(c.Nodes, Node{Name: "w2", Roles: []Role{RoleWorker}, Addresses: []netip.Addr{addr("10.100.0.22"), addr("10.200.0.22")},
		Power: Power{Kind: PowerRedfish, Address: "https://10.100.0.122", Username: "admin", PasswordFile: pw, CAFile: ca, BootDevice: BootPXE}})
	return &fileFixture{dir: dir, c: c}
}

func (f *fileFixture) write(t *testing.T, name string, data []byte, perm os.FileMode) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, data, perm); err != nil {
		t.Fatal(err)
	}
	return p
}

func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bmc ca"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestCheckFiles(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(t *testing.T, f *fileFixture)
		path   string // "" for no error and no warning
		msg    string
		warn   bool
	}{
		{"all files present and well-formed", func(t *testing.T, f *fileFixture) {}, "", "", false},
		{"bundle missing", func(t *testing.T, f *fileFixture) { f.c.Bundle.Path = filepath.Join(f.dir, "nope") },
			"bundle.path", "does not exist: unpack the offline bundle there", false},
		{"bundle is a file", func(t *testing.T, f *fileFixture) { f.c.Bundle.Path = f.c.Nodes[0].Power.PrivateKeyFile },
			"bundle.path", "is not a directory", false},
		{"bundle key file missing", func(t *testing.T, f *fileFixture) {
			f.c.Bundle.PublicKeyFiles = []string{filepath.Join(f.dir, "nopub")}
		},
			"bundle.publicKeyFiles[0]", "does not exist", false},
		{"bundle key file holds no key", func(t *testing.T, f *fileFixture) {
			f.c.Bundle.PublicKeyFiles = []string{f.c.Nodes[1].Power.KnownHostsFile}
		}, "bundle.publicKeyFiles[0]", `does not start with "ed25519:"`, false},
		{"private key missing", func(t *testing.T, f *fileFixture) { f.c.Nodes[1].Power.PrivateKeyFile = filepath.Join(f.dir, "nokey") },
			"nodes[1].power.privateKeyFile", "does not exist", false},
		{"private key is a public key", func(t *testing.T, f *fileFixture) {
			f.c.Nodes[1].Power.PrivateKeyFile = f.c.Nodes[1].Power.KnownHostsFile
		}, "nodes[1].power.privateKeyFile", "is not an SSH private key", false},
		{"private key with passphrase", func(t *testing.T, f *fileFixture) {
			_, priv := testHostKey(t)
			block, err := ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte("secret"))
			if err != nil {
				t.Fatal(err)
			}
			f.c.Nodes[1].Power.PrivateKeyFile = f.write(t, "enc_key", pem.EncodeToMemory(block), 0o600)
		}, "nodes[1].power.privateKeyFile", "encrypted with a passphrase", false},
		{"private key readable by others", func(t *testing.T, f *fileFixture) {
			if err := os.Chmod(f.c.Nodes[0].Power.PrivateKeyFile, 0o644); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				f.c.Nodes[i].Power.PrivateKeyFile = f.c.Nodes[0].Power.PrivateKeyFile
			}
			f.c.Nodes = append(f.c.Nodes[:1], f.c.Nodes[3:]...) // one ssh node: one warning
		}, "nodes[0].power.privateKeyFile", "mode 0644", true},
		{"known_hosts malformed", func(t *testing.T, f *fileFixture) {
			f.c.Nodes[2].Power.KnownHostsFile = f.write(t, "bad_known_hosts", []byte("10.100.0.13 ssh-ed25519 !!!\n"), 0o644)
		}, "nodes[2].power.knownHostsFile", "is not an OpenSSH known_hosts file", false},
		{"known_hosts is a directory", func(t *testing.T, f *fileFixture) { f.c.Nodes[2].Power.KnownHostsFile = f.dir },
			"nodes[2].power.knownHostsFile", "is not a regular file", false},
		{"BMC password missing", func(t *testing.T, f *fileFixture) { f.c.Nodes[3].Power.PasswordFile = filepath.Join(f.dir, "nopw") },
			"nodes[3].power.passwordFile", "does not exist", false},
		{"BMC password empty", func(t *testing.T, f *fileFixture) {
			f.c.Nodes[3].Power.PasswordFile = f.write(t, "empty.password", []byte("\n"), 0o600)
		}, "nodes[3].power.passwordFile", "is empty", false},
		{"CA file without certificate", func(t *testing.T, f *fileFixture) {
			f.c.Nodes[4].Power.CAFile = f.write(t, "notca.pem", []byte("hello\n"), 0o644)
		}, "nodes[4].power.caFile", "holds no PEM certificate", false},
		{"VRRP password too long", func(t *testing.T, f *fileFixture) {
			f.c.APIServer.Keepalived.AuthPasswordFile = f.write(t, "long.password", []byte("123456789\n"), 0o600)
		}, "apiServer.keepalived.authPasswordFile", "holds 9 bytes: VRRP PASS authentication uses at most 8", false},
		{"VRRP password empty", func(t *testing.T, f *fileFixture) {
			f.c.APIServer.Keepalived.AuthPasswordFile = f.write(t, "empty.password", nil, 0o600)
		}, "apiServer.keepalived.authPasswordFile", "is empty", false},
		{"ignition snippet missing", func(t *testing.T, f *fileFixture) { f.c.Nodes[0].Ignition = []string{filepath.Join(f.dir, "no.ign")} },
			"nodes[0].ignition[0]", "does not exist", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFileFixture(t)
			tt.mutate(t, f)
			warns, errs := Validate(f.c, ValidateOptions{CheckFiles: true})
			gotErrs, gotWarns := len(errs), len(warns)
			switch {
			case tt.path == "":
				if gotErrs+gotWarns > 0 {
					t.Fatalf("errors:\n%v\nwarnings:\n%v", errs, ErrorList(warns))
				}
			case tt.warn:
				if gotErrs > 0 || gotWarns != 1 || warns[0].Path != tt.path || !strings.Contains(warns[0].Msg, tt.msg) {
					t.Fatalf("want one warning at %s containing %q; errors:\n%v\nwarnings:\n%v", tt.path, tt.msg, errs, ErrorList(warns))
				}
			default:
				if gotErrs != 1 || errs[0].Path != tt.path || !strings.Contains(errs[0].Msg, tt.msg) {
					t.Fatalf("want one error at %s containing %q; got:\n%v", tt.path, tt.msg, errs)
				}
			}
			// Without CheckFiles the same configuration never fails on files.
			if _, errs := Validate(f.c, ValidateOptions{}); len(errs) > 0 {
				t.Errorf("without CheckFiles: %v", errs)
			}
		})
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ in, want string }{
		{"pass\n", "pass"}, {"pass\r\n", "pass"}, {"pass", "pass"}, {"pass\n\n", "pass\n"}, {" p ", " p "},
	} {
		p := filepath.Join(dir, "s")
		if err := os.WriteFile(p, []byte(tt.in), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadSecretFile(p)
		if err != nil || string(got) != tt.want {
			t.Errorf("ReadSecretFile(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Errorf("missing file: err = %v", err)
	}
}
