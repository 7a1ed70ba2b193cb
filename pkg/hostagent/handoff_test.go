package hostagent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
)

// TestStepHandoff: on a control plane the handoff step writes the mirror's CA, certificate, key (0600)
// and static pod (the image by digest running cluster-mirror on the port), then reports waiting while
// the mirror's /healthz answers 503 and done once it answers 200; once the appliance names the repo
// URLs it writes them as the apt source, one signed-by line each; a rerun changes nothing.
//
// The mirror here is a stand-in TLS server on 127.0.0.1 answering /healthz only: the real
// `appliance cluster-mirror` is tested in pkg/clustermirror and, as this static pod, in the e2e.
func TestStepHandoff(t *testing.T) {
	caPEM, serving := pkitest.Issue(t, netip.MustParseAddr("127.0.0.1"))
	var synced atomic.Bool
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		if !synced.Load() {
			http.Error(w, "copying: 3 of 9 images", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"synced":true}`))
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{serving}}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	root := t.TempDir()
	a := &Agent{opts: Options{Root: root}}
	m := &agentapi.ClusterMirror{Image: "appliance.local/airgap-appliance/appliance@sha256:" + strings.Repeat("a", 64),
		Port: port, Upstream: "https://10.100.0.2:8443", CertPEM: "CERT", KeyPEM: "KEY",
		Inventory: []agentapi.InventoryNode{{Name: "w1", Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.21")}}}}
	a.nc = agentapi.NodeConfig{Node: "cp1", CAPEM: string(caPEM), Handoff: &agentapi.HandoffConfig{Mirror: m}}
	ctx := context.Background()

	_, err = a.stepHandoff(ctx)
	var w *waitError
	if !errors.As(err, &w) || !strings.Contains(err.Error(), "copying: 3 of 9 images") {
		t.Fatalf("while the mirror copies: %v, want a wait with its answer", err)
	}
	if st, err := os.Stat(filepath.Join(root, ClusterMirrorConfigDir, "tls.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mirror key: %v %v, want 0600", st, err)
	}
	if inv, err := os.ReadFile(filepath.Join(root, ClusterMirrorConfigDir, "inventory.json")); err != nil || !strings.Contains(string(inv), `"name": "w1"`) || !strings.Contains(string(inv), "10.100.0.21") {
		t.Errorf("approver inventory: %v %s", err, inv)
	}
	var pod struct {
		Spec struct {
			HostNetwork bool `json:"hostNetwork"`
			Containers  []struct {
				Image   string   `json:"image"`
				Command []string `json:"command"`
			} `json:"containers"`
		} `json:"spec"`
	}
	b, err := os.ReadFile(filepath.Join(root, ClusterMirrorManifest))
	if err != nil || json.Unmarshal(b, &pod) != nil || len(pod.Spec.Containers) != 2 {
		t.Fatalf("static pod: %v\n%s", err, b)
	}
	cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
	if !pod.Spec.HostNetwork || pod.Spec.Containers[0].Image != m.Image || !strings.Contains(cmd, "cluster-mirror --upstream https://10.100.0.2:8443") || !strings.Contains(cmd, "--listen :"+itoa(port)) {
		t.Errorf("static pod: hostNetwork %v image %s command %s", pod.Spec.HostNetwork, pod.Spec.Containers[0].Image, cmd)
	}

	if c := pod.Spec.Containers[1]; c.Image != m.Image || !strings.Contains(strings.Join(c.Command, " "), "csr-approve --kubeconfig /etc/kubernetes/admin.conf --inventory "+ClusterMirrorConfigDir+"/inventory.json") {
		t.Errorf("approver container: %+v", c)
	}
	if strings.Contains(cmd, "--images-file") {
		t.Errorf("no digest-only image, yet the mirror is given --images-file: %s", cmd)
	}
	if _, err := os.Stat(filepath.Join(root, ClusterMirrorConfigDir, "images.json")); !os.IsNotExist(err) {
		t.Errorf("no digest-only image, yet images.json was written (%v)", err)
	}
	// With an image the bundle names by digest only, the mirror is told about it in a file.
	m.Images = []string{"registry.k8s.io/etcd@sha256:" + strings.Repeat("b", 64)}
	if _, err := a.stepHandoff(ctx); !errors.As(err, &w) {
		t.Fatalf("while the mirror copies: %v", err)
	}
	b, _ = os.ReadFile(filepath.Join(root, ClusterMirrorManifest))
	if err := json.Unmarshal(b, &pod); err != nil || !strings.Contains(strings.Join(pod.Spec.Containers[0].Command, " "), "--images-file "+ClusterMirrorConfigDir+"/images.json") {
		t.Errorf("the mirror is not given --images-file: %v %v", pod.Spec.Containers[0].Command, err)
	}
	if imgs, err := os.ReadFile(filepath.Join(root, ClusterMirrorConfigDir, "images.json")); err != nil || !strings.Contains(string(imgs), m.Images[0]) {
		t.Errorf("images.json: %v %s", err, imgs)
	}
	synced.Store(true)
	detail, err := a.stepHandoff(ctx)
	if err != nil || !strings.Contains(detail, "in-cluster mirror serving") {
		t.Fatalf("once synced: %q %v", detail, err)
	}
	a.nc.Handoff.RepoURLs = []string{"https://10.100.0.11:5443/repo", "https://10.100.0.12:5443/repo"}
	if detail, err = a.stepHandoff(ctx); err != nil || !strings.Contains(detail, "apt source on 2 in-cluster mirrors") {
		t.Fatalf("switched: %q %v", detail, err)
	}
	src, _ := os.ReadFile(filepath.Join(root, agentapi.AptSourcePath))
	for _, u := range a.nc.Handoff.RepoURLs {
		if !strings.Contains(string(src), "deb [signed-by="+agentapi.RepoKeyringPath+"] "+u+"/debian stable main\n") {
			t.Errorf("apt source lacks %s:\n%s", u, src)
		}
	}
	if detail, err = a.stepHandoff(ctx); err != nil || !strings.HasPrefix(detail, "unchanged") {
		t.Errorf("rerun: %q %v, want unchanged", detail, err)
	}
	a.nc.Handoff.RepoURLs = []string{"http://10.100.0.11/repo"}
	if _, err := a.stepHandoff(ctx); err == nil {
		t.Errorf("a plain-http repo URL was accepted")
	}
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }
