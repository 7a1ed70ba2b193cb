package escrow

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/kubetest"
)

// TestSecretAgainstAPIServer keeps the escrow in a real kube-apiserver (test/kubetest) whose
// cluster CA is the state's own: created once, left alone by reruns, replaced when a token, the
// recipients or the passphrase change, refused for another cluster's state and when too large
// (the Secret untouched), and read back, opened and restored against the live cluster's CA.
func TestSecretAgainstAPIServer(t *testing.T) {
	state, pin := fakeState(t)
	srv := kubetest.StartAPIServer(t, kubetest.Options{
		PKIDir:          statedir.ClusterPKI(state),
		AdminKubeconfig: filepath.Join(t.TempDir(), "admin.conf"),
	})
	c := srv.Client
	if live := agentapi.PinOf(srv.CA.Cert); live != pin {
		t.Fatalf("the API server's CA %s is not the state's %s", live, pin)
	}
	ctx := context.Background()
	xr, xid := x25519(t)
	xr2, xid2 := x25519(t)
	info := testInfo

	if _, err := Fetch(ctx, c); !errors.Is(err, ErrNoEscrow) {
		t.Fatalf("Fetch before any escrow: %v", err)
	}
	refresh := func(rs []Recipient, wantChanged bool, wantDetail string) *Stored {
		t.Helper()
		info.Created = info.Created.Add(time.Minute) // a later run
		res, err := Refresh(ctx, c, state, rs, info)
		if err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if res.Changed != wantChanged || !strings.Contains(res.Detail, wantDetail) {
			t.Fatalf("Refresh: changed %v (%s), want %v with %q", res.Changed, res.Detail, wantChanged, wantDetail)
		}
		st, err := Fetch(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if st.ContentDigest != res.Manifest.ContentDigest {
			t.Errorf("the Secret's digest %s, the state's %s", st.ContentDigest, res.Manifest.ContentDigest)
		}
		return st
	}

	first := refresh([]Recipient{xr}, true, "to 1 recipient, created kube-system/appliance-state-escrow (the cluster holds none yet)")
	if !strings.Contains(first.ClusterCAPin, pin) || first.RecipientsDigest != RecipientsDigest([]Recipient{xr}) ||
		!first.Created.Equal(testInfo.Created.Add(time.Minute)) || first.ApplianceVersion != "v0.0.0-test" {
		t.Errorf("annotations %+v", first)
	}
	// The Secret as the API holds it: Opaque, one key, labels, no plaintext.
	var raw secret
	if err := json.Unmarshal(mustGet(t, c, secretsPath+"/"+SecretName), &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Type != "Opaque" || len(raw.Data) != 1 || raw.Metadata.Labels["app.kubernetes.io/part-of"] != "airgap-appliance" ||
		bytes.Contains(raw.Data[SecretKey], []byte("PRIVATE KEY")) {
		t.Errorf("Secret: type %q, %d keys, labels %v", raw.Type, len(raw.Data), raw.Metadata.Labels)
	}
	e, err := Open(first.Blob, []Identity{xid}, Expect{ClusterCAPin: agentapi.PinOf(srv.CA.Cert), ClusterName: "lab"})
	if err != nil {
		t.Fatalf("Open the stored escrow: %v", err)
	}
	if got := e.Paths(); len(got) != len(wantPaths) {
		t.Errorf("stored %v", got)
	}

	// A rerun with nothing changed leaves the Secret alone.
	again := refresh([]Recipient{xr}, false, "escrow unchanged (20 files, sealed "+testInfo.Created.Add(time.Minute).Format(time.RFC3339)+")")
	if again.ResourceVersion != first.ResourceVersion {
		t.Errorf("an unchanged rerun wrote the Secret: resourceVersion %s → %s", first.ResourceVersion, again.ResourceVersion)
	}

	if res, err := Check(ctx, c, state, []Recipient{xr}, info); err != nil || res.Changed || !strings.Contains(res.Detail, "escrow unchanged") {
		t.Errorf("Check of an unchanged state: %+v %v", res, err)
	}

	// A rotated token replaces it (a dry run only says so).
	tok, err := pki.RotateNodeToken(statedir.PKI(state), "w1")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := Check(ctx, c, state, []Recipient{xr}, info); err != nil || !res.Changed ||
		res.Detail != "would seal 20 files to 1 recipient into kube-system/appliance-state-escrow (the state changed)" {
		t.Errorf("Check of a changed state: %+v %v", res, err)
	}
	if st, _ := Fetch(ctx, c); st.ResourceVersion != first.ResourceVersion {
		t.Error("Check wrote the Secret")
	}
	rotated := refresh([]Recipient{xr}, true, "replaced kube-system/appliance-state-escrow (the state changed)")
	if rotated.ResourceVersion == first.ResourceVersion {
		t.Error("the Secret was not replaced")
	}
	e, err = Open(rotated.Blob, []Identity{xid}, Expect{ClusterCAPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := e.ReadFile("pki/tokens/w1"); strings.TrimSpace(string(got)) != tok {
		t.Error("the stored escrow does not hold the rotated token")
	}

	// New recipients: resealed, the new key opens it.
	two := refresh([]Recipient{xr, xr2}, true, "to 2 recipients, replaced kube-system/appliance-state-escrow (the recipients changed)")
	if _, err := Open(two.Blob, []Identity{xid2}, Expect{ClusterCAPin: pin}); err != nil {
		t.Errorf("the added key: %v", err)
	}
	refresh([]Recipient{xr2, xr}, false, "escrow unchanged")

	// A passphrase: resealed; the same passphrase again changes nothing; another one reseals.
	pr, pid := passphrase(t, "correct horse battery staple")
	pass1 := refresh([]Recipient{pr}, true, "to the passphrase")
	refresh([]Recipient{pr}, false, "escrow unchanged")
	pr2, pid2 := passphrase(t, "another horse battery staple")
	pass2 := refresh([]Recipient{pr2}, true, "to the passphrase, replaced kube-system/appliance-state-escrow (the passphrase changed)")
	if _, err := Open(pass2.Blob, []Identity{pid}, Expect{ClusterCAPin: pin}); !errors.Is(err, ErrWrongIdentity) {
		t.Errorf("the old passphrase on the new escrow: %v", err)
	}
	if _, err := Open(pass1.Blob, []Identity{pid}, Expect{ClusterCAPin: pin}); err != nil {
		t.Errorf("the old passphrase on the old escrow: %v", err)
	}

	// Another cluster's state is refused; the Secret stays.
	other, _ := fakeState(t)
	if _, err := Refresh(ctx, c, other, []Recipient{xr}, info); !errors.Is(err, ErrOtherCluster) || !strings.Contains(err.Error(), "this appliance's cluster CA is") {
		t.Errorf("Refresh of another cluster's state: %v", err)
	}
	// Too large for a Secret: refused; the Secret stays.
	big := make([]byte, MaxSecretBytes+64<<10)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	hist := filepath.Join(state, "nodes/cp1/history.jsonl")
	if err := os.WriteFile(hist, big, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Refresh(ctx, c, state, []Recipient{pr2}, info)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "a Secret holds at most 1048576 (1 MiB); its largest files: nodes/cp1/history.jsonl (1088 KiB)") {
		t.Errorf("Refresh of a state too large: %v", err)
	}
	if err := os.WriteFile(hist, []byte(`{"event":"added"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := Fetch(ctx, c)
	if err != nil || st.ResourceVersion != pass2.ResourceVersion {
		t.Errorf("a refused refresh changed the Secret: %v %v", st, err)
	}

	// Item 3's read side: fetch, restore into an empty directory against the live cluster's CA.
	target := filepath.Join(t.TempDir(), "new-state")
	if _, err := Restore(st.Blob, []Identity{pid2}, Expect{ClusterCAPin: agentapi.PinOf(srv.CA.Cert)}, target); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if m, err := Inspect(target, testInfo); err != nil || m.ContentDigest != st.ContentDigest {
		t.Errorf("the restored state: %v %v", m, err)
	}

	// Something else under the escrow's name is not an escrow.
	mustDo(t, c, http.MethodDelete, secretsPath+"/"+SecretName, nil)
	mustDo(t, c, http.MethodPost, secretsPath, map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": SecretName}, "type": "Opaque", "data": map[string][]byte{"other": []byte("x")}})
	if _, err := Fetch(ctx, c); err == nil || errors.Is(err, ErrNoEscrow) || !strings.Contains(err.Error(), "holds no escrow.age: it is not the appliance's escrow") {
		t.Errorf("Fetch of a foreign Secret: %v", err)
	}
}

func mustGet(t *testing.T, c *kubeapi.Client, path string) []byte {
	t.Helper()
	return mustDo(t, c, http.MethodGet, path, nil)
}

func mustDo(t *testing.T, c *kubeapi.Client, method, path string, obj any) []byte {
	t.Helper()
	var body []byte
	if obj != nil {
		var err error
		if body, err = json.Marshal(obj); err != nil {
			t.Fatal(err)
		}
	}
	b, err := c.Do(context.Background(), method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return b
}
