package csrapprove

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/airgap-appliance/appliance/test/logbuf"
)

// createCSR creates a CSR through the API as the given client (a node's credentials, so the API
// server records the node as requestor, as it does for a kubelet).
func createCSR(t *testing.T, c kubernetes.Interface, name, signer string, usages []string, req []byte) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	obj := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       certificatesv1.CertificateSigningRequestSpec{SignerName: signer, Request: req},
	}
	for _, u := range usages {
		obj.Spec.Usages = append(obj.Spec.Usages, certificatesv1.KeyUsage(u))
	}
	got, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CSR %s: %v", name, err)
	}
	return got
}

func findCondition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

var servingUsages = []string{UsageDigitalSignature, UsageKeyEncipherment, UsageServerAuth}

// syncBuffer is a log sink safe for concurrent writers (test/logbuf).
type syncBuffer = logbuf.Buffer

// TestApproverAgainstAPIServer runs the approver against a real kube-apiserver + etcd (v1.37.2
// fixture). CSRs are created with node client certificates (CN=system:node:NAME, O=system:nodes), so
// the API server itself records the requestor, as for a real kubelet. It proves: the inventory
// node's serving CSR is Approved (AutoApproved); one with a foreign IP SAN and one from a node that
// is not in the inventory are Denied (AutoDenied) with a message naming the mismatch; a client-signer
// CSR is left untouched; a second Sync changes nothing; a 409 on a CSR someone decided meanwhile is
// no error; Run (the informer loop, started by RunWhenReady once the kubeconfig appears) decides a CSR
// created after it started.
func TestApproverAgainstAPIServer(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	admin := c.client(t, "kubernetes-admin", "system:masters")
	cp1 := c.client(t, "system:node:cp1", "system:nodes")
	intruder := c.client(t, "system:node:intruder", "system:nodes")
	inventory := func() (Inventory, error) { return labInventory(), nil }

	createCSR(t, cp1, "cp1-serving", SignerKubeletServing, servingUsages, csrPEM(t, testKey, nil))
	createCSR(t, cp1, "cp1-foreign-ip", SignerKubeletServing, servingUsages, csrPEM(t, testKey, func(r *x509.CertificateRequest) {
		r.IPAddresses = append(r.IPAddresses, net.ParseIP("192.0.2.7"))
	}))
	createCSR(t, intruder, "intruder-serving", SignerKubeletServing, servingUsages, csrPEM(t, testKey, func(r *x509.CertificateRequest) {
		r.Subject.CommonName, r.DNSNames, r.IPAddresses = "system:node:intruder", []string{"intruder"}, []net.IP{net.ParseIP("10.100.0.99")}
	}))
	createCSR(t, cp1, "cp1-client", "kubernetes.io/kube-apiserver-client-kubelet",
		[]string{UsageDigitalSignature, "client auth"}, csrPEM(t, testKey, func(r *x509.CertificateRequest) { r.DNSNames, r.IPAddresses = nil, nil }))

	var logs syncBuffer
	adminConf := filepath.Join(t.TempDir(), "admin.conf")
	c.writeKubeconfig(t, adminConf)
	a, err := New(adminConf, inventory, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	results, err := a.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]Verdict{}
	for _, r := range results {
		if r.Applied {
			applied[r.Name] = r.Decision.Verdict
		}
	}
	if want := map[string]Verdict{"cp1-serving": Approve, "cp1-foreign-ip": Deny, "intruder-serving": Deny}; len(applied) != len(want) ||
		applied["cp1-serving"] != Approve || applied["cp1-foreign-ip"] != Deny || applied["intruder-serving"] != Deny {
		t.Errorf("Sync applied %v, want %v", applied, want)
	}

	get := func(name string) *certificatesv1.CertificateSigningRequest {
		t.Helper()
		csr, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return csr
	}
	expect := []struct {
		name   string
		typ    certificatesv1.RequestConditionType
		reason string
		msg    string
	}{
		{"cp1-serving", certificatesv1.CertificateApproved, "AutoApproved", "inventory node cp1 approved"},
		{"cp1-foreign-ip", certificatesv1.CertificateDenied, "AutoDenied", "IP SAN 192.0.2.7 is not an address of node cp1"},
		{"intruder-serving", certificatesv1.CertificateDenied, "AutoDenied", `node "intruder" is not in the inventory (nodes[])`},
	}
	versions := map[string]string{}
	for _, e := range expect {
		csr := get(e.name)
		versions[e.name] = csr.ResourceVersion
		if len(csr.Status.Conditions) != 1 {
			t.Errorf("%s: conditions %+v, want exactly one %s", e.name, csr.Status.Conditions, e.typ)
			continue
		}
		cond := csr.Status.Conditions[0]
		if cond.Type != e.typ || cond.Reason != e.reason || !strings.Contains(cond.Message, e.msg) {
			t.Errorf("%s: condition %s/%s %q, want %s/%s containing %q", e.name, cond.Type, cond.Reason, cond.Message, e.typ, e.reason, e.msg)
		}
		if !strings.Contains(logs.String(), "csr="+e.name) {
			t.Errorf("no log line for %s:\n%s", e.name, logs.String())
		}
	}
	if client := get("cp1-client"); len(client.Status.Conditions) != 0 {
		t.Errorf("client-signer CSR was touched: %+v", client.Status.Conditions)
	}

	// Rerun: nothing pending for our signer, nothing applied, nothing written.
	again, err := a.Sync(ctx)
	if err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	for _, r := range again {
		if r.Applied {
			t.Errorf("second Sync applied %+v", r)
		}
	}
	for name, rv := range versions {
		if got := get(name).ResourceVersion; got != rv {
			t.Errorf("%s changed on the second Sync (resourceVersion %s → %s)", name, rv, got)
		}
	}

	// A 409: the approver holds a copy read before someone else denied the CSR.
	created := createCSR(t, cp1, "cp1-raced", SignerKubeletServing, servingUsages, csrPEM(t, testKey, nil))
	stale, err := a.api.get(ctx, "cp1-raced")
	if err != nil {
		t.Fatal(err)
	}
	other := created.DeepCopy()
	other.Status.Conditions = append(other.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateDenied, Status: "True", Reason: "ByHand", Message: "an operator denied it first"})
	if _, err := admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, "cp1-raced", other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := a.handle(ctx, stale)
	if err != nil {
		t.Fatalf("a conflict on an already decided CSR is an error: %v", err)
	}
	if r.Applied {
		t.Errorf("handle applied a decision over the operator's: %+v", r)
	}
	if got := get("cp1-raced"); len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Reason != "ByHand" {
		t.Errorf("cp1-raced conditions %+v, want only the operator's denial", got.Status.Conditions)
	}

	// A CSR deleted between read and approval (404) is no error either.
	createCSR(t, cp1, "cp1-deleted", SignerKubeletServing, servingUsages, csrPEM(t, testKey, nil))
	gone, err := a.api.get(ctx, "cp1-deleted")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, "cp1-deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, err := a.handle(ctx, gone); err != nil || r.Applied {
		t.Errorf("handle of a deleted CSR: %+v, %v; want not applied, no error", r, err)
	}

	// The loop: RunWhenReady waits for the kubeconfig, then lists (deciding cp1-before) and watches
	// from that list: cp1-watched, created only after cp1-before was decided, reaches it through
	// the watch (the next list comes after 5 minutes).
	createCSR(t, cp1, "cp1-before", SignerKubeletServing, servingUsages, csrPEM(t, testKey, nil))
	kubeconfig := filepath.Join(t.TempDir(), "admin.conf")
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- RunWhenReady(rctx, kubeconfig, 50*time.Millisecond, inventory, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunWhenReady returned %v after cancel, want nil", err)
		}
	}()
	c.writeKubeconfig(t, kubeconfig)
	waitApproved(t, admin, "cp1-before", nil, &logs)
	waitApproved(t, admin, "cp1-watched", func() {
		createCSR(t, cp1, "cp1-watched", SignerKubeletServing, servingUsages, csrPEM(t, testKey, nil))
	}, &logs)
}

// waitApproved watches CSR name (after running create, when given) until it has a condition, and
// fails unless that is Approved/AutoApproved. The 2-minute deadline only bounds a hang.
func waitApproved(t *testing.T, admin kubernetes.Interface, name string, create func(), logs *syncBuffer) {
	t.Helper()
	w, err := admin.CertificatesV1().CertificateSigningRequests().Watch(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if create != nil {
		create()
	}
	hang := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch of %s closed", name)
			}
			csr, isCSR := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !isCSR || len(csr.Status.Conditions) == 0 {
				continue
			}
			if cond := findCondition(csr, certificatesv1.CertificateApproved); cond == nil || cond.Reason != ReasonApproved {
				t.Fatalf("%s decided %+v, want Approved/AutoApproved", name, csr.Status.Conditions)
			}
			return
		case <-hang:
			t.Fatalf("the running approver did not decide %s; log:\n%s", name, logs.String())
		}
	}
}
