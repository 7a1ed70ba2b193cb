package redfishbmc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// stream is an image the host reads on demand (InsertMedia TransferMethod "Stream", DSP2046
// VirtualMedia): nbdkit's curl plugin fetches the byte ranges the host's CD reads from the image
// server, verifying TLS against the slot's certificates (cainfo) or not at all when VerifyCertificate
// is off (sslverify=false), and exports them read-only as NBD on a unix socket, which QEMU opens as
// "nbd+unix:///?socket=PATH". A unix socket reaches QEMU in any network namespace.
type stream struct {
	cmd    *exec.Cmd
	exited chan struct{}
	dir    string
	// URI is what the host's CD opens.
	URI string
}

// startStream starts nbdkit for image (checked reachable and range-capable by the caller) in a new
// directory under stateDir holding the CA file and the password file (0600; nbdkit reads the
// password from the file, never from its command line).
func startStream(stateDir, image, user, password string, verify bool, certsPEM []string) (*stream, error) {
	nbdkit, err := exec.LookPath("nbdkit")
	if err != nil {
		return nil, fmt.Errorf("TransferMethod Stream needs nbdkit (Debian package nbdkit): %w", err)
	}
	dir, err := os.MkdirTemp(stateDir, "stream-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "nbd.sock")
	args := []string{"--foreground", "--exit-with-parent", "--readonly", "--unix", sock, "curl", "url=" + image,
		"timeout=30", "followlocation=false"}
	if verify {
		ca := filepath.Join(dir, "ca.pem")
		if err := os.WriteFile(ca, []byte(strings.Join(certsPEM, "\n")), 0o600); err != nil {
			return nil, err
		}
		// capath: this directory, so that only cainfo counts, not the system's CA directory.
		args = append(args, "cainfo="+ca, "capath="+dir)
	} else {
		args = append(args, "sslverify=false")
	}
	if user != "" {
		pw := filepath.Join(dir, "password")
		if err := os.WriteFile(pw, []byte(password), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "user="+user, "password=+"+pw)
	}
	var out bytes.Buffer
	cmd := exec.Command(nbdkit, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nbdkit: %w", err)
	}
	st := &stream{cmd: cmd, exited: make(chan struct{}), dir: dir, URI: "nbd+unix:///?socket=" + sock}
	go func() { _ = cmd.Wait(); close(st.exited) }()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return st, nil
		}
		select {
		case <-st.exited:
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("nbdkit exited: %s", strings.TrimSpace(out.String()))
		default:
		}
		if time.Now().After(deadline) {
			st.stop()
			return nil, fmt.Errorf("nbdkit made no socket in 15 s: %s", strings.TrimSpace(out.String()))
		}
	}
}

// stop ends nbdkit (by PID) and removes its directory, secrets included.
func (s *stream) stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	_ = os.RemoveAll(s.dir)
}
