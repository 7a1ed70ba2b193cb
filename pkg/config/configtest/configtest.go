// Package configtest holds test helpers that build pieces of a bootstrap configuration (pkg/config)
// for the tests of other packages. Nothing outside _test.go files imports it.
package configtest

import (
	"crypto/ed25519"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// UnreachableSSH returns an SSH power section (kind ssh, user root) whose address is a port on
// 127.0.0.1 that nothing listens on (bound, then closed: a connection is refused at once), with a
// fresh ed25519 private key written 0600 to dir/id_ed25519 and a host key of its own. A phase that
// would reach the node over SSH fails fast with "connection refused"; one that must not reach it
// (a dry run, a skip) passes. Fails t on any error.
func UnreachableSSH(t testing.TB, dir string) config.Power {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String() // nothing listens there once closed: connections are refused
	l.Close()
	return config.Power{Kind: config.PowerSSH, Address: closed, Username: "root", PrivateKeyFile: keyFile,
		HostKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))}
}
