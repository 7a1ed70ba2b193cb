package main

import (
	"testing"

	"github.com/airgap-appliance/appliance/pkg/clidoc"
)

// TestCLIReferenceIsCurrent: docs/reference/cli holds exactly the pages hostagent's command tree generates.
func TestCLIReferenceIsCurrent(t *testing.T) {
	clidoc.CheckCurrent(t, newRootCommand(), "../../docs/reference/cli")
}
