package agentapi

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Enrolment of a BMC-booted machine (issue 12 item 5, "no secret in the clear"): the network-boot
// path and the node image carry only public data (the appliance URL and the pin of its CA). The
// booted machine creates an Ed25519 key pair (RFC 8032), proves it is the machine the appliance just
// powered on (its NICs' MAC addresses and its SMBIOS system UUID) and that it holds the private key,
// and only then receives its node credential (the hostagent configuration with the node token).
//
// POST EnrollPathV1 with an EnrollRequest (JSON, no bearer token: the machine has none yet) over the
// pinned HTTPS → 200 and an EnrollResponse, or a 4xx whose text says what is wrong. The appliance
// accepts it only for a node of the inventory that is BMC-powered (power.kind ipmi or redfish), that
// the appliance's power phase powered on within EnrollWindow and that has not reported since, whose
// nodes[].mac is among the request's MACs and whose nodes[].systemUUID (when configured) equals the
// request's. The first valid request binds the node to its public key for that power-on; a retry
// with the same key (a new nonce and timestamp) gets the same answer, another key is refused (409,
// and an alarm on the appliance: a second machine claims the node). Where the appliance's DHCP
// server leased the node its address (boot.enrolment.sourceAddress: lease), the request must come
// from that address. Where the operator approves enrolments (boot.enrolment.approval: operator),
// the binding's answer is 202 and an EnrollPending, with no token, until the operator has approved
// the key; the machine asks again (same key, new nonce and timestamp) until it gets 200 or a 4xx.
const (
	// EnrollPathV1: POST EnrollRequest → 200 EnrollResponse, or 202 EnrollPending (ask again).
	EnrollPathV1 = "/agent/v1/enroll"
	// EnrollSignatureContext is the first line of the signed message (EnrollRequest.SignedMessage):
	// a signature made for anything else never verifies as an enrolment.
	EnrollSignatureContext = "appliance-enroll-v1"
	// MaxEnrollBytes bounds the request body.
	MaxEnrollBytes = 16 << 10
	// MaxEnrollMACs bounds EnrollRequest.MACs.
	MaxEnrollMACs = 64
)

// EnrollWindow is how long after the appliance powered a node on (the power phase's "powering"
// record) the node may enrol; EnrollClockSkew is how far an EnrollRequest.Timestamp may be from the
// appliance's clock (either way). A request older than that is refused, and one inside it is
// refused if its nonce was seen: a captured request cannot be replayed.
const (
	EnrollWindow    = 30 * time.Minute
	EnrollClockSkew = 10 * time.Minute
)

// EnrollRequest is what a booted machine sends. Every field but Signature is covered by the
// signature (SignedMessage).
type EnrollRequest struct {
	// PublicKey is the machine's Ed25519 public key (32 bytes, standard base64, RFC 4648 §4).
	PublicKey string `json:"publicKey"`
	// MACs are the 48-bit MAC addresses of every NIC the kernel shows ("52:54:00:01:64:00").
	MACs []string `json:"macs"`
	// SystemUUID is the SMBIOS system UUID (/sys/class/dmi/id/product_uuid; SMBIOS 3.x type 1
	// "UUID"), lowercase; empty when the firmware has none.
	SystemUUID string `json:"systemUUID,omitempty"`
	// Timestamp is when the machine made the request (RFC 3339, UTC).
	Timestamp time.Time `json:"timestamp"`
	// Nonce is 16 or more random bytes, base64url without padding (RFC 4648 §5), new for every
	// request, retries included.
	Nonce string `json:"nonce"`
	// CAPin is the pin the machine trusts the appliance by (Configuration.CAPin format): the
	// signature binds the request to that appliance.
	CAPin string `json:"caPin"`
	// Signature is the Ed25519 signature (standard base64) of SignedMessage by PublicKey's private key.
	Signature string `json:"signature"`
}

// SignedMessage is exactly what Signature signs, as lines joined by "\n" (no trailing newline):
//
//	EnrollSignatureContext
//	CAPin
//	Timestamp (RFC 3339 with nanoseconds, UTC)
//	Nonce
//	PublicKey (as sent)
//	SystemUUID (as sent, maybe empty)
//	MACs normalised (lowercase, colon-separated), sorted, joined by ","
//
// MACs that do not parse appear as sent (the signature then still covers them; Check refuses them).
func (r EnrollRequest) SignedMessage() []byte {
	macs := make([]string, 0, len(r.MACs))
	for _, m := range r.MACs {
		if hw, err := net.ParseMAC(m); err == nil {
			m = hw.String()
		}
		macs = append(macs, m)
	}
	slices.Sort(macs)
	return []byte(strings.Join([]string{EnrollSignatureContext, r.CAPin, r.Timestamp.UTC().Format(time.RFC3339Nano),
		r.Nonce, r.PublicKey, r.SystemUUID, strings.Join(macs, ",")}, "\n"))
}

// Sign fills PublicKey and Signature with key.
func (r *EnrollRequest) Sign(key ed25519.PrivateKey) {
	r.PublicKey = base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey))
	r.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(key, r.SignedMessage()))
}

// ErrBadEnrollRequest is wrapped by Check's errors.
var ErrBadEnrollRequest = errors.New("bad enrolment request")

// Check validates the request's shape and verifies its signature (proof of possession of the
// private key). It returns the public key and the MACs, normalised. It knows nothing of the
// inventory or time: the appliance checks those.
//
// Errors (wrapping ErrBadEnrollRequest): a public key that is not 32 bytes of base64; no MAC, more
// than MaxEnrollMACs, or one that is not a 48-bit MAC; a system UUID that is not 8-4-4-4-12 hex
// digits; a zero timestamp; a nonce of fewer than 16 bytes; a bad pin; a signature that does not
// verify.
func (r EnrollRequest) Check() (ed25519.PublicKey, []string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadEnrollRequest, fmt.Sprintf(format, args...))
	}
	pub, err := base64.StdEncoding.DecodeString(r.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return nil, nil, bad("publicKey: want a %d-byte Ed25519 public key in standard base64", ed25519.PublicKeySize)
	}
	if len(r.MACs) == 0 || len(r.MACs) > MaxEnrollMACs {
		return nil, nil, bad("macs: want 1 to %d MAC addresses (every NIC's), got %d", MaxEnrollMACs, len(r.MACs))
	}
	macs := make([]string, 0, len(r.MACs))
	for i, m := range r.MACs {
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 {
			return nil, nil, bad("macs[%d]: %q is not a 48-bit MAC address (e.g. 52:54:00:01:64:00)", i, m)
		}
		macs = append(macs, hw.String())
	}
	if r.SystemUUID != "" && !IsUUID(r.SystemUUID) {
		return nil, nil, bad("systemUUID: %q is not a UUID (8-4-4-4-12 hex digits, as /sys/class/dmi/id/product_uuid shows)", r.SystemUUID)
	}
	if r.Timestamp.IsZero() {
		return nil, nil, bad("timestamp: missing (RFC 3339, the time of the request)")
	}
	if n, err := base64.RawURLEncoding.DecodeString(r.Nonce); err != nil || len(n) < 16 {
		return nil, nil, bad("nonce: want 16 or more random bytes in unpadded base64url")
	}
	if _, err := ParsePin(r.CAPin); err != nil {
		return nil, nil, bad("caPin: %v", err)
	}
	sig, err := base64.StdEncoding.DecodeString(r.Signature)
	if err != nil || !ed25519.Verify(pub, r.SignedMessage(), sig) {
		return nil, nil, bad("signature: does not verify with publicKey over the enrolment message (proof of possession failed)")
	}
	return pub, macs, nil
}

// KeyFingerprint is how an enrolment key is shown to people, on the machine's console and on the
// appliance (EnrollResponse.KeyFingerprint, EnrollPending, `appliance status`, `appliance node
// approve`): "sha256:" and the hex SHA-256 of the Ed25519 public key's 32 bytes.
func KeyFingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// IsUUID reports whether s is a UUID in its string form, 8-4-4-4-12 hex digits (RFC 9562 §4), any
// case (github.com/google/uuid parses it; its other accepted forms, urn:uuid: and braces, are not).
func IsUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}

// EnrollResponse is the appliance's answer to an accepted enrolment. It holds the node token:
// keep it 0600.
type EnrollResponse struct {
	// Node is the node's name in the inventory.
	Node string `json:"node"`
	// HostagentConfig is the node's hostagent configuration (the YAML document ConfigPath holds:
	// node, roles, appliance URL, CA pin, token), as rendered by the appliance.
	HostagentConfig string `json:"hostagentConfig"`
	// KeyFingerprint is "sha256:<hex>" of the public key the node is now bound to.
	KeyFingerprint string `json:"keyFingerprint"`
	// InstallArgs are the node's install parameters as kernel-argument words, public data only: its
	// root-device hints (appliance.rootdevice.*=, BootArgs.Hints), its static addresses
	// (appliance.address=, appliance.gateway=, BootArgs.Network) and its MAC (appliance.mac=,
	// BootArgs.MAC), in BootArgs.Words' order; ParseBootArgs reads them. Empty when the node
	// has none of them. A network boot's iPXE script carries the same words; a virtual-media boot, whose
	// ISO is the same for every node, gets them only here (over the pinned TLS of the answer).
	InstallArgs []string `json:"installArgs,omitempty"`
}

// EnrollPendingRetry is the Retry-After of a 202 EnrollPending answer: how soon the appliance
// suggests the machine asks again (it backs off from there, and never waits much longer, so an
// approval takes effect within seconds).
const EnrollPendingRetry = 5 * time.Second

// EnrollPending is the appliance's answer (202 Accepted, Retry-After EnrollPendingRetry) to a valid
// enrolment that waits for the operator's approval: the node is bound to the request's key for this
// power-on, but no token is handed out until the operator, having compared KeyFingerprint and Source
// with what the machine's console shows, runs `appliance node approve NODE`. It holds no secret.
type EnrollPending struct {
	// Node is the node the request was matched to.
	Node string `json:"node"`
	// KeyFingerprint is "sha256:<hex>" of the request's public key, as the operator sees it on the
	// appliance (`appliance status`, `appliance node approve`).
	KeyFingerprint string `json:"keyFingerprint"`
	// Source is the address the appliance saw the request come from.
	Source string `json:"source"`
	// Message says, for the machine's console, what the operator runs.
	Message string `json:"message"`
}
