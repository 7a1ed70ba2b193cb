package bootstrap

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/airgap-appliance/appliance/pkg/applianced"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/plan"
)

// servePhase makes sure `appliance serve` runs with the current generation and answers /healthz
// over HTTPS with the pinned CA at the address nodes will use. The server outlives this command:
// it runs detached (own session, log in STATE/serve/serve.log, PID in STATE/serve/pid). A server of
// another generation is stopped (SIGTERM, then SIGKILL after 10 s) and replaced.
type servePhase struct{}

func (servePhase) Name() string { return "serve" }

func (servePhase) Run(ctx context.Context, st *State) (Result, error) {
	gen, err := applianced.Generation(st.Options.ConfigPath, st.ServingCert, st.Options.HostagentBinary)
	if err != nil {
		return Result{}, err
	}
	client := healthClient(st)
	healthURL := st.ApplianceURL + "/healthz"
	if h, err := applianced.GetHealth(ctx, client, healthURL); err == nil && h.Generation == gen {
		st.ServePID = h.PID
		return Result{Detail: fmt.Sprintf("already serving %s (pid %d, generation %s)", st.ApplianceURL, h.PID, gen)}, nil
	}
	if st.Options.DryRun {
		return Result{Changed: true, Detail: fmt.Sprintf("would start appliance serve at %s (generation %s)", st.ApplianceURL, gen)}, nil
	}
	if st.vipPreflight != nil {
		// The pre-flight started in the bundle phase; a conflict stops here, before serve starts
		// (the same refusal serve would make).
		select {
		case err := <-st.vipPreflight:
			st.vipPreflight = nil
			if err != nil {
				return Result{}, err
			}
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	bin := st.Options.ApplianceBinary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return Result{}, err
		}
	}
	cfgPath, _ := filepath.Abs(st.Options.ConfigPath)
	args := []string{"serve", "--config", cfgPath, "--state-dir", st.StateDir, "--generation", gen}
	if st.Options.HostagentBinary != "" {
		args = append(args, "--hostagent-binary", st.Options.HostagentBinary)
	}
	started, err := applianced.Start(ctx, applianced.StartOptions{
		Argv: append([]string{bin}, args...), StateDir: st.StateDir, HealthURL: healthURL, Generation: gen, Client: client,
	})
	if err != nil {
		return Result{}, err
	}
	st.ServePID = started.PID
	return Result{Changed: true, Detail: started.Detail + fmt.Sprintf(" at %s (pid %d, generation %s)", st.ApplianceURL, started.PID, gen)}, nil
}

// healthClient trusts only the appliance CA (the pin nodes use) and uses no proxy.
func healthClient(st *State) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(st.CA.Cert)
	return &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			Proxy:             nil,
			TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
}

// startVIPPreflight starts, in the background, the VRRP pre-flight that the serve phase's server
// would otherwise run before serving (applianced.PreflightAhead), so that its listening window
// overlaps the bundle check. It does nothing in a dry run, when the serve phase is skipped, or when
// the bootstrap host holds no VIP (keepalived off, no VIP). The serve phase waits for its result.
// If the plan cannot be made here, nothing is started: serve checks the claim itself.
func startVIPPreflight(ctx context.Context, st *State) {
	if st.Options.DryRun || slices.Contains(st.Options.SkipPhases, "serve") || st.vipPreflight != nil {
		return
	}
	recorded, err := plan.ReadRecorded(st.StateDir)
	if err != nil {
		return
	}
	vrrp, _ := plan.VRRPFor(st.Config, st.VRRPAuth, recorded)
	kc, err := plan.ApplianceKeepalived(st.Config, st.ControlPlane, vrrp)
	if err != nil || kc == nil {
		return
	}
	log := st.Options.Logger.With("component", "vip")
	done := make(chan error, 1)
	st.vipPreflight = done
	var checkOnly []keepalived.Instance
	if in := plan.ApplianceIngressCheck(st.Config, st.ControlPlane, vrrp); in != nil {
		checkOnly = append(checkOnly, *in)
	}
	go func() { done <- applianced.PreflightAhead(ctx, st.StateDir, *kc, checkOnly, log) }()
}
