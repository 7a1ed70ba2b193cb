package power

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/airgap-appliance/appliance/test/labns"
)

func genKey(t *testing.T, rsaKey bool) (privPEM []byte, pub ssh.PublicKey) {
	t.Helper()
	var priv any
	if rsaKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		must(t, err)
		priv = k
	} else {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		must(t, err)
		priv = k
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	must(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	must(t, err)
	return pem.EncodeToMemory(blk), signer.PublicKey()
}

// TestSSHRealSSHD runs OpenSSH's sshd in a namespace with its own host keys (ed25519 and RSA) and
// authorized_keys, and checks DialSSH, Run, WriteFile and the SSH Controller against it.
func TestSSHRealSSHD(t *testing.T) {
	if p, ok := childParams(t); ok {
		sshChild(t, p)
		return
	}
	sshd := labns.RequireTool(t, "sshd")
	ns := labns.New(t, "pwssh")
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o700))
	hostEd, hostEdPub := genKey(t, false)
	hostRSA, hostRSAPub := genKey(t, true)
	client, clientPub := genKey(t, false)
	ctl, ctlPub := genKey(t, false)
	other, _ := genKey(t, false)
	files := map[string][]byte{
		"host_ed25519": hostEd, "host_rsa": hostRSA, "client": client, "ctl": ctl, "other": other,
		"host_ed25519.pub": ssh.MarshalAuthorizedKey(hostEdPub), "host_rsa.pub": ssh.MarshalAuthorizedKey(hostRSAPub),
		// The controller's key is bound to a forced command that only records what was asked,
		// so `systemctl poweroff` / `reboot` never run on this machine.
		"authorized_keys": []byte(string(ssh.MarshalAuthorizedKey(clientPub)) +
			fmt.Sprintf(`command="printf '%%s\n' \"$SSH_ORIGINAL_COMMAND\" >> %s/asked",no-pty `, dir) + string(ssh.MarshalAuthorizedKey(ctlPub))),
		"sshd_config": []byte(fmt.Sprintf(`ListenAddress 127.0.0.1:22
HostKey %[1]s/host_ed25519
HostKey %[1]s/host_rsa
AuthorizedKeysFile %[1]s/authorized_keys
PidFile %[1]s/sshd.pid
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
LogLevel VERBOSE
`, dir)),
	}
	for name, b := range files {
		must(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	must(t, os.MkdirAll("/run/sshd", 0o755)) // privilege-separation directory sshd insists on
	if out, err := ns.Run(sshd, "-t", "-f", filepath.Join(dir, "sshd_config")); err != nil {
		t.Fatalf("sshd -t: %v\n%s", err, out)
	}
	startProcess(t, ns, filepath.Join(dir, "sshd.log"), sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	runInNS(t, ns, map[string]string{"dir": dir}, false)
}

func sshChild(t *testing.T, p map[string]string) {
	dir := p["dir"]
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		must(t, err)
		return b
	}
	pub := func(name string) ssh.PublicKey {
		k, _, _, _, err := ssh.ParseAuthorizedKey(read(name))
		must(t, err)
		return k
	}
	hostEd, hostRSA := pub("host_ed25519.pub"), pub("host_rsa.pub")
	_, wrongHost := genKey(t, false)
	const addr = "127.0.0.1:22"
	ctx := context.Background()
	base := SSHOptions{Address: addr, User: "root", PrivateKey: read("client"), HostKeys: []ssh.PublicKey{hostEd}, HandshakeTimeout: 10 * time.Second}
	// sshd may still be starting: wait (bounded) until it accepts the client.
	waitFor(t, "sshd to accept connections", func() bool {
		c, err := DialSSH(ctx, base)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	knownHosts := func(t *testing.T, keys ...ssh.PublicKey) string {
		var b strings.Builder
		for _, k := range keys {
			b.WriteString(knownhosts.Line([]string{knownhosts.Normalize(addr)}, k) + "\n")
		}
		f := filepath.Join(t.TempDir(), "known_hosts")
		must(t, os.WriteFile(f, []byte(b.String()), 0o600))
		return f
	}

	t.Run("dial", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			mod     func(t *testing.T, o *SSHOptions)
			wantErr error
			wantMsg string
		}{
			{"pinned ed25519", func(*testing.T, *SSHOptions) {}, nil, ""},
			// The server also holds an ed25519 key; offering only RSA algorithms makes it present
			// the pinned one (without the restriction this is a "mismatch").
			{"pinned RSA", func(_ *testing.T, o *SSHOptions) { o.HostKeys = []ssh.PublicKey{hostRSA} }, nil, ""},
			{"known_hosts holds it", func(t *testing.T, o *SSHOptions) {
				o.HostKeys = nil
				o.KnownHostsFile = knownHosts(t, hostRSA)
			}, nil, ""},
			{"wrong pinned key", func(_ *testing.T, o *SSHOptions) { o.HostKeys = []ssh.PublicKey{wrongHost} },
				ErrHostKeyMismatch, ssh.FingerprintSHA256(hostEd)},
			{"known_hosts holds another key", func(t *testing.T, o *SSHOptions) {
				o.HostKeys = nil
				o.KnownHostsFile = knownHosts(t, wrongHost)
			}, ErrHostKeyMismatch, ssh.FingerprintSHA256(hostEd)},
			{"not in known_hosts", func(t *testing.T, o *SSHOptions) {
				o.HostKeys = nil
				o.KnownHostsFile = knownHosts(t)
			}, ErrHostKeyUnknown, "SHA256:"},
			{"client key not authorized", func(_ *testing.T, o *SSHOptions) { o.PrivateKey = read("other") }, ErrAuth, "authorized_keys"},
			{"nothing listening", func(_ *testing.T, o *SSHOptions) { o.Address = "127.0.0.1:2222" }, ErrUnreachable, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				o := base
				tc.mod(t, &o)
				c, err := DialSSH(ctx, o)
				if tc.wantErr == nil {
					if err != nil {
						t.Fatalf("DialSSH: %v", err)
					}
					c.Close()
					return
				}
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("DialSSH = %v, want %v", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("DialSSH error %q does not mention %q", err, tc.wantMsg)
				}
			})
		}
	})

	// Without AES hardware (the appliance ISO under QEMU's qemu64 CPU) the client asks for
	// ChaCha20-Poly1305 first, and OpenSSH's sshd (which offers AES-GCM before it) agrees to it.
	t.Run("cipher without AES hardware", func(t *testing.T) {
		for _, tc := range []struct {
			aesHW bool
			want  string
		}{{false, ssh.CipherChaCha20Poly1305}, {true, ssh.SupportedAlgorithms().Ciphers[0]}} {
			saved := aesHardware
			aesHardware = tc.aesHW
			c, err := DialSSH(ctx, base)
			aesHardware = saved
			must(t, err)
			algs := c.c.Conn.(ssh.AlgorithmsConnMetadata).Algorithms()
			c.Close()
			if algs.Write.Cipher != tc.want || algs.Read.Cipher != tc.want {
				t.Errorf("AES hardware %v: negotiated %s (client to server), %s (server to client); want %s",
					tc.aesHW, algs.Write.Cipher, algs.Read.Cipher, tc.want)
			}
		}
	})

	c, err := DialSSH(ctx, base)
	must(t, err)
	defer c.Close()

	t.Run("run", func(t *testing.T) {
		for _, tc := range []struct {
			cmd, stdin, wantOut, wantErr string
			wantCode                     int
		}{
			{"echo out; echo err >&2", "", "out\n", "err\n", 0},
			{"exit 3", "", "", "", 3},
			{"tr a-z A-Z", "hello", "HELLO", "", 0},
			{"false", "", "", "", 1},
		} {
			var in *strings.Reader
			if tc.stdin != "" {
				in = strings.NewReader(tc.stdin)
			}
			var stdin = any(in)
			var o, e []byte
			var code int
			var err error
			if stdin == (*strings.Reader)(nil) {
				o, e, code, err = c.Run(ctx, tc.cmd, nil)
			} else {
				o, e, code, err = c.Run(ctx, tc.cmd, in)
			}
			if err != nil || string(o) != tc.wantOut || string(e) != tc.wantErr || code != tc.wantCode {
				t.Errorf("Run(%q) = %q, %q, %d, %v; want %q, %q, %d, nil", tc.cmd, o, e, code, err, tc.wantOut, tc.wantErr, tc.wantCode)
			}
		}
	})

	t.Run("run cancelled", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, _, code, err := c.Run(cctx, "sleep 30", nil)
		if !errors.Is(err, context.DeadlineExceeded) || code != -1 {
			t.Fatalf("Run past its deadline = %d, %v; want -1, DeadlineExceeded", code, err)
		}
		if _, _, code, err := c.Run(ctx, "true", nil); err != nil || code != 0 {
			t.Fatalf("connection unusable after a cancelled session: %d, %v", code, err)
		}
	})

	t.Run("write file", func(t *testing.T) {
		target := filepath.Join(dir, "sub dir", "it's.conf")
		must(t, os.MkdirAll(filepath.Dir(target), 0o755))
		for _, tc := range []struct {
			data string
			mode os.FileMode
		}{
			{"first\n", 0o640},
			{"second, replaced atomically\n", 0o600},
			{"", 0o644},
		} {
			if err := c.WriteFile(ctx, target, []byte(tc.data), tc.mode); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			st, err := os.Stat(target)
			must(t, err)
			if got := string(read(filepath.Join("sub dir", "it's.conf"))); got != tc.data || st.Mode().Perm() != tc.mode {
				t.Fatalf("remote file = %q %v, want %q %v", got, st.Mode().Perm(), tc.data, tc.mode)
			}
		}
		entries, _ := os.ReadDir(filepath.Dir(target))
		if len(entries) != 1 {
			t.Fatalf("temporary files left behind: %v", entries)
		}
		if err := c.WriteFile(ctx, "relative/path", nil, 0o600); err == nil {
			t.Fatal("WriteFile accepted a relative path")
		}
		if err := c.WriteFile(ctx, filepath.Join(dir, "missing-dir", "f"), []byte("x"), 0o600); err == nil {
			t.Fatal("WriteFile into a missing directory succeeded")
		}
	})

	t.Run("controller", func(t *testing.T) {
		o := base
		o.PrivateKey = read("ctl")
		ctrl, err := NewSSHController(o)
		must(t, err)
		if st, err := ctrl.PowerState(ctx); err != nil || st != StateOn {
			t.Fatalf("PowerState = %q, %v; want on", st, err)
		}
		if err := ctrl.PowerOn(ctx); err != nil {
			t.Fatalf("PowerOn of a running host: %v", err)
		}
		must(t, ctrl.PowerOff(ctx))
		must(t, ctrl.PowerCycle(ctx))
		if got := string(read("asked")); got != "systemctl poweroff\nsystemctl reboot\n" {
			t.Fatalf("host was asked %q, want systemctl poweroff then systemctl reboot", got)
		}
		if err := ctrl.SetBootDevice(ctx, BootPXE, false); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("SetBootDevice over SSH = %v, want ErrUnsupported", err)
		}
		dead := o
		dead.Address = "127.0.0.1:2222"
		dc, err := NewSSHController(dead)
		must(t, err)
		if st, err := dc.PowerState(ctx); err != nil || st != StateOff {
			t.Fatalf("PowerState with nothing listening = %q, %v; want off", st, err)
		}
		if err := dc.PowerOn(ctx); !errors.Is(err, ErrUnreachable) {
			t.Fatalf("PowerOn with nothing listening = %v, want ErrUnreachable", err)
		}
		bad := o
		bad.HostKeys = []ssh.PublicKey{wrongHost}
		bc, err := NewSSHController(bad)
		must(t, err)
		if st, err := bc.PowerState(ctx); !errors.Is(err, ErrHostKeyMismatch) || st != StateUnknown {
			t.Fatalf("PowerState with a wrong host key = %q, %v; want unknown, ErrHostKeyMismatch", st, err)
		}
	})
}

func TestSSHCiphers(t *testing.T) {
	def := ssh.SupportedAlgorithms().Ciphers
	if got := sshCiphers(true); !slices.Equal(got, def) {
		t.Errorf("with AES hardware: %v, want x/crypto/ssh's default %v", got, def)
	}
	got := sshCiphers(false)
	if got[0] != ssh.CipherChaCha20Poly1305 {
		t.Errorf("without AES hardware the first cipher is %s, want %s", got[0], ssh.CipherChaCha20Poly1305)
	}
	if a, b := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(def)); !slices.Equal(a, b) {
		t.Errorf("without AES hardware: %v, want a reordering of %v", got, def)
	}
}
