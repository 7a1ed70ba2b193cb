package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/applianced"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Outside systemd nothing restarts a dead `appliance serve` (pkg/applianced/supervise.go: the
// detached process is started by `appliance bootstrap` only; on a systemd host appliance.service
// has Restart=on-failure, RestartSec=2s). So soak is that supervisor: it waits RestartSec after the
// kill and starts serve again through the product's own applianced.Start, with the killed
// process's command line, as the unit would.
const restartSec = 2 * time.Second

func soakCmd(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	var l loadFlags
	l.register(fs, 600*time.Second)
	every := fs.Duration("kill-every", 60*time.Second, "kill -9 appliance serve this often")
	vipFlag := fs.String("vip", "10.100.0.100", "the API VIP that must stay in this network namespace")
	_ = fs.Parse(args)
	if l.state == "" {
		return errors.New("soak: -state is required")
	}
	vip, err := netip.ParseAddr(*vipFlag)
	if err != nil {
		return err
	}
	nodes, err := loadNodes(l.state, l.prefix)
	if err != nil {
		return err
	}
	ctx := context.Background()
	caPEM, err := hostagent.FetchCA(ctx, nodes[0].cfg.ApplianceURL, nodes[0].cfg.CAPin)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, Proxy: nil}}
	healthURL := strings.TrimRight(nodes[0].cfg.ApplianceURL, "/") + "/healthz"

	// The VIP must be here before the clock starts (keepalived takes a few seconds to become master).
	for i := 0; !vipPresent(vip); i++ {
		if i == 300 {
			return fmt.Errorf("the VIP %s is not on any interface of this namespace: is keepalived enabled?", vip)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var vs vipSampler
	var wg sync.WaitGroup
	wg.Go(func() { vs.run(sctx, vip) })
	var kills []killResult
	var kmu sync.Mutex
	wg.Go(func() {
		t := time.NewTicker(*every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				k := killAndRestart(sctx, l.state, healthURL, hc)
				kmu.Lock()
				kills = append(kills, k)
				kmu.Unlock()
				fmt.Printf("  %s kill -9 serve pid %d: %s\n", time.Now().Format("15:04:05"), k.pid, k.detail())
			}
		}
	})
	fmt.Printf("soak: %d nodes, %d pullers, %s, serve killed -9 every %s (load average %s)\n", len(nodes), l.pullers, l.duration, *every, loadavg())
	_, res, err := runLoad(ctx, l, nodes, nil)
	stop()
	wg.Wait()
	if err != nil {
		return err
	}
	// The last restart may still be under way: the records are read from a serving appliance.
	if _, err := applianced.GetHealth(ctx, hc, healthURL); err != nil {
		time.Sleep(5 * time.Second)
	}
	printResult(res)
	ok := true
	restarts, worst := 0, time.Duration(0)
	for _, k := range kills {
		if k.err == nil {
			restarts++
			worst = max(worst, k.down)
		} else {
			ok = false
		}
	}
	fmt.Printf("kills: %d, restarts: %d, longest time without a healthy serve: %.1f s\n", len(kills), restarts, worst.Seconds())

	acked, recorded, lost, err := countReports(l.state, nodes)
	if err != nil {
		ok = false
		fmt.Println("node records:", err)
	}
	fmt.Printf("reports: %d acknowledged, %d of them recorded, %d lost\n", acked, recorded, lost)
	if lost > 0 {
		ok = false
	}
	checked, bad, temps := checkStateFiles(l.state)
	fmt.Printf("state files: %d parsed, %d corrupt, %d temporary leftovers\n", checked, len(bad), len(temps))
	for _, b := range bad {
		fmt.Println("  corrupt:", b)
	}
	for _, t := range temps {
		fmt.Println("  leftover:", t)
	}
	if len(bad) > 0 {
		ok = false
	}
	fmt.Printf("VIP %s: %d samples every 50 ms, absent in %d, longest absence %.2f s\n", vip, vs.samples, vs.absent, vs.longest.Seconds())
	if vs.absent > 0 {
		ok = false
	}
	fmt.Printf("load average at the end: %s\n", loadavg())
	if !ok {
		fmt.Println("SOAK: FAILED")
		return errors.New("soak failed")
	}
	fmt.Println("SOAK: passed")
	return nil
}

type killResult struct {
	pid  int
	down time.Duration
	err  error
	how  string
}

func (k killResult) detail() string {
	if k.err != nil {
		return "FAILED: " + k.err.Error()
	}
	return fmt.Sprintf("%s, healthy again after %.1f s", k.how, k.down.Seconds())
}

// killAndRestart kills the state directory's serve with SIGKILL (after checking /proc that the PID
// is that server) and starts it again with the same command line through applianced.Start.
func killAndRestart(ctx context.Context, state, healthURL string, hc *http.Client) killResult {
	pid, err := servePID(state)
	if err != nil {
		return killResult{err: err}
	}
	k := killResult{pid: pid}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		k.err = fmt.Errorf("serve pid %d is gone: %w", pid, err)
		return k
	}
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	if !strings.Contains(string(raw), "\x00serve\x00") || !strings.Contains(string(raw), "\x00--state-dir\x00"+state+"\x00") {
		k.err = fmt.Errorf("pid %d is not `appliance serve --state-dir %s`", pid, state)
		return k
	}
	h, err := applianced.GetHealth(ctx, hc, healthURL)
	if err != nil {
		k.err = fmt.Errorf("serve unhealthy before the kill: %w", err)
		return k
	}
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		k.err = err
		return k
	}
	for gone(pid) == false {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(restartSec)
	s, err := applianced.Start(context.WithoutCancel(ctx), applianced.StartOptions{Argv: argv, StateDir: state, HealthURL: healthURL, Client: hc, Generation: h.Generation})
	k.down, k.err, k.how = time.Since(start), err, s.Detail
	return k
}

// gone reports whether pid has exited (no such process, or a zombie nobody reaped yet).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

func vipPresent(vip netip.Addr) bool {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip {
			return true
		}
	}
	return false
}

// vipSampler checks every 50 ms that the VIP is on an interface of this namespace.
type vipSampler struct {
	samples, absent int
	longest         time.Duration
}

func (v *vipSampler) run(ctx context.Context, vip netip.Addr) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			v.samples++
			if vipPresent(vip) {
				since = time.Time{}
				continue
			}
			v.absent++
			if since.IsZero() {
				since = now
				fmt.Printf("  %s VIP %s absent\n", now.Format("15:04:05.000"), vip)
			}
			v.longest = max(v.longest, now.Sub(since)+50*time.Millisecond)
		}
	}
}

// countReports compares every node's acknowledged sequence numbers with those recorded in its
// events (nodestate: one event per recorded report; every simulated report is distinct).
func countReports(state string, nodes []*simNode) (acked, recorded, lost int, err error) {
	store := nodestate.Open(statedir.Nodes(state))
	var errs []error
	for _, n := range nodes {
		evs, err := store.Events(n.cfg.Node)
		if err != nil {
			errs = append(errs, err)
		}
		have := map[int]bool{}
		for _, ev := range evs {
			if s, ok := strings.CutPrefix(ev.Detail, "sim seq="); ok {
				if k, err := strconv.Atoi(s); err == nil {
					have[k] = true
				}
			}
		}
		if _, err := store.Get(n.cfg.Node); err != nil && len(n.acked) > 0 {
			errs = append(errs, err)
		}
		for _, k := range n.acked {
			acked++
			if have[k] {
				recorded++
			} else {
				lost++
			}
		}
	}
	return acked, recorded, lost, errors.Join(errs...)
}

// checkStateFiles parses every file of the state directory whose format its name tells (.json,
// .jsonl, .yaml, .crt/.pem/.key) and lists the temporary files a writer left (".tmp" in the name).
// The registry's content-addressed storage is left to distribution.
func checkStateFiles(state string) (checked int, bad, temps []string) {
	_ = filepath.WalkDir(state, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", p, err))
			return nil
		}
		if d.IsDir() {
			if p == statedir.Registry(state) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.Contains(d.Name(), ".tmp") {
			temps = append(temps, p)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var perr error
		switch filepath.Ext(p) {
		case ".json":
			perr = parseJSON(p)
		case ".jsonl":
			perr = parseJSONL(p)
		case ".yaml", ".yml":
			perr = parseYAML(p)
		case ".crt", ".pem", ".key":
			perr = parsePEM(p)
		default:
			return nil
		}
		checked++
		if perr != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", p, perr))
		}
		return nil
	})
	return checked, bad, temps
}

func parseJSON(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var v any
	return json.Unmarshal(b, &v)
}

func parseJSONL(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	for i, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var v any
		if len(line) > 0 {
			if err := json.Unmarshal(line, &v); err != nil {
				return fmt.Errorf("line %d: %w", i+1, err)
			}
		}
	}
	return nil
}

func parseYAML(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var v any
	return yaml.Unmarshal(b, &v)
}

func parsePEM(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if blk, _ := pem.Decode(b); blk == nil {
		return errors.New("no PEM block")
	}
	return nil
}
