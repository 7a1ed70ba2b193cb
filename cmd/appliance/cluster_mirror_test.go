package main

import (
	"strings"
	"testing"
)

// TestClusterMirrorFlags: `appliance cluster-mirror` reports every missing or wrong flag at once,
// each by its name, before it listens or writes anything.
func TestClusterMirrorFlags(t *testing.T) {
	dir := t.TempDir()
	_, _, err := runCLI("cluster-mirror", "--upstream", "http://10.100.0.2:8443", "--dir", dir, "--listen", "127.0.0.1:0")
	if err == nil {
		t.Fatal("cluster-mirror without its CA and certificate succeeded")
	}
	for _, want := range []string{`--upstream: "http://10.100.0.2:8443" is not https://HOST:PORT`, "--ca-file: required", "--cert-file: required", "--key-file: required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}
