package debrepo

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"
	pgperrors "github.com/ProtonMail/go-crypto/openpgp/errors"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrKeyring: a keyring file cannot be read or holds no usable OpenPGP public key.
	ErrKeyring = errors.New("unusable OpenPGP keyring")
	// ErrSignature: a Release file's signature is missing, malformed, or does not verify against the
	// source's keyring (apt-secure(8): apt refuses such a repository). *SignatureError wraps it.
	ErrSignature = errors.New("repository signature does not verify")
	// ErrExpired: a Release file's Valid-Until has passed, or its Date lies in the future (apt refuses
	// both: "Release file ... is expired" / "is not valid yet").
	ErrExpired = errors.New("release file is not currently valid")
	// ErrRelease: a Release file is malformed or does not list what is needed (SHA256 field, the
	// Packages index of a component).
	ErrRelease = errors.New("invalid Release file")
	// ErrHashMismatch: a downloaded file's size or SHA-256 differs from the one the signed chain
	// lists for it (apt's "Hash Sum mismatch").
	ErrHashMismatch = errors.New("hash sum mismatch")
	// ErrPackages: a Packages index is malformed.
	ErrPackages = errors.New("invalid Packages index")
)

// maxKeyring bounds how much of a keyring file is read; Debian's archive keyring is about 100 KiB.
const maxKeyring = 16 << 20

// Keyring is a set of OpenPGP public keys read from one file, like the file apt's Signed-By names.
type Keyring struct {
	// Path is the file it was read from.
	Path     string
	entities openpgp.EntityList
}

// ReadKeyring reads an OpenPGP keyring file: binary transferable public keys (RFC 9580 §10.1,
// concatenated, e.g. /usr/share/keyrings/debian-archive-keyring.gpg or `gpg --export` output) or one
// ASCII-armored "PGP PUBLIC KEY BLOCK" (an .asc file). Keys of algorithms go-crypto does not support
// are skipped as long as one key is readable. Errors wrap ErrKeyring.
func ReadKeyring(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyring, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyring+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrKeyring, path, err)
	}
	if len(data) > maxKeyring {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrKeyring, path, maxKeyring)
	}
	el, err := parseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrKeyring, path, err)
	}
	for _, e := range el {
		if e.PrivateKey != nil {
			return nil, fmt.Errorf("%w: %s holds a private key; name the public keyring (gpg --export)", ErrKeyring, path)
		}
	}
	return &Keyring{Path: path, entities: el}, nil
}

// isArmored reports whether data is ASCII armor (RFC 9580 §6.2) rather than binary packets.
func isArmored(data []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("-----BEGIN PGP "))
}

func parseKeyring(data []byte) (openpgp.EntityList, error) {
	if len(data) == 0 {
		return nil, errors.New("empty file")
	}
	if isArmored(data) {
		return openpgp.ReadArmoredKeyRing(bytes.NewReader(data))
	}
	return openpgp.ReadKeyRing(bytes.NewReader(data))
}

// KeyIDs returns the long key IDs (16 upper-case hex digits) of the keyring's primary keys, in file
// order.
func (k *Keyring) KeyIDs() []string {
	ids := make([]string, 0, len(k.entities))
	for _, e := range k.entities {
		ids = append(ids, fmt.Sprintf("%016X", e.PrimaryKey.KeyId))
	}
	return ids
}

// SignatureError says why a Release file of a source was refused: which source and suite, which file,
// which keys made the signatures (SeenKeyIDs: fingerprints when the signature names one, else long
// key IDs) and which keys the keyring holds. It wraps ErrSignature and the underlying cause.
type SignatureError struct {
	// URI and Suite identify the source (empty when verifying a file outside FetchIndex).
	URI, Suite string
	// File is "InRelease" or "Release.gpg".
	File string
	// Keyring is the keyring file's path; KeyringIDs its primary keys' long key IDs.
	Keyring    string
	KeyringIDs []string
	// SeenKeyIDs are the issuers of the signature packets found (none when the signature is
	// missing or unparsable).
	SeenKeyIDs []string
	// Err is the cause, e.g. openpgp's "signature made by unknown entity".
	Err error
}

// Error renders the whole story on one line, e.g. `https://deb.example/debian bookworm: InRelease:
// repository signature does not verify against keyring /k.gpg (holds 6ED0E7B82643E131): signed by
// B8E5F13176D2A7A7: openpgp: signature made by unknown entity`.
func (e *SignatureError) Error() string {
	var b strings.Builder
	if e.URI != "" {
		fmt.Fprintf(&b, "%s %s: ", e.URI, e.Suite)
	}
	fmt.Fprintf(&b, "%s: %s against keyring %s (holds %s)", e.File, ErrSignature, e.Keyring, listOrNone(e.KeyringIDs))
	if len(e.SeenKeyIDs) > 0 {
		fmt.Fprintf(&b, ": signed by %s", strings.Join(e.SeenKeyIDs, ", "))
	} else {
		b.WriteString(": no signature found")
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "no keys"
	}
	return strings.Join(s, ", ")
}

// Unwrap returns ErrSignature and the cause.
func (e *SignatureError) Unwrap() []error { return []error{ErrSignature, e.Err} }

// Verified is the outcome of a signature check.
type Verified struct {
	// Signed is the content the signature covers: the Release text (for InRelease, the clear-signed
	// text with dash-escaping removed).
	Signed []byte
	// SignerFingerprints are the primary-key fingerprints (upper-case hex) of the keyring keys whose
	// signatures verified, in signature order.
	SignerFingerprints []string
	// Issuers name the key of every signature packet, verified or not (the signing key's or
	// subkey's fingerprint when the signature carries it, else its long key ID).
	Issuers []string
}

// VerifyInRelease checks a clear-signed InRelease file (RFC 9580 §7) against keyring at time now and
// returns the signed Release text. Like apt it accepts the file when at least one signature by a key
// of the keyring verifies and none by a keyring key is bad; signatures by keys outside the keyring are
// ignored, and so are signatures by expired or revoked keys if another one verifies. Text outside the
// signed block is refused (apt does the same since the InRelease parsing fixes of 2019). Errors are
// *SignatureError.
func VerifyInRelease(data []byte, kr *Keyring, now time.Time) (*Verified, error) {
	fail := func(seen []string, err error) (*Verified, error) {
		return nil, &SignatureError{File: "InRelease", Keyring: kr.Path, KeyringIDs: kr.KeyIDs(), SeenKeyIDs: seen, Err: err}
	}
	if !bytes.HasPrefix(data, []byte("-----BEGIN PGP SIGNED MESSAGE-----")) {
		return fail(nil, errors.New("not a clear-signed message (no leading \"-----BEGIN PGP SIGNED MESSAGE-----\" line)"))
	}
	block, rest := decodeClearsigned(data)
	if block == nil {
		return fail(nil, errors.New("malformed clear-signed message"))
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return fail(nil, errors.New("data after the signature block"))
	}
	if block.ArmoredSignature == nil || block.ArmoredSignature.Type != openpgp.SignatureType {
		return fail(nil, errors.New("no PGP SIGNATURE block"))
	}
	sig, err := io.ReadAll(block.ArmoredSignature.Body)
	if err != nil {
		return fail(nil, fmt.Errorf("read signature armor: %w", err))
	}
	fps, seen, err := verifySignatures(block.Bytes, sig, kr, now)
	if err != nil {
		return fail(seen, err)
	}
	return &Verified{Signed: block.Plaintext, SignerFingerprints: fps, Issuers: seen}, nil
}

// decodeClearsigned is clearsign.Decode behind a recover: go-crypto v1.4.1 panics (slice bounds out
// of range) on a clear-signed message with an empty body, which any server can send.
func decodeClearsigned(data []byte) (b *clearsign.Block, rest []byte) {
	defer func() {
		if recover() != nil {
			b, rest = nil, data
		}
	}()
	return clearsign.Decode(data)
}

// VerifyDetached checks a detached signature (Release.gpg: binary or ASCII-armored) over release
// against keyring at time now, with VerifyInRelease's acceptance rule. Errors are *SignatureError.
func VerifyDetached(release, signature []byte, kr *Keyring, now time.Time) (*Verified, error) {
	fail := func(seen []string, err error) (*Verified, error) {
		return nil, &SignatureError{File: "Release.gpg", Keyring: kr.Path, KeyringIDs: kr.KeyIDs(), SeenKeyIDs: seen, Err: err}
	}
	sig := signature
	if isArmored(signature) {
		blk, err := armor.Decode(bytes.NewReader(signature))
		if err != nil {
			return fail(nil, fmt.Errorf("armor: %w", err))
		}
		if blk.Type != openpgp.SignatureType {
			return fail(nil, fmt.Errorf("armor block is %q, want %q", blk.Type, openpgp.SignatureType))
		}
		if sig, err = io.ReadAll(blk.Body); err != nil {
			return fail(nil, fmt.Errorf("armor: %w", err))
		}
	}
	fps, seen, err := verifySignatures(release, sig, kr, now)
	if err != nil {
		return fail(seen, err)
	}
	return &Verified{Signed: release, SignerFingerprints: fps, Issuers: seen}, nil
}

// verifyConfig is the go-crypto policy for repository signatures: its defaults (SHA-1, MD5 and
// RIPEMD-160 refused for message signatures, DSA and ElGamal keys refused) at time now.
func verifyConfig(now time.Time) *packet.Config {
	return &packet.Config{Time: func() time.Time { return now }}
}

// verifySignatures checks every signature packet of sigPackets (binary) over signed. It returns the
// fingerprints of the keyring keys whose signatures verified and every issuer seen.
func verifySignatures(signed, sigPackets []byte, kr *Keyring, now time.Time) (fps, seen []string, err error) {
	raws, err := splitPackets(sigPackets)
	if err != nil {
		return nil, nil, err
	}
	if len(raws) == 0 {
		return nil, nil, errors.New("no signature packet")
	}
	var bad, worthless []error
	for _, raw := range raws {
		p, perr := packet.Read(bytes.NewReader(raw))
		sig, ok := p.(*packet.Signature)
		if perr != nil || !ok {
			// An unsupported signature (e.g. an algorithm go-crypto lacks) counts like one by an
			// unknown key, as gpgv's ERRSIG does for apt.
			worthless = append(worthless, fmt.Errorf("unreadable signature packet: %v", perr))
			continue
		}
		issuer := issuerOf(sig)
		seen = append(seen, issuer)
		if sig.IssuerKeyId == nil || len(kr.entities.KeysByIdUsage(*sig.IssuerKeyId, packet.KeyFlagSign)) == 0 {
			worthless = append(worthless, fmt.Errorf("key %s is not in the keyring", issuer))
			continue
		}
		signer, verr := openpgp.CheckDetachedSignature(kr.entities, bytes.NewReader(signed), bytes.NewReader(raw), verifyConfig(now))
		switch {
		case verr == nil:
			fps = append(fps, fmt.Sprintf("%X", signer.PrimaryKey.Fingerprint))
		case errors.Is(verr, pgperrors.ErrKeyExpired) || errors.Is(verr, pgperrors.ErrSignatureExpired) || errors.Is(verr, pgperrors.ErrKeyRevoked):
			worthless = append(worthless, fmt.Errorf("key %s: %w", issuer, verr))
		default:
			bad = append(bad, fmt.Errorf("BAD signature by key %s: %w", issuer, verr))
		}
	}
	switch {
	case len(bad) > 0:
		return nil, seen, errors.Join(bad...)
	case len(fps) == 0:
		return nil, seen, joinOneLine(worthless)
	}
	return fps, seen, nil
}

// joinOneLine joins errors with "; " (errors.Join uses newlines).
func joinOneLine(errs []error) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// issuerOf names a signature's issuer: its fingerprint when it carries one, else its long key ID.
func issuerOf(sig *packet.Signature) string {
	switch {
	case len(sig.IssuerFingerprint) > 0:
		return fmt.Sprintf("%X", sig.IssuerFingerprint)
	case sig.IssuerKeyId != nil:
		return fmt.Sprintf("%016X", *sig.IssuerKeyId)
	}
	return "(no issuer)"
}

// splitPackets cuts an OpenPGP packet stream into its packets' raw bytes (header included), RFC 9580
// §4.2: OpenPGP (new) format headers with 1-, 2- and 5-octet lengths and legacy headers with 1-, 2-
// and 4-octet lengths. Partial and indeterminate lengths (never used for signature packets) are
// refused.
func splitPackets(data []byte) ([][]byte, error) {
	var out [][]byte
	for len(data) > 0 {
		tag := data[0]
		if tag&0x80 == 0 {
			return nil, errors.New("malformed OpenPGP packet header")
		}
		var hdr, length int
		if tag&0x40 != 0 { // OpenPGP format
			if len(data) < 2 {
				return nil, errors.New("truncated OpenPGP packet header")
			}
			switch l := int(data[1]); {
			case l < 192:
				hdr, length = 2, l
			case l < 224:
				if len(data) < 3 {
					return nil, errors.New("truncated OpenPGP packet header")
				}
				hdr, length = 3, (l-192)<<8+int(data[2])+192
			case l == 255:
				if len(data) < 6 {
					return nil, errors.New("truncated OpenPGP packet header")
				}
				hdr, length = 6, int(data[2])<<24|int(data[3])<<16|int(data[4])<<8|int(data[5])
			default:
				return nil, errors.New("partial-length OpenPGP packet in a signature")
			}
		} else { // legacy format
			switch tag & 3 {
			case 0:
				hdr = 2
			case 1:
				hdr = 3
			case 2:
				hdr = 5
			default:
				return nil, errors.New("indeterminate-length OpenPGP packet in a signature")
			}
			if len(data) < hdr {
				return nil, errors.New("truncated OpenPGP packet header")
			}
			for _, b := range data[1:hdr] {
				length = length<<8 | int(b)
			}
		}
		if length < 0 || len(data)-hdr < length {
			return nil, errors.New("truncated OpenPGP packet")
		}
		out = append(out, data[:hdr+length])
		data = data[hdr+length:]
	}
	return out, nil
}
