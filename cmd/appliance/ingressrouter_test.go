package main

import (
	"strings"
	"testing"
)

// TestIngressRouterFlags: `appliance ingress-router` reports every missing or wrong flag at once,
// each by its name, before it listens or contacts an API server.
func TestIngressRouterFlags(t *testing.T) {
	_, _, err := runCLI("ingress-router", "--listen", "80", "--health-listen", "80", "--ingress-class", "", "--status-address", "vip", "--drain-delay", "-1s")
	if err == nil {
		t.Fatal("ingress-router without a kubeconfig succeeded")
	}
	for _, want := range []string{
		`--kubeconfig: required (a kubeconfig file, or "in-cluster")`,
		`--listen: "80" is not [HOST]:PORT`,
		`--health-listen: "80" is not [HOST]:PORT`,
		`--listen and --health-listen: both "80"; give different ports`,
		`--ingress-class: empty; give the IngressClass name`,
		`--status-address: "vip" is not an IP address (give the ingress VIP)`,
		`--drain-delay: -1s is negative; give 0 to stop at once`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// A kubeconfig that is not there is named too, before anything listens.
	_, _, err = runCLI("ingress-router", "--kubeconfig", "/nonexistent/router.conf", "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0", "--listen-tls", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "--kubeconfig /nonexistent/router.conf") {
		t.Errorf("missing kubeconfig: %v", err)
	}
}
