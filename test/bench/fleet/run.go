package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airgap-appliance/appliance/pkg/hostagent"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Result is one run's figures (one JSON line of -out).
type Result struct {
	Nodes      int                        `json:"nodes"`
	Pullers    int                        `json:"pullers"`
	Seconds    float64                    `json:"seconds"`
	Endpoints  map[string]EndpointFigures `json:"endpoints"`
	Errors     int                        `json:"errors"`
	Reports    int64                      `json:"reports"`
	ImagePulls int64                      `json:"imagePulls"`
	PullMBps   float64                    `json:"pullMBps"`
	// CPUSeconds is the appliance's utime+stime over the run (/proc/PID/stat), all endpoints.
	CPUSeconds float64 `json:"cpuSeconds"`
	// CPUmsPerReport is CPUSeconds per acknowledged report (GETs and pulls included).
	CPUmsPerReport float64 `json:"cpuMsPerReport"`
	// RSSMiB is the largest VmRSS sampled every second; HWMMiB the VmHWM at the end.
	RSSMiB    float64 `json:"rssMiB"`
	HWMMiB    float64 `json:"hwmMiB"`
	LoadStart string  `json:"loadStart"`
	LoadEnd   string  `json:"loadEnd"`
}

type loadFlags struct {
	state, prefix, bundle string
	duration              time.Duration
	pullers               int
	c                     cadence
}

func (l *loadFlags) register(fs *flag.FlagSet, duration time.Duration) {
	fs.StringVar(&l.state, "state", "", "the bootstrapped state directory (required)")
	fs.StringVar(&l.prefix, "prefix", "sim", "simulate the rendered nodes whose names start with this")
	fs.StringVar(&l.bundle, "bundle", "/var/cache/appliance/bundle", "the bundle the appliance serves (its images/ layout is the image set)")
	fs.DurationVar(&l.duration, "duration", duration, "how long the load runs")
	fs.IntVar(&l.pullers, "pullers", 2, "concurrent image pullers, each pulling the whole image set in a loop")
	fs.DurationVar(&l.c.step, "step", time.Second, "simulated work per hostagent step (jittered ±50%)")
	fs.DurationVar(&l.c.resync, "resync", 15*time.Second, "config re-fetch period once configured (hostagent: 60s)")
	fs.DurationVar(&l.c.uptime, "uptime", 30*time.Second, "a simulated boot's life before the node reboots")
	fs.DurationVar(&l.c.ramp, "ramp", 10*time.Second, "nodes start spread over this")
}

// procSampler follows one process's CPU time and memory.
type procSampler struct {
	pid    int
	maxRSS float64
}

func readProcStatus(pid int, field string) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// cpuSeconds is utime+stime of pid (/proc/PID/stat fields 14 and 15, in clock ticks of 1/100 s:
// USER_HZ is 100 on Linux).
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	u, err1 := strconv.ParseFloat(fields[11], 64)
	st, err2 := strconv.ParseFloat(fields[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (u + st) / 100, nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// servePID is the running `appliance serve` of state (its PID file, written by applianced.Start).
func servePID(state string) (int, error) {
	b, err := os.ReadFile(statedir.Serve(state) + "/pid")
	if err != nil {
		return 0, fmt.Errorf("appliance serve PID: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// runLoad runs the fleet and the pullers for l.duration (or until ctx ends) and returns the
// figures; nodes keep their acknowledged sequence numbers. onSecond, if set, is called every second.
func runLoad(ctx context.Context, l loadFlags, nodes []*simNode, onSecond func()) (*stats, Result, error) {
	st := newStats()
	res := Result{Nodes: len(nodes), Pullers: l.pullers, LoadStart: loadavg()}
	appURL := nodes[0].cfg.ApplianceURL
	u, err := url.Parse(appURL)
	if err != nil {
		return st, res, err
	}
	refs, err := imageSet(l.bundle+"/images", u.Host)
	if err != nil {
		return st, res, err
	}
	caPEM, err := hostagent.FetchCA(ctx, appURL, nodes[0].cfg.CAPin)
	if err != nil {
		return st, res, fmt.Errorf("the appliance is not answering: %w", err)
	}
	pid, err := servePID(l.state)
	if err != nil {
		return st, res, err
	}
	cpu0, err := cpuSeconds(pid)
	if err != nil {
		return st, res, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.duration)
	defer cancel()
	var reports, pulls counter
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() { runNode(ctx, n, l.c, st, &reports) })
	}
	for range l.pullers {
		wg.Go(func() { runPuller(ctx, refs, caPEM, st, &pulls) })
	}
	start := time.Now()
	maxRSS := 0.0
	tick := time.NewTicker(time.Second)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			if p, err := servePID(l.state); err == nil {
				if rss, err := readProcStatus(p, "VmRSS"); err == nil {
					maxRSS = max(maxRSS, rss)
				}
			}
			if onSecond != nil {
				onSecond()
			}
		}
	}
	tick.Stop()
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.LoadEnd = loadavg()
	res.Endpoints = st.figures()
	for _, f := range res.Endpoints {
		res.Errors += f.Errors
	}
	res.Reports, res.ImagePulls = reports.get(), pulls.get()
	st.mu.Lock()
	res.PullMBps = float64(st.bytes) / (1 << 20) / res.Seconds
	st.mu.Unlock()
	res.RSSMiB = maxRSS
	if p, err := servePID(l.state); err == nil && p == pid { // same process throughout (not soak)
		cpu1, err := cpuSeconds(pid)
		if err != nil {
			return st, res, err
		}
		res.CPUSeconds = cpu1 - cpu0
		if res.Reports > 0 {
			res.CPUmsPerReport = 1000 * res.CPUSeconds / float64(res.Reports)
		}
		res.HWMMiB, _ = readProcStatus(pid, "VmHWM")
	}
	return st, res, nil
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var l loadFlags
	l.register(fs, 40*time.Second)
	out := fs.String("out", "", "append the result as one JSON line to this file")
	_ = fs.Parse(args)
	if l.state == "" {
		return errors.New("run: -state is required")
	}
	nodes, err := loadNodes(l.state, l.prefix)
	if err != nil {
		return err
	}
	_, res, err := runLoad(context.Background(), l, nodes, nil)
	if err != nil {
		return err
	}
	printResult(res)
	if *out != "" {
		b, _ := json.Marshal(res)
		f, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write(append(b, '\n'))
		return err
	}
	return nil
}

func printResult(r Result) {
	fmt.Printf("N=%d nodes, %d pullers, %.0f s (load average %s -> %s)\n", r.Nodes, r.Pullers, r.Seconds, r.LoadStart, r.LoadEnd)
	fmt.Printf("  %-14s %8s %9s %9s %7s\n", "endpoint", "count", "p50 ms", "p99 ms", "errors")
	for _, ep := range endpoints {
		f := r.Endpoints[ep]
		fmt.Printf("  %-14s %8d %9.1f %9.1f %7d\n", ep, f.Count, f.P50ms, f.P99ms, f.Errors)
		if f.LastErr != "" {
			fmt.Printf("      last error: %.200s\n", f.LastErr)
		}
	}
	fmt.Printf("  reports %d, images pulled %d (%.0f MB/s), RSS max %.0f MiB\n", r.Reports, r.ImagePulls, r.PullMBps, r.RSSMiB)
	if r.HWMMiB == 0 {
		fmt.Println("  appliance CPU and VmHWM: not measured (serve was restarted during the run)")
		return
	}
	fmt.Printf("  appliance CPU %.1f s = %.2f ms per report (all endpoints and pulls included), VmHWM %.0f MiB\n", r.CPUSeconds, r.CPUmsPerReport, r.HWMMiB)
}

func tableCmd(args []string) error {
	if len(args) != 1 {
		return errors.New("table: want one results file")
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var rs []Result
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		return errors.New("table: no results")
	}
	ratio := func(v, base float64) string {
		if base == 0 {
			return "   -  "
		}
		return fmt.Sprintf("%5.2fx", v/base)
	}
	fmt.Printf("p50/p99 in ms per endpoint (ratio of p99 to the first row)\n%-6s", "N")
	for _, ep := range endpoints {
		fmt.Printf(" %-22s", ep)
	}
	fmt.Println()
	for _, r := range rs {
		fmt.Printf("%-6d", r.Nodes)
		for _, ep := range endpoints {
			f, b := r.Endpoints[ep], rs[0].Endpoints[ep]
			fmt.Printf(" %-22s", fmt.Sprintf("%.1f/%.1f %s", f.P50ms, f.P99ms, strings.TrimSpace(ratio(f.P99ms, b.P99ms))))
		}
		fmt.Println()
	}
	fmt.Printf("\n%-6s %7s %8s %9s %8s %16s %16s %16s %s\n", "N", "errors", "reports", "reports/s", "pull MB/s", "CPU ms/report", "RSS max MiB", "VmHWM MiB", "load average (start -> end)")
	for _, r := range rs {
		b := rs[0]
		fmt.Printf("%-6d %7d %8d %9.1f %8.0f %16s %16s %16s %s -> %s\n", r.Nodes, r.Errors, r.Reports, float64(r.Reports)/r.Seconds, r.PullMBps,
			fmt.Sprintf("%.2f %s", r.CPUmsPerReport, ratio(r.CPUmsPerReport, b.CPUmsPerReport)),
			fmt.Sprintf("%.0f %s", r.RSSMiB, ratio(r.RSSMiB, b.RSSMiB)),
			fmt.Sprintf("%.0f %s", r.HWMMiB, ratio(r.HWMMiB, b.HWMMiB)), r.LoadStart, r.LoadEnd)
	}
	for _, r := range rs {
		if r.Nodes == 500 {
			verdict := "met"
			if r.HWMMiB > 150 {
				verdict = "MISSED"
			}
			fmt.Printf("goal RSS <= 150 MiB at N=500: %s (VmHWM %.0f MiB)\n", verdict, r.HWMMiB)
		}
	}
	errs := 0
	for _, r := range rs {
		errs += r.Errors
	}
	if errs == 0 {
		fmt.Println("goal 0 errors: met")
	} else {
		fmt.Printf("goal 0 errors: MISSED (%d)\n", errs)
	}
	return nil
}
