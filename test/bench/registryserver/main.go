// Command registryserver is the benchmark harness for the registry package: it optionally imports an
// OCI image layout with registry.Import, then serves registry.NewHandler over TLS 1.2+ on a loopback
// address with a throwaway self-signed ECDSA P-256 certificate, the way pkg/server mounts it at /v2/.
//
//	registryserver -root DIR [-layout LAYOUT] [-import-only] [-addr 127.0.0.1:5443] [-fast=true]
//
// It prints "imported N images (B blobs, L linked, C copied, changed=X) in D" after an import and
// "serving https://ADDR" once listening; it stops on SIGINT/SIGTERM. -fast=false turns the blob fast
// path off so that distribution's own blob handler is measured. Used by test/bench/registry-*.sh.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/airgap-appliance/appliance/registry"
)

func main() {
	root := flag.String("root", "", "distribution filesystem root (state directory)")
	layoutDir := flag.String("layout", "", "OCI image layout to import first")
	importOnly := flag.Bool("import-only", false, "import and exit")
	addr := flag.String("addr", "127.0.0.1:5443", "loopback address to serve on")
	fast := flag.Bool("fast", true, "serve blobs through the fast path")
	flag.Parse()
	if err := run(*root, *layoutDir, *importOnly, *addr, *fast); err != nil {
		fmt.Fprintln(os.Stderr, "registryserver:", err)
		os.Exit(1)
	}
}

func run(root, layoutDir string, importOnly bool, addr string, fast bool) error {
	if root == "" {
		return errors.New("-root is required")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if layoutDir != "" {
		start := time.Now()
		res, err := registry.Import(ctx, layoutDir, root, log)
		if err != nil {
			return err
		}
		fmt.Printf("imported %d images (%d blobs, %d linked, %d copied, changed=%v) in %s\n",
			len(res.Images), res.Blobs, res.Linked, res.Copied, res.Changed, time.Since(start))
	}
	if importOnly {
		return nil
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("-addr %q must be a loopback address", addr)
	}
	h, err := registry.NewHandler(ctx, root, log, registry.WithBlobFastPath(fast))
	if err != nil {
		return err
	}
	defer h.Close()
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v2/", h)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("serving https://%s\n", ln.Addr())
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
