// Command hostagent runs on every node: it fetches its configuration from the appliance, configures
// the node (firewall, packages, containerd, CNI, keepalived, kubeadm) and reports each step.
// The logic lives in pkg/hostagent; this is the command line.
package main

import (
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
