package escrow

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"filippo.io/age"

	"github.com/airgap-appliance/appliance/pkg/kubeapi"
)

// Where the escrow lives in the cluster: one Opaque Secret, one key. kube-system, because reading
// it takes the rights of a cluster admin already (who could read every other Secret anyway), and
// the blob is encrypted to the operator's recipients, never to anything the cluster holds.
const (
	SecretNamespace = "kube-system"
	SecretName      = "appliance-state-escrow"
	// SecretKey holds the age-encrypted escrow (binary age format, base64 in the API as every
	// Secret's data).
	SecretKey = "escrow.age"
	// MaxSecretBytes is the most a Secret's data may hold: the API server refuses larger ones
	// (validation's MaxSecretSize, 1 MiB).
	MaxSecretBytes = 1 << 20
)

// The Secret's annotations: public facts about the escrow, so that it can be compared and listed
// without a key.
const (
	// AnnotationClusterCA is Manifest.ClusterCAPin.
	AnnotationClusterCA = "appliance.airgap.dev/escrow-cluster-ca"
	// AnnotationCreated is Manifest.Created, RFC 3339.
	AnnotationCreated = "appliance.airgap.dev/escrow-created"
	// AnnotationContentDigest is Manifest.ContentDigest.
	AnnotationContentDigest = "appliance.airgap.dev/escrow-content-digest"
	// AnnotationRecipients is RecipientsDigest of the recipients it was sealed to.
	AnnotationRecipients = "appliance.airgap.dev/escrow-recipients"
	// AnnotationApplianceVersion is Manifest.ApplianceVersion.
	AnnotationApplianceVersion = "appliance.airgap.dev/escrow-appliance-version"
)

// Stored is the escrow Secret as the cluster holds it.
type Stored struct {
	// Blob is the sealed escrow (Open it with an identity).
	Blob []byte
	// ClusterCAPin, ContentDigest, RecipientsDigest, ApplianceVersion and Created are the
	// annotations (unauthenticated: Open checks the blob itself).
	ClusterCAPin, ContentDigest, RecipientsDigest, ApplianceVersion string
	Created                                                         time.Time
	// ResourceVersion is the Secret's, for an update.
	ResourceVersion string
}

// secret is the part of a core/v1 Secret written and read here.
type secret struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		Labels          map[string]string `json:"labels,omitempty"`
		Annotations     map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Type string            `json:"type"`
	Data map[string][]byte `json:"data"`
}

const secretsPath = "/api/v1/namespaces/" + SecretNamespace + "/secrets"

// Fetch reads the escrow Secret. ErrNoEscrow when there is none; an error when it is there but holds
// no escrow (another tool's Secret under that name).
func Fetch(ctx context.Context, c *kubeapi.Client) (*Stored, error) {
	b, err := c.Do(ctx, http.MethodGet, secretsPath+"/"+SecretName, nil)
	if errors.Is(err, kubeapi.ErrNotFound) {
		return nil, fmt.Errorf("%w (%s/%s)", ErrNoEscrow, SecretNamespace, SecretName)
	}
	if err != nil {
		return nil, fmt.Errorf("read the escrow Secret: %w", err)
	}
	var s secret
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read the escrow Secret %s/%s: %w", SecretNamespace, SecretName, err)
	}
	blob, ok := s.Data[SecretKey]
	if !ok || len(blob) == 0 {
		return nil, fmt.Errorf("the Secret %s/%s holds no %s: it is not the appliance's escrow; move it away", SecretNamespace, SecretName, SecretKey)
	}
	a := s.Metadata.Annotations
	st := &Stored{Blob: blob, ClusterCAPin: a[AnnotationClusterCA], ContentDigest: a[AnnotationContentDigest],
		RecipientsDigest: a[AnnotationRecipients], ApplianceVersion: a[AnnotationApplianceVersion], ResourceVersion: s.Metadata.ResourceVersion}
	st.Created, _ = time.Parse(time.RFC3339, a[AnnotationCreated])
	return st, nil
}

// Result is what Refresh did.
type Result struct {
	// Changed: the Secret was created or replaced.
	Changed bool
	// Manifest is the escrowed state's (sealed now, or the one the Secret already holds).
	Manifest *Manifest
	// Size is the sealed escrow's size in bytes when Changed.
	Size int
	// Detail is one line for people, e.g. "sealed 23 files (14 KiB) to 2 recipients into
	// kube-system/appliance-state-escrow".
	Detail string
}

// Refresh makes the cluster's escrow Secret hold stateDir's state sealed to recipients. It seals
// and writes only when something changed: the escrowed files (Manifest.ContentDigest), the
// recipients (RecipientsDigest, and for a passphrase whether it opens the stored escrow: a changed
// passphrase has the same digest), so reruns leave the Secret alone. It refuses a state without a
// cluster CA, a Secret that holds the escrow of another cluster CA (ErrOtherCluster: the kubeconfig
// points at another cluster, or someone stored it there), and an escrow over MaxSecretBytes
// (ErrTooLarge). A concurrent writer makes it fail with kubeapi.ErrConflict; a rerun resolves it.
func Refresh(ctx context.Context, c *kubeapi.Client, stateDir string, recipients []Recipient, info Info) (Result, error) {
	cur, res, err := check(ctx, c, stateDir, recipients, info)
	if err != nil || !res.Changed {
		return res, err
	}
	rdigest, why := RecipientsDigest(recipients), res.Detail
	blob, m, err := Seal(stateDir, recipients, info)
	if err != nil {
		return Result{}, err
	}
	if len(blob) > MaxSecretBytes {
		return Result{}, fmt.Errorf("escrow: %w: the sealed state is %d bytes, but a Secret holds at most %d (1 MiB); its largest files: %s", ErrTooLarge, len(blob), MaxSecretBytes, largest(m, 3))
	}
	var s secret
	s.APIVersion, s.Kind, s.Type = "v1", "Secret", "Opaque"
	s.Metadata.Name, s.Metadata.Namespace = SecretName, SecretNamespace
	s.Metadata.Labels = map[string]string{"app.kubernetes.io/name": SecretName, "app.kubernetes.io/part-of": "airgap-appliance"}
	s.Metadata.Annotations = map[string]string{
		AnnotationClusterCA:        m.ClusterCAPin,
		AnnotationCreated:          m.Created.UTC().Format(time.RFC3339),
		AnnotationContentDigest:    m.ContentDigest,
		AnnotationRecipients:       rdigest,
		AnnotationApplianceVersion: m.ApplianceVersion,
	}
	s.Data = map[string][]byte{SecretKey: blob}
	method, path, verb := http.MethodPost, secretsPath, "created"
	if cur != nil {
		s.Metadata.ResourceVersion = cur.ResourceVersion
		method, path, verb = http.MethodPut, secretsPath+"/"+SecretName, "replaced"
	}
	body, err := json.Marshal(s)
	if err != nil {
		return Result{}, err
	}
	if _, err := c.Do(ctx, method, path, body); err != nil {
		return Result{}, fmt.Errorf("escrow: write the Secret %s/%s: %w", SecretNamespace, SecretName, err)
	}
	return Result{Changed: true, Manifest: m, Size: len(blob), Detail: fmt.Sprintf("sealed %d files (%s) to %s, %s %s/%s (%s)",
		len(m.Files), kib(len(blob)), describe(recipients), verb, SecretNamespace, SecretName, why)}, nil
}

// Check is Refresh's decision without the writing, for a dry run: Result.Changed says whether
// Refresh would seal and write, Detail what it would do.
func Check(ctx context.Context, c *kubeapi.Client, stateDir string, recipients []Recipient, info Info) (Result, error) {
	_, res, err := check(ctx, c, stateDir, recipients, info)
	if err == nil && res.Changed {
		res.Detail = fmt.Sprintf("would seal %d files to %s into %s/%s (%s)", len(res.Manifest.Files), describe(recipients), SecretNamespace, SecretName, res.Detail)
	}
	return res, err
}

// check reads the state and the Secret and decides: the current Secret (nil when there is none)
// and a Result whose Changed says a refresh must write, its Detail why (or, unchanged, the line
// Refresh reports).
func check(ctx context.Context, c *kubeapi.Client, stateDir string, recipients []Recipient, info Info) (*Stored, Result, error) {
	if _, err := checkRecipients(recipients); err != nil {
		return nil, Result{}, err
	}
	m, err := Inspect(stateDir, info)
	if err != nil {
		return nil, Result{}, err
	}
	if m.ClusterCAPin == "" {
		return nil, Result{}, fmt.Errorf("escrow: %s holds no cluster CA: the escrow is kept in the cluster, so it needs one (kubernetes.enabled)", stateDir)
	}
	cur, err := Fetch(ctx, c)
	switch {
	case errors.Is(err, ErrNoEscrow):
		return nil, Result{Changed: true, Manifest: m, Detail: "the cluster holds none yet"}, nil
	case err != nil:
		return nil, Result{}, err
	}
	if cur.ClusterCAPin != "" && cur.ClusterCAPin != m.ClusterCAPin {
		return nil, Result{}, fmt.Errorf("%w: the Secret %s/%s holds the escrow of cluster CA %s, this appliance's cluster CA is %s: the admin kubeconfig reaches another cluster, or the Secret was copied here; delete it if it is stale",
			ErrOtherCluster, SecretNamespace, SecretName, cur.ClusterCAPin, m.ClusterCAPin)
	}
	switch {
	case cur.ContentDigest != m.ContentDigest:
		return cur, Result{Changed: true, Manifest: m, Detail: "the state changed"}, nil
	case cur.RecipientsDigest != RecipientsDigest(recipients):
		return cur, Result{Changed: true, Manifest: m, Detail: "the recipients changed"}, nil
	case !passphraseOpens(cur.Blob, recipients):
		return cur, Result{Changed: true, Manifest: m, Detail: "the passphrase changed"}, nil
	}
	m.Created, m.ApplianceVersion = cur.Created, cur.ApplianceVersion
	return cur, Result{Manifest: m, Detail: fmt.Sprintf("escrow unchanged (%d files, sealed %s)", len(m.Files), cur.Created.UTC().Format(time.RFC3339))}, nil
}

// passphraseOpens reports whether every passphrase recipient among rs opens blob's header (one
// scrypt run at the blob's work factor); true when there is none.
func passphraseOpens(blob []byte, rs []Recipient) bool {
	for _, r := range rs {
		if !r.IsPassphrase() {
			continue
		}
		hdr, err := age.ExtractHeader(bytes.NewReader(blob))
		if err != nil {
			return false
		}
		id, err := age.NewScryptIdentity(r.pass)
		if err != nil {
			return false
		}
		if _, err := age.DecryptHeader(hdr, id); err != nil {
			return false
		}
	}
	return true
}

// describe says for people whom an escrow is sealed to.
func describe(rs []Recipient) string {
	if len(rs) == 1 && rs[0].IsPassphrase() {
		return "the passphrase"
	}
	if len(rs) == 1 {
		return "1 recipient"
	}
	return fmt.Sprintf("%d recipients", len(rs))
}

// largest names the n largest files of m with their sizes.
func largest(m *Manifest, n int) string {
	fs := slices.Clone(m.Files)
	slices.SortStableFunc(fs, func(a, b File) int { return cmp.Compare(b.Size, a.Size) })
	var out []string
	for _, f := range fs[:min(n, len(fs))] {
		out = append(out, fmt.Sprintf("%s (%s)", f.Path, kib(int(f.Size))))
	}
	return strings.Join(out, ", ")
}

func kib(n int) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%d KiB", (n+1023)/1024)
}
