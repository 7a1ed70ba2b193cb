package escrow

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"filippo.io/age"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/version"
)

// FormatVersion is the escrow format this package writes and reads (Manifest.Format).
const FormatVersion = 1

// Names inside the tar.
const (
	manifestName = "escrow-manifest.json"
	statePrefix  = "state/"
)

// maxStateBytes bounds the escrowed files together (and what Open unpacks): far above a real state
// (a few hundred KiB for hundreds of nodes), far below what would hurt the appliance's memory.
const maxStateBytes = 64 << 20

// Manifest describes an escrow: whose state it is and every file in it. It is the tar's first entry
// and is returned by Seal and Open.
type Manifest struct {
	// Format is FormatVersion.
	Format int `json:"format"`
	// ClusterName is bootstrap.yaml's clusterName when the escrow was sealed.
	ClusterName string `json:"clusterName"`
	// ClusterCAPin is the Kubernetes cluster CA's pin (agentapi.PinOf: "sha256:" + hex SHA-256 of its
	// SubjectPublicKeyInfo, kubeadm's --discovery-token-ca-cert-hash): the identity a restore checks
	// against the live cluster. Empty when the state has no cluster CA (kubernetes.enabled false).
	ClusterCAPin string `json:"clusterCAPin,omitempty"`
	// ApplianceCAPin is the appliance CA's pin, the one the nodes hold.
	ApplianceCAPin string `json:"applianceCAPin"`
	// Created is when the escrow was sealed (UTC, whole seconds).
	Created time.Time `json:"created"`
	// ApplianceVersion is the version of the appliance that sealed it (pkg/version).
	ApplianceVersion string `json:"applianceVersion"`
	// Files are the escrowed files, sorted by path.
	Files []File `json:"files"`
	// ContentDigest is "sha256:<hex>" over the cluster identity and every file's path, size and
	// SHA-256, but not Created, ApplianceVersion or the modes (Restore writes every file 0600): two
	// escrows of the same state have the same ContentDigest, so a refresh that would change nothing
	// is skipped (Refresh), also right after a restore.
	ContentDigest string `json:"contentDigest"`
}

// File is one escrowed file.
type File struct {
	// Path is relative to the state directory, slash-separated (a match of a Contents pattern).
	Path string `json:"path"`
	// Mode is the file's permission bits in the sealed state directory (Restore writes 0600).
	Mode uint32 `json:"mode"`
	Size int64  `json:"size"`
	// SHA256 is the hex SHA-256 of the content.
	SHA256 string `json:"sha256"`
}

// Info is what Seal records besides the files.
type Info struct {
	// ClusterName is bootstrap.yaml's clusterName. Required.
	ClusterName string
	// ApplianceVersion: "" means this build's (version.String()).
	ApplianceVersion string
	// Created: zero means now.
	Created time.Time
}

// digest computes m's ContentDigest from its other fields.
func (m *Manifest) digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "appliance state escrow %d\ncluster %s\nclusterCA %s\napplianceCA %s\n", m.Format, m.ClusterName, m.ClusterCAPin, m.ApplianceCAPin)
	for _, f := range m.Files {
		fmt.Fprintf(h, "%s %d %s\n", f.SHA256, f.Size, f.Path)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// stateFile is one escrowed file read from disk or from an escrow.
type stateFile struct {
	File
	data []byte
}

// Seal reads the Contents of stateDir and returns them as an escrow encrypted to recipients, with
// its manifest. The same state and Info give the same plaintext (the ciphertext differs: age uses a
// fresh file key each time). It refuses a state directory without the appliance CA, a CA whose key
// does not match its certificate, anything but a regular file where Contents expects one, more than
// 64 MiB of state, and recipients that cannot be combined (ErrNoRecipient).
func Seal(stateDir string, recipients []Recipient, info Info) ([]byte, *Manifest, error) {
	ageRecipients, err := checkRecipients(recipients)
	if err != nil {
		return nil, nil, err
	}
	plain, m, err := archive(stateDir, info)
	if err != nil {
		return nil, nil, err
	}
	var out bytes.Buffer
	w, err := age.Encrypt(&out, ageRecipients...)
	if err != nil {
		return nil, nil, fmt.Errorf("seal the escrow: %w", err)
	}
	if _, err := w.Write(plain); err != nil {
		return nil, nil, fmt.Errorf("seal the escrow: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, nil, fmt.Errorf("seal the escrow: %w", err)
	}
	return out.Bytes(), m, nil
}

// Inspect returns the manifest Seal would write for stateDir and info, without encrypting anything:
// Refresh compares its ContentDigest with the escrow's in the cluster.
func Inspect(stateDir string, info Info) (*Manifest, error) {
	_, m, err := collect(stateDir, info)
	return m, err
}

// archive is the plaintext of an escrow: the gzip-compressed, deterministic tar.
func archive(stateDir string, info Info) ([]byte, *Manifest, error) {
	files, m, err := collect(stateDir, info)
	if err != nil {
		return nil, nil, err
	}
	mj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression) // no name, no mtime in its header
	if err != nil {
		return nil, nil, err
	}
	tw := tar.NewWriter(zw)
	add := func(name string, mode uint32, data []byte) error {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     name,
			Mode:     int64(mode),
			Size:     int64(len(data)),
			ModTime:  time.Unix(0, 0),
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add(manifestName, 0o600, append(mj, '\n')); err != nil {
		return nil, nil, fmt.Errorf("escrow archive: %w", err)
	}
	for _, f := range files {
		if err := add(statePrefix+f.Path, f.Mode, f.data); err != nil {
			return nil, nil, fmt.Errorf("escrow archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, fmt.Errorf("escrow archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, nil, fmt.Errorf("escrow archive: %w", err)
	}
	return buf.Bytes(), m, nil
}

// collect reads the Contents of stateDir and builds the manifest.
func collect(stateDir string, info Info) ([]stateFile, *Manifest, error) {
	if info.ClusterName == "" {
		return nil, nil, errors.New("seal the escrow: no cluster name")
	}
	paths := map[string]bool{}
	for _, it := range Contents {
		matches, err := filepath.Glob(filepath.Join(stateDir, filepath.FromSlash(it.Pattern)))
		if err != nil {
			return nil, nil, err
		}
		found := false
		for _, abs := range matches {
			r, err := filepath.Rel(stateDir, abs)
			if err != nil {
				return nil, nil, err
			}
			r = filepath.ToSlash(r)
			if hidden(r) {
				continue // pkg/atomicfile's temporary files, dry-run scratch copies
			}
			paths[r] = true
			found = true
		}
		if it.Required && !found {
			return nil, nil, fmt.Errorf("seal the escrow: %s is missing: run appliance bootstrap (its pki phase makes it) before sealing", filepath.Join(stateDir, filepath.FromSlash(it.Pattern)))
		}
	}
	var (
		files []stateFile
		total int64
	)
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		abs := filepath.Join(stateDir, filepath.FromSlash(p))
		st, err := os.Lstat(abs)
		if err != nil {
			return nil, nil, fmt.Errorf("seal the escrow: %w", err)
		}
		if !st.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("seal the escrow: %s is not a regular file (%s): the state directory holds only regular files there; move it away", abs, st.Mode().Type())
		}
		if total += st.Size(); total > maxStateBytes {
			return nil, nil, fmt.Errorf("seal the escrow: %w: the escrowed files of %s exceed %d MiB", ErrTooLarge, stateDir, maxStateBytes>>20)
		}
		data, err := os.ReadFile(abs)
		if err != nil {
			return nil, nil, fmt.Errorf("seal the escrow: %w", err)
		}
		sum := sha256.Sum256(data)
		files = append(files, stateFile{File: File{Path: p, Mode: uint32(st.Mode().Perm()), Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}, data: data})
	}
	created := info.Created
	if created.IsZero() {
		created = time.Now()
	}
	ver := info.ApplianceVersion
	if ver == "" {
		ver = version.String()
	}
	m := &Manifest{Format: FormatVersion, ClusterName: info.ClusterName, Created: created.UTC().Truncate(time.Second), ApplianceVersion: ver}
	byPath := map[string][]byte{}
	for _, f := range files {
		m.Files = append(m.Files, f.File)
		byPath[f.Path] = f.data
	}
	var err error
	if m.ApplianceCAPin, err = caPin(byPath, filepath.ToSlash(statedir.PKI("")), true); err != nil {
		return nil, nil, fmt.Errorf("seal the escrow: %w", err)
	}
	if m.ClusterCAPin, err = caPin(byPath, filepath.ToSlash(statedir.ClusterPKI("")), true); err != nil {
		return nil, nil, fmt.Errorf("seal the escrow: %w", err)
	}
	m.ContentDigest = m.digest()
	return files, m, nil
}

// caPin returns the pin of dir/ca.crt among files ("" when neither it nor dir/ca.key is there);
// with checkKey, dir/ca.key must be there and match it.
func caPin(files map[string][]byte, dir string, checkKey bool) (string, error) {
	certPath, keyPath := dir+"/"+pki.CACertFile, dir+"/"+pki.CAKeyFile
	certPEM, haveCert := files[certPath]
	keyPEM, haveKey := files[keyPath]
	switch {
	case !haveCert && !haveKey:
		return "", nil
	case !haveCert:
		return "", fmt.Errorf("%s is there without %s", keyPath, certPath)
	case checkKey && !haveKey:
		return "", fmt.Errorf("%s is there without its key %s", certPath, keyPath)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return "", fmt.Errorf("%s holds no PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", certPath, err)
	}
	if checkKey {
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			return "", fmt.Errorf("%s is not the key of %s: restore the pair from a backup", keyPath, certPath)
		}
	}
	return agentapi.PinOf(cert), nil
}

// hidden reports whether an element of the slash-separated path p starts with ".".
func hidden(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if strings.HasPrefix(e, ".") {
			return true
		}
	}
	return false
}
