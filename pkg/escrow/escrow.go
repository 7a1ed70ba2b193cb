// Package escrow keeps the part of the appliance's state directory that a future appliance needs
// (Contents: the CAs and their keys, node tokens, join secrets, pod-range allocations, node records,
// enrolment bindings, the recorded VRRP instance, the hand-off's record) encrypted, so that it can
// live in the cluster it describes (issue 35, item 2) and a freshly booted appliance can take over
// when the bootstrap host and its disk are gone (item 3).
//
// An escrow is one blob:
//
//	age( gzip( tar(
//	  escrow-manifest.json        Manifest: cluster name, CA pins, created, appliance version,
//	                              SHA-256 and mode of every file, ContentDigest
//	  state/<path>                each escrowed file, its path relative to the state directory
//	)))
//
// The tar is deterministic (entries sorted, fixed owner and mtime, modes kept), so the same state and
// the same Info seal to the same plaintext. Encryption is filippo.io/age (format v1: X25519 or
// ML-KEM hybrid recipients, or one scrypt passphrase; ChaCha20-Poly1305 payload): age is
// authenticated, so a changed byte anywhere makes Open fail, and the manifest's digests then check
// every file once more. This package is the only one that imports age (test/layout); callers hold
// Recipient and Identity values.
//
// Open decrypts and checks a blob without writing anything; Restore writes it into an empty state
// directory, all or nothing. Refresh and Fetch keep the blob in the cluster as a Secret
// (kube-system/appliance-state-escrow) through pkg/kubeapi; Refresh writes only when the escrowed
// content or the recipients changed.
package escrow

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"filippo.io/age"
)

// Sentinel errors callers test with errors.Is. Every refusal writes nothing.
var (
	// ErrWrongIdentity: none of the identities (keys, passphrase) opens the escrow.
	ErrWrongIdentity = errors.New("no identity opens the escrow")
	// ErrTampered: the blob is not an intact escrow (a changed or cut byte, a file whose digest does
	// not match the manifest, an entry outside Contents).
	ErrTampered = errors.New("the escrow is damaged or was tampered with")
	// ErrOtherCluster: the escrow holds the state of another cluster than the one expected.
	ErrOtherCluster = errors.New("the escrow belongs to another cluster")
	// ErrNotEmpty: Restore's target directory already holds files.
	ErrNotEmpty = errors.New("the target state directory is not empty")
	// ErrTooLarge: the state or the sealed escrow is larger than the escrow can hold.
	ErrTooLarge = errors.New("too large for the escrow")
	// ErrNoRecipient: Seal was given nothing to encrypt to, or a passphrase together with other
	// recipients (age encrypts to one passphrase alone: a key holder could otherwise forge a file
	// the passphrase opens).
	ErrNoRecipient = errors.New("no usable escrow recipient")
	// ErrNoEscrow: the cluster holds no escrow Secret.
	ErrNoEscrow = errors.New("the cluster holds no appliance state escrow")
)

// scryptWorkFactor is log2 of the scrypt cost of a passphrase recipient: age's default, 2^18 (about a
// second and 256 MiB on a current machine). Tests lower it.
var scryptWorkFactor = 18

// Recipient is someone an escrow is sealed to: an age public key (ParseRecipient) or a passphrase
// (PassphraseRecipient). The zero value is not usable.
type Recipient struct {
	r age.Recipient
	// id is the public form for people and for RecipientsDigest: the age1… string, or "passphrase".
	id string
	// pass is the passphrase of a passphrase recipient (Refresh checks the existing escrow with it).
	pass string
}

// String is the recipient's public form: the age1… key, or "passphrase" (never the passphrase).
func (r Recipient) String() string { return r.id }

// IsPassphrase reports whether r is a passphrase recipient.
func (r Recipient) IsPassphrase() bool { return r.pass != "" }

// ParseRecipient parses an age public key: "age1…" (X25519, what `age-keygen` prints as "public
// key") or "age1pq1…" (the ML-KEM-768 + X25519 hybrid of `age-keygen -pq`). Leading and trailing
// space is ignored. The error never repeats a private key pasted by mistake.
func ParseRecipient(s string) (Recipient, error) {
	s = strings.TrimSpace(s)
	var (
		r   age.Recipient
		err error
	)
	switch {
	case strings.HasPrefix(strings.ToUpper(s), "AGE-SECRET-KEY-"):
		return Recipient{}, errors.New("is an age private key (AGE-SECRET-KEY-…), which must never be in bootstrap.yaml: write its public key instead (`age-keygen -y KEYFILE` prints it) and keep the private key offline")
	case strings.HasPrefix(s, "age1pq1"):
		r, err = age.ParseHybridRecipient(s)
	case strings.HasPrefix(s, "age1"):
		r, err = age.ParseX25519Recipient(s)
	default:
		return Recipient{}, fmt.Errorf("%q is not an age public key: write the \"age1…\" line `age-keygen` prints as the public key", clip(s))
	}
	if err != nil {
		return Recipient{}, fmt.Errorf("%q is not a valid age public key (%v): copy the whole \"age1…\" string `age-keygen` printed", clip(s), err)
	}
	return Recipient{r: r, id: s}, nil
}

// PassphraseRecipient seals to a passphrase (age's scrypt recipient). It must be the only recipient
// of a Seal. An empty passphrase is refused.
func PassphraseRecipient(passphrase []byte) (Recipient, error) {
	if len(passphrase) == 0 {
		return Recipient{}, errors.New("the escrow passphrase is empty")
	}
	sr, err := age.NewScryptRecipient(string(passphrase))
	if err != nil {
		return Recipient{}, err
	}
	sr.SetWorkFactor(scryptWorkFactor)
	return Recipient{r: sr, id: "passphrase", pass: string(passphrase)}, nil
}

// RecipientsDigest is "sha256:<hex>" over the sorted public forms of rs: it says whether an escrow
// was sealed to the same recipients without naming them. Two passphrases have the same digest
// (Refresh tries the passphrase on the existing escrow instead).
func RecipientsDigest(rs []Recipient) string {
	ids := make([]string, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, r.id)
	}
	slices.Sort(ids)
	sum := sha256.Sum256([]byte(strings.Join(ids, "\n")))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// checkRecipients refuses an empty list, a zero Recipient and a passphrase mixed with others.
func checkRecipients(rs []Recipient) ([]age.Recipient, error) {
	if len(rs) == 0 {
		return nil, fmt.Errorf("%w: name an age public key or a passphrase (bootstrap.yaml escrow)", ErrNoRecipient)
	}
	out := make([]age.Recipient, 0, len(rs))
	for _, r := range rs {
		if r.r == nil {
			return nil, fmt.Errorf("%w: an unset recipient", ErrNoRecipient)
		}
		if r.IsPassphrase() && len(rs) > 1 {
			return nil, fmt.Errorf("%w: a passphrase must be the escrow's only recipient (age cannot combine it with keys)", ErrNoRecipient)
		}
		out = append(out, r.r)
	}
	return out, nil
}

// Identity opens an escrow: an age private key (ParseIdentities) or a passphrase
// (PassphraseIdentity). The zero value is not usable.
type Identity struct{ id age.Identity }

// ParseIdentities reads an age identity file: one "AGE-SECRET-KEY-1…" (or "AGE-SECRET-KEY-PQ-1…")
// per line, "#" comments and blank lines ignored, as `age-keygen -o FILE` writes it. Errors never
// contain key material.
func ParseIdentities(r io.Reader) ([]Identity, error) {
	ids, err := age.ParseIdentities(r)
	if err != nil {
		return nil, fmt.Errorf("age identity file: %w", err)
	}
	out := make([]Identity, len(ids))
	for i, id := range ids {
		out[i] = Identity{id: id}
	}
	return out, nil
}

// PassphraseIdentity opens an escrow sealed to passphrase.
func PassphraseIdentity(passphrase []byte) (Identity, error) {
	if len(passphrase) == 0 {
		return Identity{}, errors.New("the escrow passphrase is empty")
	}
	id, err := age.NewScryptIdentity(string(passphrase))
	if err != nil {
		return Identity{}, err
	}
	return Identity{id: id}, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
