package power

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"golang.org/x/sys/cpu"
)

// aesHardware reports whether this CPU has AES and carry-less multiply instructions, the condition
// crypto/tls uses (hasAESGCMHardwareSupport) to prefer AES-GCM over ChaCha20-Poly1305.
var aesHardware = cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ || cpu.ARM64.HasAES && cpu.ARM64.HasPMULL ||
	cpu.S390X.HasAES && cpu.S390X.HasGHASH

// sshCiphers is the client's cipher preference (RFC 4253 section 7.1: the first client cipher the
// server also offers wins). With AES hardware it is x/crypto/ssh's default order (AES-GCM first);
// without it ChaCha20-Poly1305 (RFC 8439; chacha20-poly1305@openssh.com) comes first, the same choice
// crypto/tls makes for TLS 1.3: software AES-GCM is several times slower (in the appliance ISO under
// QEMU's emulated qemu64 CPU, 20 MB/s against 65-90 MB/s, which is what copying hostagent to the nodes
// costs in the power phase). The list holds only x/crypto/ssh's default, non-deprecated ciphers.
func sshCiphers(aesHW bool) []string {
	def := ssh.SupportedAlgorithms().Ciphers
	if aesHW {
		return def
	}
	out := []string{ssh.CipherChaCha20Poly1305}
	for _, c := range def {
		if c != ssh.CipherChaCha20Poly1305 {
			out = append(out, c)
		}
	}
	return out
}

// SSHOptions configures DialSSH.
type SSHOptions struct {
	// Address is "host:port" of the node's sshd.
	Address string
	// User to log in as (config default "root").
	User string
	// PrivateKey is the client key, PEM or OpenSSH format, unencrypted. Key authentication only.
	PrivateKey []byte
	// HostKeys pins the host keys accepted from the server. At least one of HostKeys and
	// KnownHostsFile is required: there is no trust on first use.
	HostKeys []ssh.PublicKey
	// KnownHostsFile is an OpenSSH known_hosts file consulted for Address when HostKeys does not
	// match (hashed entries work).
	KnownHostsFile string
	// HandshakeTimeout bounds the TCP dial plus the SSH handshake and authentication. 0 →
	// DefaultTimeout.
	HandshakeTimeout time.Duration
	// Log receives debug lines (never key material). nil → discarded.
	Log *slog.Logger
}

// SSHClient is one authenticated SSH connection; it runs commands in separate sessions and is safe
// for concurrent use.
type SSHClient struct {
	c   *ssh.Client
	log *slog.Logger
}

// DialSSH connects and authenticates with the private key, accepting only the pinned host key(s)
// (HostKeys, else known_hosts entries for Address). The host-key algorithms offered are restricted
// to the pinned key types, so a server holding several keys presents the pinned one. A deadline on
// the connection covers the handshake (ssh.ClientConfig.Timeout would cover only the TCP dial);
// ctx cancellation aborts it too.
//
// Errors: ErrHostKeyUnknown / ErrHostKeyMismatch (with the presented key's SHA256 fingerprint and
// what to do), ErrAuth (key refused), ErrUnreachable (refused, timed out, no route).
func DialSSH(ctx context.Context, o SSHOptions) (*SSHClient, error) {
	log := orDiscard(o.Log).With("ssh", o.Address)
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		return nil, fmt.Errorf("SSH address %q is not host:port: %w", o.Address, err)
	}
	signer, err := ssh.ParsePrivateKey(o.PrivateKey)
	if err != nil {
		var pm *ssh.PassphraseMissingError
		if errors.As(err, &pm) {
			return nil, fmt.Errorf("SSH private key is encrypted: give an unencrypted key (ssh-keygen -p -N '' -f KEY on a copy)")
		}
		return nil, fmt.Errorf("SSH private key cannot be parsed (PEM or OpenSSH format expected): %w", err)
	}
	hk, algos, err := hostKeyCheck(o)
	if err != nil {
		return nil, err
	}
	timeout := o.HandshakeTimeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cfg := &ssh.ClientConfig{
		User:              o.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   hk,
		HostKeyAlgorithms: algos,
		Timeout:           timeout,
	}
	cfg.Ciphers = sshCiphers(aesHardware)
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	start := time.Now()
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "tcp", o.Address)
	if err != nil {
		return nil, fmt.Errorf("SSH %s: %w: %w", o.Address, ErrUnreachable, err)
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(dctx, func() { _ = conn.Close() })
	sc, chans, reqs, err := ssh.NewClientConn(conn, o.Address, cfg)
	stopped := stop()
	if err != nil {
		_ = conn.Close()
		return nil, classifySSH(o.Address, err, !stopped || errors.Is(err, os.ErrDeadlineExceeded))
	}
	_ = conn.SetDeadline(time.Time{})
	log.Debug("ssh connected", "user", o.User, "duration", time.Since(start))
	return &SSHClient{c: ssh.NewClient(sc, chans, reqs), log: log}, nil
}

func classifySSH(addr string, err error, timedOut bool) error {
	var hkErr *hostKeyError
	switch {
	case errors.As(err, &hkErr):
		return fmt.Errorf("SSH %s: %w", addr, hkErr)
	case strings.Contains(err.Error(), "unable to authenticate"):
		return fmt.Errorf("SSH %s refused the key: add the public key of power.privateKeyFile to the user's authorized_keys: %w: %w", addr, ErrAuth, err)
	case timedOut || isUnreachable(err):
		return fmt.Errorf("SSH %s: handshake did not finish: %w: %w", addr, ErrUnreachable, err)
	}
	return fmt.Errorf("SSH %s: %w", addr, err)
}

// hostKeyError carries the sentinel plus the presented key's fingerprint.
type hostKeyError struct {
	sentinel    error
	fingerprint string
	keyType     string
	hint        string
}

func (e *hostKeyError) Error() string {
	return fmt.Sprintf("%v: server presented %s key %s; %s", e.sentinel, e.keyType, e.fingerprint, e.hint)
}

func (e *hostKeyError) Unwrap() error { return e.sentinel }

// hostKeyCheck returns the callback and the host-key algorithms to offer.
func hostKeyCheck(o SSHOptions) (ssh.HostKeyCallback, []string, error) {
	if len(o.HostKeys) == 0 && o.KnownHostsFile == "" {
		return nil, nil, fmt.Errorf("SSH %s: no host key pinned: set power.hostKey or power.knownHostsFile (there is no trust on first use)", o.Address)
	}
	var kh ssh.HostKeyCallback
	var knownTypes []string
	if o.KnownHostsFile != "" {
		var err error
		if kh, err = knownhosts.New(o.KnownHostsFile); err != nil {
			return nil, nil, fmt.Errorf("SSH known_hosts %s: %w", o.KnownHostsFile, err)
		}
		knownTypes = knownKeyTypes(kh, o.Address)
	}
	var algos []string
	seen := map[string]bool{}
	add := func(t string) {
		for _, a := range algorithmsFor(t) {
			if !seen[a] {
				seen[a] = true
				algos = append(algos, a)
			}
		}
	}
	for _, k := range o.HostKeys {
		add(k.Type())
	}
	for _, t := range knownTypes {
		add(t)
	}
	cb := func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		for _, k := range o.HostKeys {
			if bytes.Equal(k.Marshal(), key.Marshal()) {
				return nil
			}
		}
		fp := ssh.FingerprintSHA256(key)
		if kh != nil {
			err := kh(hostname, remote, key)
			if err == nil {
				return nil
			}
			var ke *knownhosts.KeyError
			if errors.As(err, &ke) && len(ke.Want) > 0 {
				return &hostKeyError{ErrHostKeyMismatch, fp, key.Type(), fmt.Sprintf("%s holds another key for this host (line %d): if the host was reinstalled, verify the new key out of band and replace the entry; otherwise someone may be intercepting the connection", o.KnownHostsFile, ke.Want[0].Line)}
			}
			if !errors.As(err, &ke) {
				return err
			}
		}
		if len(o.HostKeys) > 0 {
			return &hostKeyError{ErrHostKeyMismatch, fp, key.Type(), fmt.Sprintf("power.hostKey pins %s: if the host was reinstalled, verify the new key out of band (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on its console) and update power.hostKey; otherwise someone may be intercepting the connection", ssh.FingerprintSHA256(o.HostKeys[0]))}
		}
		return &hostKeyError{ErrHostKeyUnknown, fp, key.Type(), fmt.Sprintf("%s has no entry for %s: verify the fingerprint out of band, then add the host's public key to power.hostKey or the known_hosts file", o.KnownHostsFile, hostname)}
	}
	return cb, algos, nil
}

// knownKeyTypes asks the known_hosts callback which key types it holds for addr, by presenting a
// key it cannot know and reading the KeyError's Want list (x/crypto has no lookup API).
func knownKeyTypes(kh ssh.HostKeyCallback, addr string) []string {
	probe := probeKey()
	if probe == nil {
		return nil
	}
	tcp, _ := net.ResolveTCPAddr("tcp", addr)
	var remote net.Addr = tcp
	if tcp == nil {
		remote = &net.TCPAddr{}
	}
	var ke *knownhosts.KeyError
	if err := kh(addr, remote, probe); !errors.As(err, &ke) {
		return nil
	}
	var types []string
	for _, w := range ke.Want {
		types = append(types, w.Key.Type())
	}
	return types
}

var probeOnce = sync.OnceValue(func() ssh.PublicKey {
	// A fixed throwaway ed25519 public key (32 zero bytes are a valid encoding input for the
	// wire format; the key is never used to verify anything).
	k, err := ssh.ParsePublicKey(append([]byte{0, 0, 0, 11}, append([]byte("ssh-ed25519"), append([]byte{0, 0, 0, 32}, make([]byte, 32)...)...)...))
	if err != nil {
		return nil
	}
	return k
})

func probeKey() ssh.PublicKey { return probeOnce() }

// algorithmsFor maps a key type to the host-key signature algorithms that can present it.
func algorithmsFor(keyType string) []string {
	switch keyType {
	case ssh.KeyAlgoRSA:
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	default:
		return []string{keyType}
	}
}

// Run runs cmd in a new session (through the login user's shell), feeding stdin if not nil, and
// returns its stdout, stderr and exit status. A non-zero exit is not an error: exitCode says it.
// err is set when the command could not run, the connection dropped before an exit status arrived,
// or ctx ended: the session is then sent SIGKILL and closed, and Run returns at once with no
// output.
func (c *SSHClient) Run(ctx context.Context, cmd string, stdin io.Reader) (stdout, stderr []byte, exitCode int, err error) {
	s, err := c.c.NewSession()
	if err != nil {
		return nil, nil, -1, fmt.Errorf("open SSH session: %w", err)
	}
	defer s.Close()
	var o, e bytes.Buffer
	s.Stdout, s.Stderr = &o, &e
	if stdin != nil {
		s.Stdin = stdin
	}
	if err := s.Start(cmd); err != nil {
		return nil, nil, -1, fmt.Errorf("start remote command: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Ask sshd to kill the command (OpenSSH ≥ 7.9 honours "signal"), then close the channel.
		// Wait may only return when the remote command ends, so do not wait for it; the output
		// buffers still belong to the session and are not returned.
		_ = s.Signal(ssh.SIGKILL)
		_ = s.Close()
		return nil, nil, -1, fmt.Errorf("remote command cancelled: %w", ctx.Err())
	}
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return o.Bytes(), e.Bytes(), 0, nil
	case errors.As(err, &ee):
		return o.Bytes(), e.Bytes(), ee.ExitStatus(), nil
	default:
		return o.Bytes(), e.Bytes(), -1, fmt.Errorf("remote command: %w", err)
	}
}

// WriteFile writes data to the absolute path on the remote host atomically: a temporary file in
// the same directory (created with umask 077), fsync, chmod mode, then mv over path. A reader sees
// the old or the new content, never a mix. It needs a POSIX shell, mktemp, chmod, mv and sync
// (coreutils) on the remote.
func (c *SSHClient) WriteFile(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	if !path.IsAbs(p) || strings.ContainsAny(p, "\x00\n") || path.Clean(p) != p {
		return fmt.Errorf("remote path %q must be absolute and clean", p)
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	tmp := path.Join(path.Dir(p), "."+path.Base(p)+".tmp-"+hex.EncodeToString(suffix[:]))
	script := fmt.Sprintf(`set -e; umask 077; tmp=%s; dst=%s; trap 'rm -f "$tmp"' EXIT; cat > "$tmp"; chmod %04o "$tmp"; sync "$tmp" 2>/dev/null || sync; mv -f "$tmp" "$dst"; trap - EXIT`,
		shellQuote(tmp), shellQuote(p), mode.Perm())
	_, stderr, code, err := c.Run(ctx, script, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("write %s on the remote: %w", p, err)
	}
	if code != 0 {
		return fmt.Errorf("write %s on the remote: exit status %d: %s", p, code, bytes.TrimSpace(stderr))
	}
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Close closes the connection.
func (c *SSHClient) Close() error { return c.c.Close() }
