package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/kubetest"
)

// startClusterAPI runs a real etcd and kube-apiserver (test/kubetest) until the test ends: its CA is
// the cluster CA (as kubeadm's), bootstrap token authentication is on and every authenticated
// request is allowed (no kubeadm RBAC here).
func startClusterAPI(t *testing.T) *kubetest.APIServer {
	t.Helper()
	return kubetest.StartAPIServer(t, kubetest.Options{AuthorizationMode: "AlwaysAllow", BootstrapTokenAuth: true})
}

// TestEnsureJoinToken: against a real kube-apiserver, the power phase's join-token check does
// nothing before the cluster exists (kubeadm init makes the token), leaves the token to the first
// control plane while another control plane has yet to join, creates the renewed token's
// Secret once the control planes are done (a dry run only says it would), in the format the
// API server's bootstrap token authenticator accepts (the token authenticates as
// system:bootstrap:<id> with kubeadm's node group), and finds it there on the next run. After the
// init node cp1's removal it follows the plan's kubeadm leader cp2 (the cluster exists once cp2's
// kubeadm step is done; a renewed token is left to cp2 while cp4 has yet to join). Without it a
// day-2 node joined only once the first control plane's hostagent resynced (w2's kubeadm join took
// 55.8 s against w1's 6.0 s in the e2e).
func TestEnsureJoinToken(t *testing.T) {
	now := time.Now()
	api := startClusterAPI(t)
	ca, apiPort := api.CA, api.Port
	ctx := context.Background()

	cfg := config.Example()
	cfg.APIServer.VIP = netip.MustParseAddr("127.0.0.1")
	cfg.APIServer.Port = uint16(apiPort)
	secrets, _, err := pki.EnsureKubeadmSecrets(t.TempDir(), pki.BootstrapTokenTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	st := &State{Config: cfg, StateDir: t.TempDir(), Kubeadm: secrets}
	if _, err := ensureAdminKubeconfig(st, ca, now); err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(secrets.BootstrapToken, ".")
	init := cfg.ControlPlaneNodes()[0].Name

	if d, ch, err := ensureJoinToken(ctx, st); d != "" || ch || err != nil {
		t.Errorf("before %s ran kubeadm init: %q %v %v, want nothing", init, d, ch, err)
	}
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	kubeadmDone := func(node string) {
		t.Helper()
		if _, _, err := store.Record(node, []string{agentapi.StepConfig, agentapi.StepKubeadm, agentapi.StepReady},
			agentapi.Report{BootID: "boot-" + node, Step: agentapi.StepKubeadm, Status: agentapi.StatusDone, Detail: "kubeadm done in 10.0s"}); err != nil {
			t.Fatal(err)
		}
	}
	kubeadmDone(init)
	// The workers' own tokens are created at once (they need no certificates); cp2 has yet to
	// join: it needs the certificates cp1 re-uploads under the new key before the token, so the
	// control planes' token is left to cp1.
	expires := secrets.Expires(pki.BootstrapTokenTTL).UTC().Format(time.RFC3339)
	w1, _, _ := strings.Cut(secrets.NodeBootstrapToken("w1"), ".")
	w2, _, _ := strings.Cut(secrets.NodeBootstrapToken("w2"), ".")
	workers := "created worker w1's join token " + w1 + " in the cluster (expires " + expires + "); created worker w2's join token " + w2 + " in the cluster (expires " + expires + "); "
	if d, ch, err := ensureJoinToken(ctx, st); d != workers+"join token "+id+" not in the cluster yet: cp1 creates it at its next resync, with the certificates control plane cp2 joins with" || !ch || err != nil {
		t.Errorf("with cp2 still to join: %q %v %v", d, ch, err)
	}
	kubeadmDone("cp2")
	kubeadmDone("cp3")
	// The workers have joined: their tokens are not looked at again.
	kubeadmDone("w1")
	kubeadmDone("w2")

	st.Options.DryRun = true
	if d, ch, err := ensureJoinToken(ctx, st); !strings.HasPrefix(d, "would create join token "+id+" in the cluster (expires ") || !ch || err != nil {
		t.Errorf("dry run: %q %v %v", d, ch, err)
	}
	c, err := kubeapi.Load(statedir.AdminKubeconfig(st.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	secretPath := "/api/v1/namespaces/kube-system/secrets/bootstrap-token-" + id
	if _, err := c.Do(ctx, http.MethodGet, secretPath, nil); err == nil {
		t.Errorf("the dry run created the token")
	}

	st.Options.DryRun = false
	want := "created join token " + id + " in the cluster (expires " + expires + ")"
	if d, ch, err := ensureJoinToken(ctx, st); d != want || !ch || err != nil {
		t.Errorf("ensureJoinToken: %q %v %v, want %q", d, ch, err, want)
	}
	// The API server authenticates the token from that Secret (bootstrap token authenticator); curl
	// presents no client certificate, only the token.
	b, err := exec.CommandContext(ctx, "curl", "-sfS", "--cacert", api.CAFile,
		"-H", "Authorization: Bearer "+secrets.BootstrapToken, "-H", "Content-Type: application/json",
		"-d", `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`,
		fmt.Sprintf("https://127.0.0.1:%d/apis/authentication.k8s.io/v1/selfsubjectreviews", apiPort)).CombinedOutput()
	var review struct {
		Status struct {
			UserInfo struct {
				Username string   `json:"username"`
				Groups   []string `json:"groups"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err != nil || json.Unmarshal(b, &review) != nil {
		t.Fatalf("SelfSubjectReview with the token: %v %s", err, b)
	}
	if u := review.Status.UserInfo; u.Username != "system:bootstrap:"+id || !slices.Contains(u.Groups, kubeadmNodeTokenGroup) {
		t.Errorf("the token authenticates as %q %v, want system:bootstrap:%s in %s", u.Username, u.Groups, id, kubeadmNodeTokenGroup)
	}
	// A worker's own token authenticates as its own bootstrap user.
	b, err = exec.CommandContext(ctx, "curl", "-sfS", "--cacert", api.CAFile,
		"-H", "Authorization: Bearer "+secrets.NodeBootstrapToken("w1"), "-H", "Content-Type: application/json",
		"-d", `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`,
		fmt.Sprintf("https://127.0.0.1:%d/apis/authentication.k8s.io/v1/selfsubjectreviews", apiPort)).CombinedOutput()
	if err != nil || json.Unmarshal(b, &review) != nil || review.Status.UserInfo.Username != "system:bootstrap:"+w1 {
		t.Errorf("w1's own token: %v %s, want system:bootstrap:%s", err, b, w1)
	}

	if d, ch, err := ensureJoinToken(ctx, st); d != "join token "+id+" in the cluster" || ch || err != nil {
		t.Errorf("rerun: %q %v %v, want it found unchanged", d, ch, err)
	}

	// The init node cp1 removed, cp4 appended, the join secrets renewed: the render's plan makes
	// cp2 (the first control plane that joined) the leader, so the check waits for cp2's kubeadm
	// step, not cp1's, and leaves the renewed token to cp2 while cp4 has yet to join.
	st.Config.Nodes = slices.DeleteFunc(slices.Clone(st.Config.Nodes), func(n config.Node) bool { return n.Name == init })
	cp4 := st.Config.ControlPlaneNodes()[0]
	cp4.Name, cp4.Addresses = "cp4", []netip.Addr{netip.MustParseAddr("10.100.0.14"), netip.MustParseAddr("10.200.0.14")}
	st.Config.Nodes = append(st.Config.Nodes, cp4)
	renewed, _, err := pki.EnsureKubeadmSecrets(t.TempDir(), pki.BootstrapTokenTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	st.Kubeadm = renewed
	id2, _, _ := strings.Cut(renewed.BootstrapToken, ".")
	joined := map[string]string{}
	for _, n := range st.Config.Nodes {
		if n.Name != "cp4" {
			joined[n.Name] = map[bool]string{true: agentapi.ActionJoinControlPlane, false: agentapi.ActionJoin}[n.HasRole(config.RoleControlPlane)]
		}
	}
	st.Plan, err = plan.Build(plan.Inputs{Config: st.Config, CA: ca, ApplianceURL: "https://10.100.0.2:8443",
		ControlPlane: netresolve.Address{Interface: "eth0", Prefix: netip.MustParsePrefix("10.100.0.2/24"), CIDR: netip.MustParsePrefix("10.100.0.0/24")},
		Cluster:      &plan.ClusterSecrets{CA: ca, Kubeadm: renewed, Joined: joined}, HostagentSHA256: strings.Repeat("0", 64)})
	if err != nil {
		t.Fatal(err)
	}
	if leader := st.Plan.JoinSecretsRenewer(); leader != "cp2" {
		t.Fatalf("the plan's renewer after cp1's removal: %q, want cp2", leader)
	}
	// cp2 rebooted: a new boot starts its step list anew, kubeadm not reported yet.
	if _, _, err := store.Record("cp2", []string{agentapi.StepConfig, agentapi.StepKubeadm, agentapi.StepReady},
		agentapi.Report{BootID: "boot-2", Step: agentapi.StepConfig, Status: agentapi.StatusRunning}); err != nil {
		t.Fatal(err)
	}
	if d, ch, err := ensureJoinToken(ctx, st); d != "" || ch || err != nil {
		t.Errorf("cp2's kubeadm step not reported done: %q %v %v, want nothing (its kubeadm step tells the cluster exists)", d, ch, err)
	}
	kubeadmDone("cp2")
	if d, ch, err := ensureJoinToken(ctx, st); d != "join token "+id2+" not in the cluster yet: cp2 creates it at its next resync, with the certificates control plane cp4 joins with" || ch || err != nil {
		t.Errorf("with cp4 still to join: %q %v %v", d, ch, err)
	}
	kubeadmDone("cp4")
	if d, ch, err := ensureJoinToken(ctx, st); !strings.HasPrefix(d, "created join token "+id2+" in the cluster") || !ch || err != nil {
		t.Errorf("after cp1's removal, every control plane joined: %q %v %v", d, ch, err)
	}
}
