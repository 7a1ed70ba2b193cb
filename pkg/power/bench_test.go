package power

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

const benchBMCs = 50

// BenchmarkPowerOnAll50 powers on 50 simulated BMCs (one ipmi_sim process each, on distinct
// loopback addresses inside one namespace) plus one dead BMC (nothing listening), first one after
// another (RunAll with concurrency 1), then with PowerOnAll (concurrency 50), same run, same
// retry policy. Metrics: live_on_s (until the last live node is on), total_s (including the dead
// node's bounded failure) for both, and the speed-up ratio.
func BenchmarkPowerOnAll50(b *testing.B) {
	if p, ok := childParams(b); ok {
		benchChild(b, p)
		return
	}
	labns.RequireTool(b, "ipmitool")
	ns := labns.New(b, "pwbnch")
	params := map[string]string{}
	for i := range benchBMCs {
		s := startIPMISim(b, ns, fmt.Sprintf("b%02d", i), fmt.Sprintf("127.10.0.%d", i+1), 623)
		for k, v := range s.params(fmt.Sprintf("s%d.", i)) {
			params[k] = v
		}
	}
	runInNS(b, ns, params, true)
}

func benchChild(b *testing.B, p map[string]string) {
	ctx := context.Background()
	sims := make([]simBMC, benchBMCs)
	for i := range sims {
		sims[i] = simFromParams(p, fmt.Sprintf("s%d.", i))
		waitRMCP(b, sims[i].Addr, sims[i].Port)
	}
	ctrls := map[string]Controller{}
	for i, s := range sims {
		c, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: s.Addr, Port: s.Port, Username: s.User, Password: s.Password, CipherSuite: "3", Timeout: 3 * time.Second})
		must(b, err)
		ctrls[fmt.Sprintf("node-%02d", i)] = c
	}
	dead, err := NewBMC(ctx, BMCOptions{Kind: KindIPMI, Host: "127.10.0.250", Username: "admin", Password: "x", CipherSuite: "3", Timeout: 3 * time.Second})
	must(b, err)
	ctrls["node-dead"] = dead
	policy := RetryPolicy{MaxAttempts: 2, InitialInterval: 200 * time.Millisecond, NodeTimeout: 9 * time.Second}
	powerOn := func(ctx context.Context, c Controller) error { return c.PowerOn(ctx) }

	run := func(name string, f func() []Result) (liveOn, total time.Duration) {
		for _, s := range sims {
			must(b, os.WriteFile(filepath.Join(s.Dir, "power"), []byte("0\n"), 0o600))
		}
		start := time.Now()
		res := f()
		total = time.Since(start)
		for _, r := range res {
			if r.Node == "node-dead" {
				if r.Err == nil {
					b.Fatalf("%s: dead BMC reported success", name)
				}
				b.Logf("%s: dead BMC after %d attempts, %v: %v", name, r.Attempts, r.Duration.Round(time.Millisecond), r.Err)
				continue
			}
			if r.Err != nil {
				b.Fatalf("%s: %s: %v", name, r.Node, r.Err)
			}
		}
		for _, s := range sims {
			if got := readTrim(b, filepath.Join(s.Dir, "power")); got != "1" {
				b.Fatalf("%s: %s is not on", name, s.Addr)
			}
		}
		// When was the last live node on? Sequentially: when its own call ended, i.e. the sum
		// of the calls before it in order; concurrently: the slowest live node.
		var acc time.Duration
		for _, r := range res {
			acc += r.Duration
			if r.Node != "node-dead" {
				if name == "sequential" {
					liveOn = acc
				} else if r.Duration > liveOn {
					liveOn = r.Duration
				}
			}
		}
		return liveOn, total
	}
	for b.Loop() {
		seqLive, seqTotal := run("sequential", func() []Result { return RunAll(ctx, ctrls, 1, policy, powerOn) })
		parLive, parTotal := run("PowerOnAll", func() []Result { return PowerOnAll(ctx, ctrls, benchBMCs+1, policy) })
		b.ReportMetric(seqLive.Seconds(), "seq_live_on_s")
		b.ReportMetric(seqTotal.Seconds(), "seq_total_s")
		b.ReportMetric(parLive.Seconds(), "par_live_on_s")
		b.ReportMetric(parTotal.Seconds(), "par_total_s")
		b.ReportMetric(seqTotal.Seconds()/parTotal.Seconds(), "speedup_total_x")
		b.ReportMetric(seqLive.Seconds()/parLive.Seconds(), "speedup_live_x")
		fmt.Printf("power fan-out: %d live BMCs + 1 dead: sequential %.2fs (live nodes on at %.2fs), PowerOnAll %.2fs (live nodes on at %.2fs), speed-up %.1fx total, %.1fx live\n",
			benchBMCs, seqTotal.Seconds(), seqLive.Seconds(), parTotal.Seconds(), parLive.Seconds(), seqTotal.Seconds()/parTotal.Seconds(), seqLive.Seconds()/parLive.Seconds())
	}
}
