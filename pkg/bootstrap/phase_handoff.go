package bootstrap

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/registry"
)

// Hand-off stages, in order (HandoffRecord.Stage).
const (
	// HandoffMirrors: the control planes were told to run the in-cluster mirror and copy the
	// appliance's registry and repo.
	HandoffMirrors = "mirrors"
	// HandoffSwitched: every digest and repo file was pulled back from at least two mirrors, and every
	// node was told to use the mirrors instead of the appliance.
	HandoffSwitched = "switched"
	// HandoffDone: every node confirmed the switch; the bootstrap host may be switched off.
	HandoffDone = "done"
)

// ErrHandedOff is returned by `appliance handoff` when the hand-off is already done.
var ErrHandedOff = errors.New("already handed off")

// HandoffRecord is STATE/handoff/state.json, the hand-off's progress (written with pkg/atomicfile, so a
// kill leaves the previous stage and a rerun resumes there).
type HandoffRecord struct {
	Stage string `json:"stage"`
	// Image is the appliance image the mirrors run (by digest) and Port their HTTPS port.
	Image string `json:"image"`
	Port  uint16 `json:"port"`
	// Started, Switched and Done are when each stage began (UTC).
	Started  time.Time `json:"started"`
	Switched time.Time `json:"switched,omitzero"`
	Done     time.Time `json:"done,omitzero"`
	// Verified is what was pulled back from each mirror before the switch.
	Verified []MirrorVerified `json:"verified,omitempty"`
}

// MirrorVerified is one mirror's check: registry content and repo files pulled and hashed.
type MirrorVerified struct {
	registry.MirrorCheck
	RepoFiles int     `json:"repoFiles"`
	RepoBytes int64   `json:"repoBytes"`
	Seconds   float64 `json:"seconds"`
}

func handoffRecordPath(state string) string {
	return filepath.Join(statedir.Handoff(state), "state.json")
}

// ReadHandoff returns the hand-off record, or nil when no hand-off was ever started.
func ReadHandoff(state string) (*HandoffRecord, error) {
	b, err := os.ReadFile(handoffRecordPath(state))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r HandoffRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w (move it away to start the hand-off again)", handoffRecordPath(state), err)
	}
	return &r, nil
}

func writeHandoff(state string, r *HandoffRecord) error {
	if err := os.MkdirAll(statedir.Handoff(state), 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	_, err := atomicfile.Write(handoffRecordPath(state), append(b, '\n'), 0o644)
	return err
}

func handoffCertDir(state, node string) string {
	return filepath.Join(statedir.Handoff(state), "certs", node)
}

// handoffInputs is the render phase's view of the hand-off (nil before it started): the image, port,
// each control plane's mirror certificate, the images the mirrors must copy by digest (those the
// registry serves under no tag) and whether the nodes are switched.
func handoffInputs(st *State) (*plan.Handoff, error) {
	rec, err := ReadHandoff(st.StateDir)
	if err != nil || rec == nil {
		return nil, err
	}
	h := &plan.Handoff{Image: rec.Image, Port: rec.Port, Certs: map[string]plan.CertPair{},
		Switched: rec.Stage == HandoffSwitched || rec.Stage == HandoffDone}
	for _, img := range st.Images.Images {
		if img.Tag == "" {
			h.DigestOnlyImages = append(h.DigestOnlyImages, img.Ref)
		}
	}
	for _, cp := range st.Config.ControlPlaneNodes() {
		dir := handoffCertDir(st.StateDir, cp.Name)
		c, err1 := os.ReadFile(filepath.Join(dir, pki.ServingCertFile))
		k, err2 := os.ReadFile(filepath.Join(dir, pki.ServingKeyFile))
		if err1 == nil && err2 == nil {
			h.Certs[cp.Name] = plan.CertPair{CertPEM: c, KeyPEM: k}
		}
	}
	return h, nil
}

// handoffPhase moves what nodes need from the appliance into the cluster (issue 15 item 4), when asked
// (Options.Handoff: `appliance handoff`, or bootstrap.yaml handoff.enabled), in three resumable stages:
//
//  1. mirrors: each control plane gets a serving certificate (signed by the appliance CA, SANs its
//     addresses and 127.0.0.1) and, through its node config, the in-cluster mirror as a kubelet static
//     pod (`appliance cluster-mirror`, the appliance's own image), which copies the registry and the
//     package repo to its disk; the phase waits until every control plane's hostagent reports its
//     mirror complete.
//  2. switched: the phase pulls every manifest and blob of every image the appliance serves, and every
//     repo file, from every mirror, hashing each byte (at least two mirrors must pass, or all when the
//     cluster has one control plane), then points every node's containerd mirrors and apt source at the
//     mirrors (in inventory order) and waits until every node reports the switch.
//  3. done: recorded; from then on nothing a node needs comes from the bootstrap host.
//
// Refused before anything changes when the cluster is not healthy (a configured node not ready in
// Kubernetes' terms). Skipped, with the reason, when converge was skipped in this run and a node's
// hostagent is not ready (needsConverge): asked on an ISO's first boot, which skips power and
// converge, it waits for the bootstrap that brings the nodes up. A rerun after the hand-off reports
// it and changes nothing.
type handoffPhase struct{}

func (handoffPhase) Name() string { return "handoff" }

func (handoffPhase) Run(ctx context.Context, st *State) (Result, error) {
	rec, err := ReadHandoff(st.StateDir)
	if err != nil {
		return Result{}, err
	}
	asked := st.Options.Handoff || st.Config.Handoff.Enabled
	if rec == nil && !asked {
		return Result{Detail: "not asked (appliance handoff, or handoff.enabled in the configuration)"}, nil
	}
	if rec != nil && rec.Stage == HandoffDone {
		return Result{Detail: fmt.Sprintf("handed off at %s: nodes pull from the control planes' mirrors", rec.Done.Format(time.RFC3339))}, nil
	}
	if !st.Config.Kubernetes.IsEnabled() {
		return Result{}, errors.New("handoff: kubernetes is not enabled: there is no cluster to hand off to")
	}
	if why := needsConverge(st, "nothing handed off"); why != "" {
		return Result{Skipped: why}, nil
	}
	cps := st.Config.ControlPlaneNodes()
	if st.Options.DryRun {
		stage := "start"
		if rec != nil {
			stage = "resume after stage " + rec.Stage
		}
		return Result{Changed: true, Detail: fmt.Sprintf("would %s the hand-off to %d control planes' mirrors", stage, len(cps))}, nil
	}
	start := time.Now()
	api, err := openAdminAPI(st.StateDir)
	if err != nil {
		return Result{}, fmt.Errorf("handoff: %w", err)
	}
	defer api.close()
	if rec == nil {
		// The cluster must be healthy before anything moves.
		missing, err := kubeNotReady(ctx, api, st.Config.Nodes)
		if err != nil {
			return Result{}, fmt.Errorf("handoff refused: the cluster's API does not answer: %w", err)
		}
		if len(missing) > 0 {
			return Result{}, fmt.Errorf("handoff refused: the cluster is not healthy, nothing changed: %s; fix those nodes (appliance status) and run it again", describeMissing(missing))
		}
		if st.ApplianceImage.Pinned == "" {
			return Result{}, errors.New("handoff: the appliance image is not in the registry (the bundle phase makes it): rerun without --skip-phases bundle")
		}
		if err := requireStatic(st.Options.ApplianceBinary); err != nil {
			return Result{}, err
		}
		for _, cp := range cps {
			if _, err := handoffCert(st, cp); err != nil {
				return Result{}, err
			}
		}
		rec = &HandoffRecord{Stage: HandoffMirrors, Image: st.ApplianceImage.Pinned, Port: plan.DefaultClusterMirrorPort, Started: time.Now().UTC()}
		if err := writeHandoff(st.StateDir, rec); err != nil {
			return Result{}, err
		}
	}
	timeout := st.Options.ConvergeTimeout
	if timeout <= 0 {
		timeout = DefaultConvergeTimeout
	}
	if rec.Stage == HandoffMirrors {
		if err := rerender(ctx, st); err != nil {
			return Result{}, err
		}
		var names []string
		for _, cp := range cps {
			names = append(names, cp.Name)
		}
		st.progress("handoff: waiting for the in-cluster mirrors of %s to copy the registry and repo", strings.Join(names, ", "))
		if err := waitHandoffStep(ctx, st, names, rec.Started, "in-cluster mirror serving", timeout); err != nil {
			return Result{}, err
		}
		verified, err := verifyMirrors(ctx, st, rec)
		if err != nil {
			return Result{}, err
		}
		rec.Verified, rec.Stage, rec.Switched = verified, HandoffSwitched, time.Now().UTC()
		if err := writeHandoff(st.StateDir, rec); err != nil {
			return Result{}, err
		}
	}
	if rec.Stage == HandoffSwitched {
		if err := rerender(ctx, st); err != nil {
			return Result{}, err
		}
		var names []string
		for _, n := range st.Config.Nodes {
			names = append(names, n.Name)
		}
		st.progress("handoff: waiting for %d nodes to switch containerd and apt to the in-cluster mirrors", len(names))
		if err := waitHandoffStep(ctx, st, names, rec.Switched, "apt source on", timeout); err != nil {
			return Result{}, err
		}
		rec.Stage, rec.Done = HandoffDone, time.Now().UTC()
		if err := writeHandoff(st.StateDir, rec); err != nil {
			return Result{}, err
		}
	}
	var parts []string
	for _, v := range rec.Verified {
		parts = append(parts, fmt.Sprintf("%s: %d manifests, %d blobs, %d repo files, %s in %.1fs", v.BaseURL, v.Manifests, v.Blobs, v.RepoFiles, humanBytes(v.Bytes+v.RepoBytes), v.Seconds))
	}
	return Result{Changed: true, Detail: fmt.Sprintf("handed off in %.1fs; pulled back and hashed from %s; every node pulls from the control planes' mirrors: the bootstrap host may be switched off",
		time.Since(start).Seconds(), strings.Join(parts, "; "))}, nil
}

func describeMissing(m map[string]string) string {
	var out []string
	for n, why := range m {
		out = append(out, n+": "+why)
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// handoffCert makes sure control plane cp has its mirror's serving certificate: SANs its control-plane
// and workload-plane addresses and 127.0.0.1 (the hostagent's local check), DNS its name.
func handoffCert(st *State, cp config.Node) (tls.Certificate, error) {
	var ips []netip.Addr
	if a, ok := plan.ControlPlaneAddress(st.Config, cp); ok {
		ips = append(ips, a)
	} else {
		return tls.Certificate{}, fmt.Errorf("handoff: control plane %s has no static address in a control-plane CIDR to serve its mirror on", cp.Name)
	}
	if a, ok := plan.WorkloadPlaneAddress(st.Config, cp); ok && a != ips[0] {
		ips = append(ips, a)
	}
	ips = append(ips, netip.MustParseAddr("127.0.0.1"))
	dir := handoffCertDir(st.StateDir, cp.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, err
	}
	c, _, err := pki.EnsureServingCert(dir, st.CA, ips, []string{cp.Name}, time.Now())
	return c, err
}

// rerender runs the render phase again so the node configs carry the hand-off's new stage; nodes fetch
// them at their next resync (hostagent DefaultResync).
func rerender(ctx context.Context, st *State) error {
	if _, err := (renderPhase{}).Run(ctx, st); err != nil {
		return fmt.Errorf("handoff: render the node configs: %w", err)
	}
	return nil
}

// waitHandoffStep waits until every named node has reported its handoff step done, after since, with a
// detail containing want. A node whose handoff step failed ends the wait with its reason.
func waitHandoffStep(ctx context.Context, st *State, nodes []string, since time.Time, want string, limit time.Duration) error {
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	deadline := time.Now().Add(limit)
	for {
		var pending []string
		for _, n := range nodes {
			evs, err := store.Events(n)
			if err != nil {
				return err
			}
			ok := false
			for _, ev := range evs {
				if ev.Step != agentapi.StepHandoff || ev.Time.Before(since) {
					continue
				}
				switch {
				case ev.Status == agentapi.StatusDone && strings.Contains(ev.Detail, want):
					ok = true
				case ev.Status == agentapi.StatusFailed:
					ok = false
				}
			}
			if !ok {
				last := "not reported yet (nodes fetch their config every minute)"
				for _, ev := range evs {
					if ev.Step == agentapi.StepHandoff && !ev.Time.Before(since) {
						last = ev.Status + ": " + ev.Detail
					}
				}
				pending = append(pending, n+" ("+last+")")
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("handoff: after %s, still waiting for %s; see appliance status and the nodes' hostagent journal, then run appliance handoff again (it resumes)", limit, strings.Join(pending, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// verifyMirrors pulls every image and repo file back from every control plane's mirror and hashes it.
// At least two mirrors (or all of them with fewer control planes) must hold everything.
func verifyMirrors(ctx context.Context, st *State, rec *HandoffRecord) ([]MirrorVerified, error) {
	h, err := handoffInputs(st)
	if err != nil {
		return nil, err
	}
	urls := plan.ClusterMirrorURLs(st.Config, h)
	pool := x509.NewCertPool()
	pool.AddCert(st.CA.Cert)
	tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	b, err := bundle.Open(st.Config.Bundle.Path)
	if err != nil {
		return nil, fmt.Errorf("bundle.path: %w", err)
	}
	repo, err := repoSums(b)
	if err != nil {
		return nil, err
	}
	need := min(2, len(urls))
	var out []MirrorVerified
	var failures []string
	for _, u := range urls {
		t0 := time.Now()
		c, err := registry.VerifyMirror(ctx, client, u, st.Images.Images)
		v := MirrorVerified{MirrorCheck: c}
		if err == nil {
			v.RepoFiles, v.RepoBytes, err = verifyRepo(ctx, client, u+"/repo", repo)
		}
		v.Seconds = time.Since(t0).Seconds()
		if err != nil {
			failures = append(failures, err.Error())
			continue
		}
		out = append(out, v)
	}
	if len(out) < need || len(out) == 0 {
		return nil, fmt.Errorf("handoff: %d of %d in-cluster mirrors hold everything, %d needed before nodes may depend on them: %s", len(out), len(urls), need, strings.Join(failures, "; "))
	}
	return out, nil
}

// repoSums maps every file of the bundle's package repository (path relative to the repo/ folder
// the mirrors serve under /repo/, slash-separated) to its hex SHA-256, from the bundle's SHA256SUMS:
// the signed list the bundle phase verified every file against, so nothing is read or hashed again,
// and the mirrors are held to what the bundle's signer published. Errors: SHA256SUMS unreadable or
// invalid (bundle.ErrSums), or listing no repository file.
func repoSums(b *bundle.Bundle) (map[string]string, error) {
	f, err := os.Open(filepath.Join(b.Dir, bundle.SumsFile))
	if err != nil {
		return nil, fmt.Errorf("bundle.path: %w", err)
	}
	defer f.Close()
	sums, err := bundle.ParseSums(f)
	if err != nil {
		return nil, fmt.Errorf("bundle.path: %s: %w", bundle.SumsFile, err)
	}
	prefix := path.Dir(bundle.RepoPath) + "/" // "repo/": the mirrors serve it as /repo/
	out := map[string]string{}
	for _, s := range sums {
		if rel, ok := strings.CutPrefix(s.Path, prefix); ok {
			out[rel] = s.SHA256
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bundle.path: %s lists no file under %s: no package repository to hand off", bundle.SumsFile, prefix)
	}
	return out, nil
}

// verifyRepo GETs every file of files from base and compares its SHA-256.
func verifyRepo(ctx context.Context, client *http.Client, base string, files map[string]string) (int, int64, error) {
	var n int
	var total int64
	for rel, want := range files {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/"+rel, nil)
		if err != nil {
			return n, total, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return n, total, fmt.Errorf("%s/%s: %w", base, rel, err)
		}
		h := sha256.New()
		c, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil {
			return n, total, fmt.Errorf("%s/%s: %w", base, rel, err)
		}
		if resp.StatusCode != http.StatusOK {
			return n, total, fmt.Errorf("%s/%s: %s", base, rel, resp.Status)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return n, total, fmt.Errorf("%s/%s: sha256 %s, the bundle's is %s", base, rel, got, want)
		}
		n++
		total += c
	}
	return n, total, nil
}

// progress prints one human progress line (not with JSON events).
func (st *State) progress(format string, args ...any) {
	if st.Options.JSONEvents || st.Options.Progress == nil {
		return
	}
	fmt.Fprintf(st.Options.Progress, format+"\n", args...)
}

// requireStatic refuses an appliance executable that needs a dynamic loader: its image has nothing
// but the executable, so the in-cluster mirror could never start.
func requireStatic(bin string) error {
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return err
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("handoff: the appliance executable %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("handoff refused: the appliance executable %s is dynamically linked, and the in-cluster mirror runs it alone in an image: build it static (CGO_ENABLED=0, as make build does)", bin)
		}
	}
	return nil
}
