package bundlespec

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// debianKeyring is Debian's archive keyring, a real binary OpenPGP keyring that apt on every Debian
// host reads (package debian-archive-keyring, which apt depends on).
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// fileFixture writes every kind of file a specification names into a temporary directory and points
// the Example at them.
type fileFixture struct {
	dir string
	s   *BundleSpecification
}

func (f *fileFixture) write(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// OpenPGP files as far as Validate looks into them: the first packet's tag, or the armor header. Byte
// 0x99 is a legacy-format public-key packet header (tag 6, two-byte length), 0xc5 a new-format
// secret-key packet header (tag 5), 0x95 a legacy-format secret-key one.
var (
	pgpPublicBinary  = []byte{0x99, 0x00, 0x0d, 0x04, 0x65, 0x00, 0x00, 0x00, 0x16}
	pgpPublicArmored = []byte("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZQAAABYJKwYBBAHaRw8BAQdA\n-----END PGP PUBLIC KEY BLOCK-----\n")
	pgpSecretNew     = []byte{0xc5, 0x58, 0x04, 0x65, 0x00, 0x00, 0x00, 0x16}
	pgpSecretLegacy  = []byte{0x95, 0x00, 0x58, 0x04, 0x65, 0x00, 0x00, 0x00}
	pgpSecretArmored = []byte("\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlFgEZQAAABYJKwYBBAHaRw8BAQdA\n-----END PGP PRIVATE KEY BLOCK-----\n")
	// keybox is the start of a GnuPG 2.1 pubring.kbx: a 4-byte length, type 1, version 1, flags, "KBXf".
	keybox = []byte{0x00, 0x00, 0x00, 0x20, 0x01, 0x01, 0x00, 0x00, 'K', 'B', 'X', 'f', 0, 0, 0, 0}
)

func newFileFixture(t *testing.T) *fileFixture {
	t.Helper()
	f := &fileFixture{dir: t.TempDir()}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	s := Example()
	keyring := f.write(t, "keyring.gpg", pgpPublicBinary)
	for i := range s.Apt.Sources {
		s.Apt.Sources[i].SignedBy = keyring
	}
	s.Apt.Sources[2].SignedBy = f.write(t, "kubernetes.asc", pgpPublicArmored)
	s.Signing.RepoKeyFile = f.write(t, "repo.asc", pgpSecretArmored)
	s.Signing.BundleKeyFile = f.write(t, "bundle.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	s.Registries.Auth.DockerConfigFile = f.write(t, "config.json", []byte(`{"auths": {"quay.io": {"auth": "dTpw"}}}`))
	corp := s.Registries.Hosts[corpHost]
	corp.CAFile = f.write(t, "ca.pem", selfSignedPEM(t))
	corp.Auth.DockerConfigFile = f.write(t, "corp.json", []byte(`{"credsStore": "pass"}`))
	s.Registries.Hosts[corpHost] = corp
	f.s = s
	return f
}

func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "corp ca"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestCheckFiles(t *testing.T) {
	caPath := "registries.hosts[" + corpHost + "].caFile"
	tests := []struct {
		name   string
		mutate func(t *testing.T, f *fileFixture)
		path   string // "" for no error
		msg    string
	}{
		{"all files present and well-formed", func(t *testing.T, f *fileFixture) {}, "", ""},
		{"legacy and new packet formats", func(t *testing.T, f *fileFixture) {
			f.s.Signing.RepoKeyFile = f.write(t, "repo.gpg", pgpSecretLegacy)
			f.s.Apt.Sources[1].SignedBy = f.write(t, "new.gpg", []byte{0xc6, 0x33, 0x04})
		}, "", ""},
		{"Debian's archive keyring", func(t *testing.T, f *fileFixture) {
			if _, err := os.Stat(debianKeyring); err != nil {
				t.Skipf("LOUD SKIP: %s is missing (install debian-archive-keyring): %v", debianKeyring, err)
			}
			f.s.Apt.Sources[0].SignedBy = debianKeyring
		}, "", ""},
		{"keyring missing", func(t *testing.T, f *fileFixture) { f.s.Apt.Sources[1].SignedBy = filepath.Join(f.dir, "none.gpg") },
			"apt.sources[1].signedBy", "does not exist: create it or fix the path"},
		{"keyring is a directory", func(t *testing.T, f *fileFixture) { f.s.Apt.Sources[1].SignedBy = f.dir },
			"apt.sources[1].signedBy", "is not a regular file"},
		{"keyring empty", func(t *testing.T, f *fileFixture) { f.s.Apt.Sources[1].SignedBy = f.write(t, "empty.gpg", nil) },
			"apt.sources[1].signedBy", "is empty"},
		{"keyring is a private key", func(t *testing.T, f *fileFixture) { f.s.Apt.Sources[1].SignedBy = f.write(t, "sec.gpg", pgpSecretNew) },
			"apt.sources[1].signedBy", "holds an OpenPGP private key: name the public keyring"},
		{"keyring is a keybox", func(t *testing.T, f *fileFixture) { f.s.Apt.Sources[1].SignedBy = f.write(t, "pubring.kbx", keybox) },
			"apt.sources[1].signedBy", "is a GnuPG keybox, which apt cannot read"},
		{"keyring is text", func(t *testing.T, f *fileFixture) {
			f.s.Apt.Sources[1].SignedBy = f.write(t, "k.txt", []byte("hello\n"))
		},
			"apt.sources[1].signedBy", "is not an OpenPGP keyring"},
		{"keyring path through a file", func(t *testing.T, f *fileFixture) {
			f.s.Apt.Sources[1].SignedBy = filepath.Join(f.s.Apt.Sources[0].SignedBy, "k.gpg")
		}, "apt.sources[1].signedBy", "cannot be read"},
		{"repo key is public", func(t *testing.T, f *fileFixture) { f.s.Signing.RepoKeyFile = f.write(t, "pub.asc", pgpPublicArmored) },
			"signing.repoKeyFile", "holds an OpenPGP public key: name the private key"},
		{"repo key is not OpenPGP", func(t *testing.T, f *fileFixture) { f.s.Signing.RepoKeyFile = f.write(t, "x.pem", selfSignedPEM(t)) },
			"signing.repoKeyFile", "is not an OpenPGP private key"},
		{"bundle key missing", func(t *testing.T, f *fileFixture) { f.s.Signing.BundleKeyFile = filepath.Join(f.dir, "none.pem") },
			"signing.bundleKeyFile", "does not exist"},
		{"bundle key not PEM", func(t *testing.T, f *fileFixture) { f.s.Signing.BundleKeyFile = f.write(t, "k.bin", pgpSecretNew) },
			"signing.bundleKeyFile", "is not a PEM file"},
		{"bundle key encrypted", func(t *testing.T, f *fileFixture) {
			f.s.Signing.BundleKeyFile = f.write(t, "enc.pem", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}))
		}, "signing.bundleKeyFile", "is encrypted"},
		{"bundle key is a certificate", func(t *testing.T, f *fileFixture) { f.s.Signing.BundleKeyFile = f.write(t, "c.pem", selfSignedPEM(t)) },
			"signing.bundleKeyFile", `holds a "CERTIFICATE" PEM block`},
		{"bundle key is ECDSA", func(t *testing.T, f *fileFixture) {
			k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			der, err := x509.MarshalPKCS8PrivateKey(k)
			if err != nil {
				t.Fatal(err)
			}
			f.s.Signing.BundleKeyFile = f.write(t, "ec.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
		}, "signing.bundleKeyFile", "*ecdsa.PrivateKey, not an ed25519 key"},
		{"bundle key garbage PKCS#8", func(t *testing.T, f *fileFixture) {
			f.s.Signing.BundleKeyFile = f.write(t, "g.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2}}))
		}, "signing.bundleKeyFile", "is not a PKCS#8 private key"},
		{"CA file without certificate", func(t *testing.T, f *fileFixture) {
			r := f.s.Registries.Hosts[corpHost]
			r.CAFile = f.write(t, "notca.pem", []byte("hello\n"))
			f.s.Registries.Hosts[corpHost] = r
		}, caPath, "holds no PEM certificate"},
		{"docker config not JSON", func(t *testing.T, f *fileFixture) {
			f.s.Registries.Auth.DockerConfigFile = f.write(t, "config.txt", []byte("auths: {}\n"))
		}, "registries.auth.dockerConfigFile", "is not a Docker config.json"},
		{"docker config a JSON list", func(t *testing.T, f *fileFixture) {
			f.s.Registries.Auth.DockerConfigFile = f.write(t, "list.json", []byte("[]"))
		}, "registries.auth.dockerConfigFile", "is not a Docker config.json"},
		{"docker config auths not an object", func(t *testing.T, f *fileFixture) {
			r := f.s.Registries.Hosts[corpHost]
			r.Auth.DockerConfigFile = f.write(t, "bad-auths.json", []byte(`{"auths": ["quay.io"]}`))
			f.s.Registries.Hosts[corpHost] = r
		}, "registries.hosts[" + corpHost + "].auth.dockerConfigFile", `"auths" is not a JSON object`},
		{"docker config too large", func(t *testing.T, f *fileFixture) {
			f.s.Registries.Auth.DockerConfigFile = f.write(t, "huge.json", []byte("{"+strings.Repeat(" ", maxReferencedFile)+"}"))
		}, "registries.auth.dockerConfigFile", "is larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFileFixture(t)
			tt.mutate(t, f)
			errs := Validate(f.s, ValidateOptions{CheckFiles: true})
			switch {
			case tt.path == "":
				if len(errs) > 0 {
					t.Fatalf("errors:\n%v", errs)
				}
			default:
				if len(errs) != 1 || errs[0].Path != tt.path || !strings.Contains(errs[0].Msg, tt.msg) {
					t.Fatalf("want one error at %s containing %q; got:\n%v", tt.path, tt.msg, errs)
				}
			}
			// Without CheckFiles the same specification never fails on file contents.
			if errs := Validate(f.s, ValidateOptions{}); len(errs) > 0 {
				t.Errorf("without CheckFiles: %v", errs)
			}
		})
	}
}

// TestCheckFilesOnExample: the Example names files that do not exist here; CheckFiles reports each,
// with its path.
func TestCheckFilesOnExample(t *testing.T) {
	s := Example()
	s.Apt.Sources[0].SignedBy = "/nonexistent/debian.gpg"
	s.Apt.Sources[1].SignedBy = "/nonexistent/debian.gpg"
	s.Apt.Sources[2].SignedBy = "/nonexistent/k8s.gpg"
	s.Registries.Auth.DockerConfigFile = "/nonexistent/config.json"
	s.Signing = Signing{RepoKeyFile: "/nonexistent/repo.asc", BundleKeyFile: "/nonexistent/bundle.pem"}
	r := s.Registries.Hosts[corpHost]
	r.CAFile, r.Auth.DockerConfigFile = "/nonexistent/ca.pem", "/nonexistent/corp.json"
	s.Registries.Hosts[corpHost] = r
	errs := Validate(s, ValidateOptions{CheckFiles: true})
	want := []string{
		"apt.sources[0].signedBy", "apt.sources[1].signedBy", "apt.sources[2].signedBy",
		"registries.auth.dockerConfigFile",
		"registries.hosts[" + corpHost + "].auth.dockerConfigFile", "registries.hosts[" + corpHost + "].caFile",
		"signing.bundleKeyFile", "signing.repoKeyFile",
	}
	if got := errPaths(errs); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("error paths = %q, want %q:\n%v", got, want, errs)
	}
	for _, e := range errs {
		if !strings.Contains(e.Msg, "does not exist") {
			t.Errorf("%v: want \"does not exist\"", e)
		}
	}
}
