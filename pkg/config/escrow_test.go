package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Throwaway age keys (age-keygen), for the escrow section.
const (
	testAgeRecipient1 = "age1g75egrjfyf9crvzrmtdyjn8pgkx7406fpjatw345nq5s6l0xwdgswu4wxu"
	testAgeRecipient2 = "age1fssse872s2pqefvw7tnzmne9uthrqy3e09ceftv2x8qynxdkwyhsrv98zm"
	testAgeIdentity1  = "AGE-SECRET-KEY-1UK36W5H6LYRKYQY2PU9VH3K3STGV86JS68X7KZ8ZDR9LMXD3DKJQCK50DH"
)

func TestEscrowValid(t *testing.T) {
	for name, tt := range map[string]struct {
		extra          string
		wantRecipients []string
		wantFile       string
	}{
		"absent: escrow off":     {},
		"one recipient":          {extra: "escrow:\n  recipients: [" + testAgeRecipient1 + "]\n", wantRecipients: []string{testAgeRecipient1}},
		"two recipients":         {extra: "escrow:\n  recipients:\n  - " + testAgeRecipient1 + "\n  - " + testAgeRecipient2 + "\n", wantRecipients: []string{testAgeRecipient1, testAgeRecipient2}},
		"a passphrase file":      {extra: "escrow:\n  passphraseFile: /etc/appliance/escrow.pass\n", wantFile: "/etc/appliance/escrow.pass"},
		"with hand-off, escrow":  {extra: "handoff:\n  enabled: true\nescrow:\n  recipients: [" + testAgeRecipient1 + "]\n", wantRecipients: []string{testAgeRecipient1}},
		"no hand-off, no escrow": {extra: "handoff:\n  enabled: false\n"},
	} {
		t.Run(name, func(t *testing.T) {
			c, warns, errs := labWith(t, tt.extra)
			if len(errs) > 0 || len(warns) > 0 {
				t.Fatalf("errors %v, warnings %v", errs, warns)
			}
			if !slices.Equal(c.Escrow.Recipients, tt.wantRecipients) || c.Escrow.PassphraseFile != tt.wantFile {
				t.Errorf("escrow %+v", c.Escrow)
			}
			if c.Escrow.IsZero() != (tt.wantRecipients == nil && tt.wantFile == "") {
				t.Errorf("IsZero() = %v", c.Escrow.IsZero())
			}
			// Marshal leaves an unset escrow out and round-trips a set one.
			out, err := Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), "escrow:") == c.Escrow.IsZero() {
				t.Errorf("Marshal:\n%s", out)
			}
		})
	}
}

// TestEscrowInvalid asserts the exact error paths, each with what its message must say.
func TestEscrowInvalid(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		edits []string
		want  []fieldWant
	}{
		{"not an age key", "escrow:\n  recipients: [ssh-ed25519 AAAA]\n", nil, []fieldWant{
			{"escrow.recipients[0]", `"ssh-ed25519 AAAA" is not an age public key: write the "age1…" line`}}},
		{"a broken age key", "escrow:\n  recipients: [" + testAgeRecipient1[:len(testAgeRecipient1)-1] + "]\n", nil, []fieldWant{
			{"escrow.recipients[0]", "is not a valid age public key"}}},
		{"an empty entry", "escrow:\n  recipients: [" + testAgeRecipient1 + ", \"\"]\n", nil, []fieldWant{
			{"escrow.recipients[1]", `"" is not an age public key`}}},
		{"a private key", "escrow:\n  recipients: [" + testAgeIdentity1 + "]\n", nil, []fieldWant{
			{"escrow.recipients[0]", "is an age private key (AGE-SECRET-KEY-…), which must never be in bootstrap.yaml: write its public key instead"}}},
		{"twice", "escrow:\n  recipients: [" + testAgeRecipient1 + ", " + testAgeRecipient1 + "]\n", nil, []fieldWant{
			{"escrow.recipients[1]", "is listed twice (also escrow.recipients[0])"}}},
		{"both", "escrow:\n  recipients: [" + testAgeRecipient1 + "]\n  passphraseFile: /p\n", nil, []fieldWant{
			{"escrow.passphraseFile", "cannot be combined with escrow.recipients: age encrypts to a passphrase alone"}}},
		{"without Kubernetes", "escrow:\n  recipients: [" + testAgeRecipient1 + "]\nkubernetes:\n  enabled: false\n", []string{"nodes:", "nodes:"}, []fieldWant{
			{"escrow", "is set but kubernetes.enabled is false: the escrow is kept in the cluster, and there is none"}}},
		{"the passphrase inline", "escrow:\n  passphrase: hunter2\n", nil, []fieldWant{{"escrow.passphrase", ""}}},
		{"a scalar", "escrow: " + testAgeRecipient1 + "\n", nil, []fieldWant{{"escrow", ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, tt.extra, tt.edits...)
			requireExactly(t, errs, tt.want)
			if strings.Contains(errs.Error(), testAgeIdentity1) {
				t.Errorf("an error repeats the private key: %v", errs)
			}
		})
	}
}

// TestEscrowWarning: with the hand-off on and no escrow, Validate warns naming the field; with
// either off it does not.
func TestEscrowWarning(t *testing.T) {
	_, warns, errs := labWith(t, "handoff:\n  enabled: true\n")
	if len(errs) > 0 || len(warns) != 1 || warns[0].Path != "escrow" ||
		!strings.Contains(warns[0].Msg, "is not set: the appliance's state (cluster CA and keys, node tokens, pod ranges, node records) lives only in /var/lib/appliance on this host") ||
		!strings.Contains(warns[0].Msg, "Name an age public key in escrow.recipients (or a file in escrow.passphraseFile)") {
		t.Errorf("warnings %v, errors %v", warns, errs)
	}
}

// TestEscrowPassphraseFile checks escrow.passphraseFile with CheckFiles: only its own findings are
// looked at (the lab's other files do not exist here).
func TestEscrowPassphraseFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "correct horse battery staple\n", 0o600)
	tests := []struct {
		name, path      string
		wantErr, wantWn string
	}{
		{"good", good, "", ""},
		{"missing", filepath.Join(dir, "nope"), "does not exist: create it or fix the path", ""},
		{"a directory", dir, "is not a regular file", ""},
		{"world-readable", file("world", "correct horse battery staple\n", 0o604), "is accessible to every user of this host (mode 0604): the passphrase unlocks the cluster's CA keys; chmod 600 it", ""},
		{"group-readable", file("group", "correct horse battery staple\n", 0o640), "", "is readable by its group (mode 0640)"},
		{"empty", file("empty", "\n", 0o600), "is empty: write the escrow passphrase into it", ""},
		{"short", file("short", "hunter2\n", 0o600), "", "holds a passphrase of 7 characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := labConfig(t)
			c.Escrow.PassphraseFile = tt.path
			warns, errs := Validate(c, ValidateOptions{CheckFiles: true})
			const path = "escrow.passphraseFile"
			e := findErr(errs, path)
			switch {
			case tt.wantErr == "" && e != nil:
				t.Errorf("error %v", e)
			case tt.wantErr != "" && (e == nil || !strings.Contains(e.Msg, tt.wantErr)):
				t.Errorf("error %v, want %q", e, tt.wantErr)
			}
			var wn []string
			for _, w := range warns {
				if w.Path == path {
					wn = append(wn, w.Msg)
				}
			}
			switch {
			case tt.wantWn == "" && len(wn) > 0:
				t.Errorf("warnings %v", wn)
			case tt.wantWn != "" && (len(wn) != 1 || !strings.Contains(wn[0], tt.wantWn)):
				t.Errorf("warnings %v, want %q", wn, tt.wantWn)
			}
		})
	}
}
