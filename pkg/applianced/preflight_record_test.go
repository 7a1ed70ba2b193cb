package applianced

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestPreflightRecord checks how serve's claim check (checkVIPClaim) uses the record of a pre-flight
// that `appliance bootstrap` ran ahead (PreflightAhead): a fresh record for the same instances is
// taken (once) instead of listening again; a stale one, one for other instances or a corrupt one is
// dropped and the claim is checked again. The instance names an interface that does not exist, so a
// check that really runs fails: that is how the test tells "checked again" from "record taken".
func TestPreflightRecord(t *testing.T) {
	kc := keepalived.Config{RouterID: "appliance", Instances: []keepalived.Instance{{
		Name: "api-vip", Interface: "nosuchif0", SourceIP: netip.MustParseAddr("10.99.0.2"),
		Peers: []netip.Addr{netip.MustParseAddr("10.99.0.11")}, VIP: netip.MustParsePrefix("10.99.0.100/24"),
		VirtualRouterID: 42, Priority: 150, AdvertInterval: 250 * time.Millisecond,
	}}}
	other := kc
	other.Instances = []keepalived.Instance{kc.Instances[0]}
	other.Instances[0].VirtualRouterID = 43
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()

	for _, tc := range []struct {
		name   string
		record func(t *testing.T, path string)
		taken  bool
	}{
		{"fresh record for the same instances", func(t *testing.T, path string) { writeRecord(t, path, kc, time.Now()) }, true},
		{"no record", func(*testing.T, string) {}, false},
		{"record older than the TTL", func(t *testing.T, path string) {
			writeRecord(t, path, kc, time.Now().Add(-preflightRecordTTL-time.Second))
		}, false},
		{"record from the future", func(t *testing.T, path string) { writeRecord(t, path, kc, time.Now().Add(time.Hour)) }, false},
		{"record for another VRID", func(t *testing.T, path string) { writeRecord(t, path, other, time.Now()) }, false},
		{"corrupt record", func(t *testing.T, path string) {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := writeState(t, kc)
			path := filepath.Join(statedir.Keepalived(state), preflightRecordFile)
			tc.record(t, path)
			err := checkVIPClaim(ctx, state, log)
			if tc.taken && err != nil {
				t.Errorf("the record was not taken: the claim was checked again: %v", err)
			}
			if !tc.taken && err == nil {
				t.Errorf("checkVIPClaim returned nil without a usable record, on an interface that does not exist")
			}
			if _, err := os.Stat(path); err == nil {
				t.Errorf("the record is still there after the claim check: it must be good for one claim only")
			}
		})
	}

	t.Run("a failed pre-flight records nothing", func(t *testing.T) {
		state := writeState(t, kc)
		if err := PreflightAhead(ctx, state, kc, nil, log); err == nil {
			t.Fatal("PreflightAhead on an interface that does not exist returned nil")
		}
		if _, err := os.Stat(filepath.Join(statedir.Keepalived(state), preflightRecordFile)); err == nil {
			t.Error("a failed pre-flight left a record")
		}
	})
}

func writeRecord(t *testing.T, path string, kc keepalived.Config, passed time.Time) {
	t.Helper()
	b, err := json.Marshal(preflightRecord{Checks: preflightChecks(kc), Passed: passed})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
