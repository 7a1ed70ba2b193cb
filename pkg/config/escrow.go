package config

import (
	"fmt"
	"os"

	"github.com/airgap-appliance/appliance/pkg/escrow"
)

// Escrow keeps the appliance's state encrypted in the cluster (pkg/escrow, issue 35): the state
// directory's CAs and keys, node tokens, join secrets, pod-range allocations, node records and
// enrolment bindings, sealed with age to the recipients below and stored as the Secret
// kube-system/appliance-state-escrow, refreshed after every `appliance bootstrap` whose state
// changed. Without it that state lives only in stateDir on the bootstrap host: once the host is
// switched off after the hand-off, losing its disk means no appliance can ever add, remove or upgrade
// a node of the cluster again. Whoever holds a matching private key or the passphrase can restore
// the state into a new appliance (and so holds the cluster's CA keys): keep them offline.
//
// Name either recipients or passphraseFile: age encrypts to one passphrase alone, never together
// with keys. Optional; requires kubernetes.enabled.
type Escrow struct {
	// Recipients are age public keys the escrow is encrypted to, each "age1…" as `age-keygen` prints
	// it ("Public key: age1…"; `age-keygen -y KEYFILE` prints it again), or "age1pq1…" for a
	// post-quantum hybrid key (`age-keygen -pq`). Any one of the matching private keys opens the
	// escrow. Never write a private key (AGE-SECRET-KEY-…) here.
	Recipients []string `yaml:"recipients,omitempty"`
	// PassphraseFile names a file holding the passphrase the escrow is encrypted to (age's scrypt
	// recipient): one line, a trailing newline ignored (see ReadSecretFile), mode 0600 (a file
	// readable by others is refused). Use at least 16 characters, e.g. six random words: the Secret
	// can be read by every cluster admin, and scrypt makes each offline guess cost only about a CPU
	// second and 256 MiB.
	PassphraseFile string `yaml:"passphraseFile,omitempty"`
}

// IsZero reports whether nothing is set (escrow off; the YAML encoder leaves escrow out then).
func (e Escrow) IsZero() bool { return len(e.Recipients) == 0 && e.PassphraseFile == "" }

// EscrowRecipients returns whom the escrow is sealed to: the parsed escrow.recipients, or the passphrase
// read from escrow.passphraseFile; nil when escrow is not set. Errors name the field.
func (e Escrow) EscrowRecipients() ([]escrow.Recipient, error) {
	var out []escrow.Recipient
	for i, s := range e.Recipients {
		r, err := escrow.ParseRecipient(s)
		if err != nil {
			return nil, fmt.Errorf("escrow.recipients[%d]: %w", i, err)
		}
		out = append(out, r)
	}
	if e.PassphraseFile != "" {
		pass, err := ReadSecretFile(e.PassphraseFile)
		if err != nil {
			return nil, fmt.Errorf("escrow.passphraseFile: %w", err)
		}
		r, err := escrow.PassphraseRecipient(pass)
		if err != nil {
			return nil, fmt.Errorf("escrow.passphraseFile: %s: %w", e.PassphraseFile, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// MinEscrowPassphrase is the passphrase length below which Validate warns (escrow.passphraseFile).
const MinEscrowPassphrase = 16

// escrow validates the escrow section.
func (v *validator) escrow() {
	e := v.c.Escrow
	if e.IsZero() {
		if v.c.Handoff.Enabled && v.c.Kubernetes.IsEnabled() {
			v.warnf("escrow", "is not set: the appliance's state (cluster CA and keys, node tokens, pod ranges, node records) lives only in %s on this host, "+
				"which handoff.enabled lets you switch off; if that disk is lost, no appliance can add, remove or upgrade a node again. "+
				"Name an age public key in escrow.recipients (or a file in escrow.passphraseFile) to keep the state encrypted in the cluster", v.c.StateDir)
		}
		return
	}
	if !v.c.Kubernetes.IsEnabled() {
		v.errorf("escrow", "is set but kubernetes.enabled is false: the escrow is kept in the cluster, and there is none; remove escrow")
	}
	seen := map[string]string{}
	for i, s := range e.Recipients {
		path := fmt.Sprintf("escrow.recipients[%d]", i)
		r, err := escrow.ParseRecipient(s)
		if err != nil {
			v.errorf(path, "%v", err)
			continue
		}
		if first, dup := seen[r.String()]; dup {
			v.errorf(path, "is listed twice (also %s): remove one", first)
			continue
		}
		seen[r.String()] = path
	}
	f := e.PassphraseFile
	if f == "" {
		return
	}
	const path = "escrow.passphraseFile"
	if len(e.Recipients) > 0 {
		v.errorf(path, "cannot be combined with escrow.recipients: age encrypts to a passphrase alone (anyone holding a key could otherwise make an escrow the passphrase opens); keep one of the two")
	}
	if !v.opts.CheckFiles || !v.file(path, f, false) {
		return
	}
	st, err := os.Stat(f)
	if err != nil {
		v.errorf(path, "%s cannot be read: %v", f, err)
		return
	}
	switch perm := st.Mode().Perm(); {
	case perm&0o007 != 0:
		v.errorf(path, "%s is accessible to every user of this host (mode %04o): the passphrase unlocks the cluster's CA keys; chmod 600 it", f, perm)
		return
	case perm&0o070 != 0:
		v.warnf(path, "%s is readable by its group (mode %04o): the passphrase unlocks the cluster's CA keys; chmod 600 it", f, perm)
	}
	secret, err := ReadSecretFile(f)
	switch {
	case err != nil:
		v.errorf(path, "%s cannot be read: %v", f, err)
	case len(secret) == 0:
		v.errorf(path, "%s is empty: write the escrow passphrase into it (one line)", f)
	case len(secret) < MinEscrowPassphrase:
		v.warnf(path, "%s holds a passphrase of %d characters: every cluster admin can read the escrow and guess offline (scrypt makes each guess cost about a CPU second and 256 MiB); use %d or more, e.g. six random words", f, len(secret), MinEscrowPassphrase)
	}
}
