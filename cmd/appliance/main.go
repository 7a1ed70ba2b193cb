// Command appliance is the bootstrap appliance for air-gapped bare-metal Kubernetes installs.
package main

import (
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
