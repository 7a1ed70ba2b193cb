package agentapi

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestEnrollSignedMessage: the signed message is the documented lines, MACs normalised and sorted,
// so a machine may list its NICs in any order and case; Check verifies it and refuses any change
// after signing.
func TestEnrollSignedMessage(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	pin := "sha256:" + strings.Repeat("ab", 32)
	ts := time.Date(2026, 11, 25, 6, 0, 0, 5, time.UTC)
	r := EnrollRequest{MACs: []string{"52:54:00:01:C8:00", "52-54-00-01-64-00"}, SystemUUID: "52540001-6400-4000-8000-525400016400",
		Timestamp: ts, Nonce: "AAAAAAAAAAAAAAAAAAAAAA", CAPin: pin}
	r.Sign(key)
	want := strings.Join([]string{"appliance-enroll-v1", pin, "2026-11-25T06:00:00.000000005Z", "AAAAAAAAAAAAAAAAAAAAAA", r.PublicKey,
		"52540001-6400-4000-8000-525400016400", "52:54:00:01:64:00,52:54:00:01:c8:00"}, "\n")
	if got := string(r.SignedMessage()); got != want {
		t.Errorf("signed message:\n%s\nwant:\n%s", got, want)
	}
	pub, macs, err := r.Check()
	if err != nil || !pub.Equal(key.Public()) || strings.Join(macs, ",") != "52:54:00:01:c8:00,52:54:00:01:64:00" {
		t.Fatalf("Check: %v %v %v", pub, macs, err)
	}
	for name, mutate := range map[string]func(*EnrollRequest){
		"timestamp": func(r *EnrollRequest) { r.Timestamp = r.Timestamp.Add(time.Second) },
		"nonce":     func(r *EnrollRequest) { r.Nonce = "BBBBBBBBBBBBBBBBBBBBBB" },
		"uuid":      func(r *EnrollRequest) { r.SystemUUID = "" },
		"macs":      func(r *EnrollRequest) { r.MACs = r.MACs[:1] },
		"pin":       func(r *EnrollRequest) { r.CAPin = "sha256:" + strings.Repeat("cd", 32) },
	} {
		c := r
		c.MACs = append([]string(nil), r.MACs...)
		mutate(&c)
		if _, _, err := c.Check(); !errors.Is(err, ErrBadEnrollRequest) || !strings.Contains(err.Error(), "signature: does not verify") {
			t.Errorf("%s changed after signing: %v, want the signature refused", name, err)
		}
	}
}
