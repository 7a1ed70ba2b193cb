// Command hostagent runs on every node: it fetches its configuration from the appliance, configures
// the node (firewall, containerd mirrors, keepalived, an API health stand-in) and reports each step.
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
