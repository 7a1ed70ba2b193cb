package escrow

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"filippo.io/age"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Expect is what Open checks an escrow against; an empty field is not checked.
type Expect struct {
	// ClusterCAPin is the live cluster's CA pin ("sha256:<hex>", agentapi.PinOf of its CA
	// certificate, as in kubeadm's --discovery-token-ca-cert-hash). Restore requires it.
	ClusterCAPin string
	// ClusterName is bootstrap.yaml's clusterName.
	ClusterName string
}

// Escrow is an opened, checked escrow.
type Escrow struct {
	Manifest Manifest
	files    []stateFile
}

// Paths lists the escrowed files, sorted (relative to the state directory, slash-separated).
func (e *Escrow) Paths() []string {
	out := make([]string, len(e.files))
	for i, f := range e.files {
		out[i] = f.Path
	}
	return out
}

// ReadFile returns the content of the escrowed file p (a path of Paths).
func (e *Escrow) ReadFile(p string) ([]byte, bool) {
	i, ok := slices.BinarySearchFunc(e.files, p, func(f stateFile, p string) int { return strings.Compare(f.Path, p) })
	if !ok {
		return nil, false
	}
	return e.files[i].data, true
}

// Open decrypts blob with the first of identities that fits and checks all of it: the age
// authentication, the manifest, every file's size and SHA-256 against it, that every file is one of
// Contents, the CA pins against the escrowed certificates, and want. Errors wrap ErrWrongIdentity,
// ErrTampered, ErrOtherCluster or ErrTooLarge.
func Open(blob []byte, identities []Identity, want Expect) (*Escrow, error) {
	plain, err := decrypt(blob, identities)
	if err != nil {
		return nil, err
	}
	e, err := unpack(plain)
	if err != nil {
		return nil, err
	}
	m := &e.Manifest
	if want.ClusterCAPin != "" {
		pin, err := agentapi.ParsePin(want.ClusterCAPin)
		if err != nil {
			return nil, fmt.Errorf("the expected cluster CA: %w", err)
		}
		if m.ClusterCAPin != pin {
			have := m.ClusterCAPin
			if have == "" {
				have = "none: it was sealed without Kubernetes"
			}
			return nil, fmt.Errorf("%w: it holds the state of cluster %q (cluster CA %s, sealed %s), but the cluster's CA is %s",
				ErrOtherCluster, m.ClusterName, have, m.Created.Format("2006-01-02 15:04:05Z"), pin)
		}
	}
	if want.ClusterName != "" && m.ClusterName != want.ClusterName {
		return nil, fmt.Errorf("%w: it holds the state of cluster %q, but clusterName is %q", ErrOtherCluster, m.ClusterName, want.ClusterName)
	}
	return e, nil
}

// decrypt is age's half of Open.
func decrypt(blob []byte, identities []Identity) ([]byte, error) {
	if len(identities) == 0 {
		return nil, fmt.Errorf("%w: no identity given (an age key file or the passphrase)", ErrWrongIdentity)
	}
	ids := make([]age.Identity, 0, len(identities))
	for _, id := range identities {
		if id.id == nil {
			return nil, fmt.Errorf("%w: an unset identity", ErrWrongIdentity)
		}
		ids = append(ids, id.id)
	}
	r, err := age.Decrypt(bytes.NewReader(blob), ids...)
	var noMatch *age.NoIdentityMatchError
	switch {
	case errors.As(err, &noMatch):
		return nil, fmt.Errorf("%w: it was sealed to other keys or another passphrase (or its header is damaged)", ErrWrongIdentity)
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrTampered, err)
	}
	// Compression makes the plaintext larger than the blob, but never beyond maxStateBytes plus the
	// tar's headers and the manifest.
	plain, err := io.ReadAll(io.LimitReader(r, maxStateBytes+16<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTampered, err)
	}
	return plain, nil
}

// unpack reads the plaintext tar.gz of an escrow and checks it against its manifest.
func unpack(plain []byte) (*Escrow, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrTampered, fmt.Sprintf(format, a...))
	}
	zr, err := gzip.NewReader(bytes.NewReader(plain))
	if err != nil {
		return nil, bad("not gzip: %v", err)
	}
	tr := tar.NewReader(io.LimitReader(zr, maxStateBytes+16<<20))
	hdr, err := tr.Next()
	if err != nil || hdr.Name != manifestName || hdr.Typeflag != tar.TypeReg || hdr.Size > 16<<20 {
		return nil, bad("the first entry is not %s", manifestName)
	}
	mj, err := io.ReadAll(tr)
	if err != nil {
		return nil, bad("%s: %v", manifestName, err)
	}
	var m Manifest
	if err := json.Unmarshal(mj, &m); err != nil {
		return nil, bad("%s does not parse: %v", manifestName, err)
	}
	if m.Format != FormatVersion {
		return nil, fmt.Errorf("the escrow has format %d, this appliance reads format %d: restore with the appliance version that sealed it (%s) or newer", m.Format, FormatVersion, m.ApplianceVersion)
	}
	if !slices.IsSortedFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) }) {
		return nil, bad("the manifest's files are not sorted")
	}
	e := &Escrow{Manifest: m}
	var total int64
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			if i != len(m.Files) {
				return nil, bad("it holds %d files, its manifest lists %d", i, len(m.Files))
			}
			break
		}
		if err != nil {
			return nil, bad("%v", err)
		}
		if i >= len(m.Files) {
			return nil, bad("%s is not in the manifest", hdr.Name)
		}
		want := m.Files[i]
		p, ok := strings.CutPrefix(hdr.Name, statePrefix)
		switch {
		case !ok || p != want.Path:
			return nil, bad("entry %d is %s, the manifest lists %s", i+1, hdr.Name, want.Path)
		case hdr.Typeflag != tar.TypeReg:
			return nil, bad("%s is not a regular file", p)
		case p != path.Clean(p) || path.IsAbs(p) || hidden(p) || !escrowed(p):
			return nil, bad("%s is not a file the escrow keeps", p)
		case hdr.Size != want.Size:
			return nil, bad("%s has %d bytes, the manifest says %d", p, hdr.Size, want.Size)
		case i > 0 && m.Files[i-1].Path == p:
			return nil, bad("%s appears twice", p)
		}
		if total += hdr.Size; total > maxStateBytes {
			return nil, fmt.Errorf("%w: its files exceed %d MiB", ErrTooLarge, maxStateBytes>>20)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, bad("%s: %v", p, err)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != want.SHA256 {
			return nil, bad("%s does not match its SHA-256 in the manifest", p)
		}
		e.files = append(e.files, stateFile{File: want, data: data})
	}
	if m.digest() != m.ContentDigest {
		return nil, bad("the manifest's content digest does not match its files")
	}
	byPath := map[string][]byte{}
	for _, f := range e.files {
		byPath[f.Path] = f.data
	}
	for _, c := range []struct{ dir, pin string }{
		{filepath.ToSlash(statedir.PKI("")), m.ApplianceCAPin},
		{filepath.ToSlash(statedir.ClusterPKI("")), m.ClusterCAPin},
	} {
		pin, err := caPin(byPath, c.dir, true)
		if err != nil {
			return nil, bad("%v", err)
		}
		if pin != c.pin {
			return nil, bad("the manifest's CA pin for %s does not match the escrowed certificate", c.dir)
		}
	}
	if m.ApplianceCAPin == "" {
		return nil, bad("it holds no appliance CA")
	}
	return e, nil
}

// restorePrefix starts the name of Restore's staging directory inside the target.
const restorePrefix = ".escrow-restore-"

// Restore opens blob (Open, which must find want.ClusterCAPin: a restore is always checked against
// the live cluster) and writes its files into stateDir, which must be empty or missing (an empty
// lost+found, as on a freshly formatted state disk, is allowed): files 0600, directories 0700, each
// written atomically (pkg/atomicfile) into a staging directory inside stateDir whose entries are then
// renamed into place. Every check runs before anything is written; a refusal (ErrNotEmpty, and
// Open's errors) leaves stateDir as it was.
func Restore(blob []byte, identities []Identity, want Expect, stateDir string) (*Manifest, error) {
	if want.ClusterCAPin == "" {
		return nil, errors.New("restore the escrow: the live cluster's CA pin is required, so that a restore never installs another cluster's state")
	}
	if err := checkEmpty(stateDir); err != nil {
		return nil, err
	}
	e, err := Open(blob, identities, want)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("restore the escrow: %w", err)
	}
	if err := checkEmpty(stateDir); err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp(stateDir, restorePrefix)
	if err != nil {
		return nil, fmt.Errorf("restore the escrow: %w", err)
	}
	for _, f := range e.files {
		if _, err := atomicfile.Write(filepath.Join(stage, filepath.FromSlash(f.Path)), f.data, 0o600); err != nil {
			_ = os.RemoveAll(stage)
			return nil, fmt.Errorf("restore the escrow: %w", err)
		}
	}
	tops, err := os.ReadDir(stage)
	if err != nil {
		_ = os.RemoveAll(stage)
		return nil, fmt.Errorf("restore the escrow: %w", err)
	}
	for _, t := range tops {
		if err := os.Rename(filepath.Join(stage, t.Name()), filepath.Join(stateDir, t.Name())); err != nil {
			return nil, fmt.Errorf("restore the escrow: %w (the restore is incomplete: empty %s and run it again)", err, stateDir)
		}
	}
	if err := os.Remove(stage); err != nil {
		return nil, fmt.Errorf("restore the escrow: %w", err)
	}
	if d, err := os.Open(stateDir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	m := e.Manifest
	return &m, nil
}

// checkEmpty refuses a stateDir that holds anything but an empty lost+found; a missing one is fine.
func checkEmpty(stateDir string) error {
	entries, err := os.ReadDir(stateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore the escrow: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() == "lost+found" && e.IsDir() {
			if sub, err := os.ReadDir(filepath.Join(stateDir, e.Name())); err == nil && len(sub) == 0 {
				continue
			}
		}
		names = append(names, e.Name())
	}
	if len(names) == 0 {
		return nil
	}
	hint := "restore into an empty state directory (a new appliance's); never over a live one"
	if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, restorePrefix) }) {
		hint = "an earlier restore was interrupted: empty it and run the restore again"
	}
	if len(names) > 5 {
		names = append(names[:5], "…")
	}
	return fmt.Errorf("%w: %s holds %s: %s", ErrNotEmpty, stateDir, strings.Join(names, ", "), hint)
}
