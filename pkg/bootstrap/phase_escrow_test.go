package bootstrap

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/escrow"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/kubetest"
)

// A throwaway age key pair (age-keygen) the test escrows to.
const (
	testEscrowRecipient = "age1g75egrjfyf9crvzrmtdyjn8pgkx7406fpjatw345nq5s6l0xwdgswu4wxu"
	testEscrowIdentity  = "AGE-SECRET-KEY-1UK36W5H6LYRKYQY2PU9VH3K3STGV86JS68X7KZ8ZDR9LMXD3DKJQCK50DH"
)

// TestEscrowPhase: off without escrow in the configuration; skipped when converge was skipped and
// the nodes are not ready; against a real kube-apiserver running on the state's cluster CA, it
// creates the escrow Secret, leaves it alone on a rerun, and after a token rotation a dry run says it
// would reseal without writing, the next run reseals; what it stored opens with the operator's key
// and matches the live cluster's CA.
func TestEscrowPhase(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	stateDir := t.TempDir()
	cfg := config.Example()
	st := &State{Config: cfg, StateDir: stateDir, Options: Options{Now: time.Now}}

	if res, err := (escrowPhase{}).Run(ctx, st); err != nil || res.Changed || res.Detail != "off (bootstrap.yaml escrow is not set): the state lives only in "+stateDir {
		t.Errorf("without escrow: %+v %v", res, err)
	}
	cfg.Escrow.Recipients = []string{testEscrowRecipient}
	st.Options.SkipPhases = []string{"converge"}
	if res, err := (escrowPhase{}).Run(ctx, st); err != nil || !strings.HasPrefix(res.Skipped, "needs converge, which --skip-phases skipped; 5 of 5 nodes not ready") ||
		!strings.Contains(res.Skipped, "escrow not refreshed") {
		t.Errorf("converge skipped: %+v %v", res, err)
	}
	st.Options.SkipPhases = nil

	// The state as the pki phase leaves it, and the cluster on its cluster CA.
	if _, _, err := pki.EnsureCA(statedir.PKI(stateDir), "appliance CA lab", now); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range cfg.Nodes {
		nodes = append(nodes, n.Name)
	}
	if _, _, err := pki.EnsureNodeTokens(statedir.PKI(stateDir), nodes); err != nil {
		t.Fatal(err)
	}
	api := kubetest.StartAPIServer(t, kubetest.Options{PKIDir: statedir.ClusterPKI(stateDir), AuthorizationMode: "AlwaysAllow"})
	cfg.APIServer.VIP = netip.MustParseAddr("127.0.0.1")
	cfg.APIServer.Port = uint16(api.Port)
	if _, err := ensureAdminKubeconfig(st, api.CA, now); err != nil {
		t.Fatal(err)
	}

	run := func(dry bool, changed bool, detail string) {
		t.Helper()
		st.Options.DryRun = dry
		res, err := (escrowPhase{}).Run(ctx, st)
		if err != nil || res.Changed != changed || !strings.Contains(res.Detail, detail) {
			t.Fatalf("escrow phase (dry run %v): %+v %v, want changed %v with %q", dry, res, err, changed, detail)
		}
	}
	run(false, true, "to 1 recipient, created kube-system/appliance-state-escrow (the cluster holds none yet)")
	run(false, false, "escrow unchanged (")
	if _, err := pki.RotateNodeToken(statedir.PKI(stateDir), "w1"); err != nil {
		t.Fatal(err)
	}
	before, err := escrow.Fetch(ctx, api.Client)
	if err != nil {
		t.Fatal(err)
	}
	run(true, true, "would seal ")
	if after, _ := escrow.Fetch(ctx, api.Client); after.ResourceVersion != before.ResourceVersion {
		t.Error("a dry run wrote the escrow")
	}
	run(false, true, "replaced kube-system/appliance-state-escrow (the state changed)")
	run(true, false, "escrow unchanged (")

	stored, err := escrow.Fetch(ctx, api.Client)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := escrow.ParseIdentities(strings.NewReader(testEscrowIdentity))
	if err != nil {
		t.Fatal(err)
	}
	e, err := escrow.Open(stored.Blob, ids, escrow.Expect{ClusterCAPin: agentapi.PinOf(api.CA.Cert), ClusterName: cfg.ClusterName})
	if err != nil {
		t.Fatalf("open the stored escrow: %v", err)
	}
	tok, _ := e.ReadFile("pki/tokens/w1")
	have, _, err := pki.EnsureNodeTokens(statedir.PKI(stateDir), []string{"w1"})
	if err != nil || strings.TrimSpace(string(tok)) != have["w1"] {
		t.Errorf("the escrow holds another token for w1 (%v)", err)
	}
}
