// Command fleet is the load generator of test/bench/fleet.sh and test/bench/soak.sh: N simulated
// nodes and a few image pullers against ONE real `appliance serve`, run inside the lab's bootstrap
// namespace. Nothing here is a fake of the appliance: every request goes over TLS to the real server.
//
//	fleet config -in test/lab/bootstrap.yaml -out FILE -nodes N -lab-dir DIR
//	    writes the lab's configuration with N extra pre-installed workers sim0001..simN (power kind
//	    ssh, never powered nor upgraded: bootstrap runs with --skip-phases power,converge, and the
//	    phases that need converged nodes, upgrade and handoff, then skip themselves), in the extra node
//	    networks 10.110.0.0/16 and 10.210.0.0/16, so that tokens, Ignition configs and node configs
//	    are rendered for each.
//	fleet run -state DIR [-duration 40s] [-pullers 2] [-out results.jsonl]
//	    the fleet load for -duration; prints a summary and appends one JSON line to -out.
//	fleet table results.jsonl
//	    the table of several runs, each figure beside its ratio to the first run.
//	fleet soak -state DIR [-duration 600s] [-kill-every 60s] [-vip 10.100.0.100]
//	    the fleet load while `appliance serve` is killed -9 every -kill-every and started again, then
//	    checks that no acknowledged report is missing from the node records, that every state file
//	    parses, and that the VIP never left this namespace (sampled every 50 ms).
//
// A simulated node speaks the real agent protocol through the project's own node code
// (pkg/hostagent): the CA fetched against the pin from the node's rendered hostagent.yaml
// (hostagent.FetchCA), its Ignition config as an enrolled node fetches it (the token in the
// Authorization header, Ignition's Accept header, trusting only that CA), then hostagent.Client: the node config, and for every step of
// agentapi.Plan a "running" and a "done" report, each after the previous one was acknowledged
// (retried with backoff while the appliance is away, as hostagent's reporter does). The step work
// itself is simulated (-step, jittered ±50%), the kubeadm join gate is not waited for, and the
// cadence is compressed so a bench minute holds several boots: after its plan a node re-fetches
// its config every -resync (hostagent: 60 s) and reboots (a new boot ID) after -uptime. Every
// report's detail carries a per-node sequence number ("sim seq=K"), which makes every report a
// distinct record (nodestate ignores exact repeats) and lets soak count them.
//
// Pullers fetch the bundle's real image set (its OCI layout's index) from the appliance's /v2/ with
// go-containerregistry, every platform's manifest, config and layer, digests verified, in a loop.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "config":
		err = configCmd(os.Args[2:])
	case "run":
		err = runCmd(os.Args[2:])
	case "soak":
		err = soakCmd(os.Args[2:])
	case "table":
		err = tableCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: fleet config|run|soak|table [flags] (see the package documentation)")
	os.Exit(2)
}
