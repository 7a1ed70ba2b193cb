package applianced

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/csrapprove"
	"github.com/airgap-appliance/appliance/pkg/dnsrecords"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/version"
	"github.com/airgap-appliance/appliance/registry"
)

// ServeOptions are the inputs of the long-running `appliance serve` process.
type ServeOptions struct {
	ConfigPath      string
	StateDir        string // overrides the configuration's stateDir when not empty
	HostagentBinary string
	Generation      string
	Logger          *slog.Logger
	// Listener, when set, is used instead of listening on server.listenAddress:server.port (tests).
	Listener net.Listener
	// Ready is closed once the server accepts connections.
	Ready chan<- struct{}
}

// Serve runs the appliance's HTTPS front from what the bootstrap phases left in the state
// directory (serving certificate, node tokens, registry storage, rendered Ignition configs) until
// ctx is cancelled. It is what `appliance serve` runs, as a systemd service on a real host or as a
// detached process started by the serve phase. With boot.dhcp proxy or server it also runs the
// network-boot service (pkg/netboot: DHCP, TFTP, the plain-HTTP boot port) on the control-plane
// interface, and stops it before returning.
func Serve(ctx context.Context, o ServeOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, _, err := config.Load(o.ConfigPath, config.ValidateOptions{CheckFiles: true})
	if err != nil {
		return fmt.Errorf("%s is not valid:\n%w", o.ConfigPath, err)
	}
	stateDir := cfg.StateDir
	if o.StateDir != "" {
		if err := config.CheckStateDir(o.StateDir); err != nil {
			return err
		}
		stateDir = o.StateDir
	}
	sweepNodeRecords(stateDir, log)
	pkiDir := statedir.PKI(stateDir)
	cert, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, "serving.crt"), filepath.Join(pkiDir, "serving.key"))
	if err != nil {
		return fmt.Errorf("load serving certificate (run `appliance bootstrap` first): %w", err)
	}
	var nodes []string
	for _, n := range cfg.Nodes {
		nodes = append(nodes, n.Name)
	}
	// The node tokens are read from STATE/pki/tokens at every authentication, not once here: an
	// enrolment (below), `appliance node reinstall` and `appliance node revoke` change them while
	// this process serves, and the old token must stop working at once.
	tokens := server.NodeTokensIn(pkiDir, nodes)
	b, err := bundle.Open(cfg.Bundle.Path)
	if err != nil {
		return fmt.Errorf("bundle.path: %w", err)
	}
	reg, err := registry.NewHandler(ctx, statedir.Registry(stateDir), log.With("component", "registry"))
	if err != nil {
		return err
	}
	defer reg.Close()
	artifacts := map[string]string{}
	if o.HostagentBinary != "" {
		artifacts["hostagent"] = o.HostagentBinary
	}
	caPEM, err := os.ReadFile(filepath.Join(pkiDir, pki.CACertFile))
	if err != nil {
		return fmt.Errorf("load CA certificate (run `appliance bootstrap` first): %w", err)
	}
	store := nodestate.Open(statedir.Nodes(stateDir))
	agent := server.NewAgentAPI(statedir.Rendered(stateDir), nil, store, log.With("component", "agent"))
	agent.UseTokens(tokens)
	ignitionStore := server.NewIgnitionStore(statedir.Rendered(stateDir), nil)
	ignitionStore.UseTokens(tokens)
	enrollment := server.NewEnrollment(statedir.Rendered(stateDir), statedir.Enrolment(stateDir), enrollNodes(cfg), store, log.With("component", "enroll"))
	enrollment.PKIDir = pkiDir
	// boot.enrolment.approval: operator keeps every enrolment pending until `appliance node approve`.
	enrollment.RequireApproval = cfg.Boot.Enrolment.Approval == config.EnrolApprovalOperator
	kubeadm := kubeadmGate(store)
	upgrade := agentUpgradeGate(stateDir, o.HostagentBinary != "")
	agent.Gate = func(node string, nc *agentapi.NodeConfig) {
		kubeadm(node, nc)
		upgrade(node, nc)
	}
	nodeISO, err := openNodeISO(cfg, caPEM, log.With("component", "nodeiso"))
	if err != nil {
		return err
	}
	if nodeISO != nil {
		defer nodeISO.Close()
	}
	srv, err := server.New(server.Options{
		Listen:      net.JoinHostPort(cfg.Server.ListenAddress.String(), strconv.Itoa(int(cfg.Server.Port))),
		Certificate: cert,
		Registry:    reg,
		RepoDir:     filepath.Dir(b.RepoDir()), // bundle repo/: /repo/debian/... now, /repo/rpm/... later
		Ignition:    ignitionStore,
		Agent:       agent,
		Enroll:      enrollment,
		CAPEM:       caPEM,
		NodeISO:     nodeISO,
		Artifacts:   artifacts,
		Generation:  o.Generation,
		Logger:      log,
	})
	if err != nil {
		return err
	}
	if o.Listener != nil {
		return srv.ServeListener(ctx, o.Listener, o.Ready)
	}
	// The API VIP starts on this host and is handed to the control planes (see runVIP). The pre-flight
	// runs first, so a segment where the claim would collide stops serve before it serves.
	if err := checkVIPClaim(ctx, stateDir, log.With("component", "vip")); err != nil {
		return err
	}
	dnsServer, err := serveDNS(cfg, o.ConfigPath, netip.AddrPortFrom(cfg.DNS.ListenAddress, dnsrecords.Port), log.With("component", "dns"))
	if err != nil {
		return err
	}
	defer func() { _ = dnsServer.Shutdown(context.Background()) }()
	// Network boot (boot.dhcp proxy or server): DHCP, TFTP and the plain-HTTP boot port, stopped
	// before Serve returns.
	nb, err := startNetboot(cfg, caPEM, store, log.With("component", "netboot"))
	if err != nil {
		return err
	}
	if nb != nil {
		defer func() { _ = nb.Close() }()
		// The nodes the DHCP server leases (boot.enrolment.sourceAddress: lease) enrol from their
		// lease; set before the front serves, so no enrolment is answered without it.
		enrollment.SetLeases(nb.Lease)
	}
	// Installed machines' notices come over the HTTPS agent API with their node token: network-booted
	// ones are marked (their next network boots boot the disk), virtual-media ones' BMCs take the CD
	// out of the boot.
	agent.Installed = newInstallNotices(ctx, cfg, nb, store, log.With("component", "install")).note
	vctx, cancelVIP := context.WithCancel(ctx)
	vipDone := make(chan struct{})
	go func() {
		defer close(vipDone)
		if err := runVIP(vctx, cfg, stateDir, log.With("component", "vip"), true); err != nil {
			log.Error("API VIP on the bootstrap host", "error", err)
		}
	}()
	stopCSRApprover := startCSRApprover(ctx, cfg, stateDir, store, log.With("component", "csrapprove"))
	err = srv.Serve(ctx, o.Ready)
	cancelVIP()
	<-vipDone
	stopCSRApprover()
	return err
}

// startCSRApprover runs the kubelet serving-certificate approver (pkg/csrapprove) once
// STATE/kubernetes/admin.conf exists, checking every 5 s, until ctx is done or the returned stop is
// called (which waits for it). Nothing runs when the configuration has no Kubernetes.
func startCSRApprover(ctx context.Context, cfg *config.BootstrapConfiguration, stateDir string, store *nodestate.Store, log *slog.Logger) (stop func()) {
	if !cfg.Kubernetes.IsEnabled() {
		return func() {}
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = csrapprove.RunWhenReady(cctx, statedir.AdminKubeconfig(stateDir), 5*time.Second, csrapprove.FromConfig(cfg.Nodes, store), log)
	}()
	return func() { cancel(); <-done }
}

// sweepNodeRecords removes the temporary files a killed serve left in STATE/nodes (a report
// written between create and rename; atomicfile.CleanStale). Only serve writes there besides the
// bootstrap's power phase, and CleanStale never touches a live writer's file, so this is safe while a
// bootstrap runs. Serve is restarted after a crash by its supervisor without a bootstrap run, which
// is why it sweeps its own directory rather than waiting for the next bootstrap. Failures are logged.
func sweepNodeRecords(stateDir string, log *slog.Logger) {
	removed, err := atomicfile.CleanStale(statedir.Nodes(stateDir))
	if err != nil {
		log.Warn("remove temporary files a killed serve left", "dir", statedir.Nodes(stateDir), "error", err)
	}
	if len(removed) > 0 {
		log.Info("removed temporary files a killed serve left", "count", len(removed), "paths", removed)
	}
}

// Generation fingerprints everything a running server has loaded at start: the configuration
// file, the serving certificate, the hostagent binary and this program's version. The serve phase
// restarts a server whose /healthz reports another generation. The node tokens are not part of it:
// the server reads them as they change (server.NodeTokensIn), and an enrolment rotates them
// without a restart.
func Generation(configPath string, cert tls.Certificate, hostagent string) (string, error) {
	h := sha256.New()
	cfg, err := os.ReadFile(configPath)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "version %s\nconfig %d\n", version.String(), len(cfg))
	h.Write(cfg)
	for _, c := range cert.Certificate {
		h.Write(c)
	}
	if hostagent != "" {
		st, err := os.Stat(hostagent)
		if err != nil {
			return "", fmt.Errorf("hostagent binary: %w", err)
		}
		fmt.Fprintf(h, "hostagent %s %d %d\n", hostagent, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// serveDNS answers DNS queries for the cluster's zone (pkg/dnsrecords) on addr when the
// configuration sets dns.listenAddress, until the returned server is shut down; nil (nothing to
// stop) otherwise. The SOA serial is the configuration file's modification time.
func serveDNS(cfg *config.BootstrapConfiguration, configPath string, addr netip.AddrPort, log *slog.Logger) (*dnsrecords.Server, error) {
	if !cfg.DNS.ListenAddress.IsValid() {
		return nil, nil
	}
	serial, err := dnsrecords.FileSerial(configPath)
	if err != nil {
		return nil, err
	}
	z, err := dnsrecords.New(cfg, dnsrecords.Options{Serial: serial})
	if err != nil {
		return nil, err
	}
	srv, err := dnsrecords.Start(z, addr, log)
	if err != nil {
		return nil, fmt.Errorf("dns.listenAddress: %w: give an address of this host, where nothing else listens on port %d", err, dnsrecords.Port)
	}
	log.Info("answering DNS queries for the cluster's zone", "zone", z.Origin, "address", srv.Addr().String())
	return srv, nil
}

// enrollInstallArgs is what the enrolment answer gives node n to install with, as kernel-argument
// words: installArgs and, when n has one, appliance.mac= with nodes[].mac (BootArgs.MAC: the NIC the
// enrolment matched, which the installed system's static addresses go on when the boot named no
// NIC, as a virtual-media boot does not).
func enrollInstallArgs(cfg *config.BootstrapConfiguration, n config.Node) []string {
	args := installArgs(cfg, n)
	args.MAC = n.MAC
	return args.Words()
}

// reenrol is what the enrolment's refusals tell the operator to run so that n enrols again: only a
// power-on the appliance records opens an enrolment. `appliance node reinstall` does that for a
// network-booted node; for another BMC node the power phase does it, for a node that is off and not
// configured or ready (a revoked node is failed).
func reenrol(n config.Node) string {
	if n.NetworkBootable() {
		return "" // server.EnrollNode's default: appliance node reinstall
	}
	return fmt.Sprintf("power it off (`appliance power off %s`), run `appliance node revoke %s` (unless it is already revoked) and then `appliance bootstrap`, whose power phase powers it on to enrol", n.Name, n.Name)
}

// enrollNodes is the inventory as the enrolment endpoint sees it (pkg/server.Enrollment).
func enrollNodes(cfg *config.BootstrapConfiguration) []server.EnrollNode {
	out := make([]server.EnrollNode, 0, len(cfg.Nodes))
	for _, n := range cfg.Nodes {
		out = append(out, server.EnrollNode{Name: n.Name, MAC: n.MAC, SystemUUID: n.SystemUUID,
			BMC: n.Power.Kind == config.PowerIPMI || n.Power.Kind == config.PowerRedfish, InstallArgs: enrollInstallArgs(cfg, n),
			Reenrol: reenrol(n), FromLease: cfg.EnrolFromLease(n)})
	}
	return out
}
