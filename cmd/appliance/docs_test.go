package main

import (
	"testing"

	"github.com/airgap-appliance/appliance/pkg/clidoc"
)

// TestCLIReferenceIsCurrent: docs/reference/cli holds exactly the pages the command tree generates.
func TestCLIReferenceIsCurrent(t *testing.T) {
	const dir = "docs/reference/cli"
	stale, err := clidoc.Stale(newRootCommand(), "../../"+dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range stale {
		t.Errorf("%s/%s is stale (the appliance command tree generates it otherwise, or not at all): run `make docs`", dir, name)
	}
}
