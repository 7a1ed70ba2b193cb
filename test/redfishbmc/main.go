package redfishbmc

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Config is one BMC process's configuration (a JSON file, 0600: it holds the password).
type Config struct {
	// Listen is the HTTPS address, host:port.
	Listen string
	// CertFile and KeyFile are the BMC's TLS certificate chain and key (PEM).
	CertFile, KeyFile string
	// User and Password are the one account (basic auth and session login).
	User, Password string
	// Tree is the mockup tree PrepareTree made for SystemID.
	Tree     string
	SystemID string
	// Profile names one of Profiles ("" : "dmtf").
	Profile string
	// StateDir holds fetched images.
	StateDir string
	// Firmware is the machine's firmware at start: "Legacy" (SeaBIOS, the default) or "UEFI"; the
	// initial BootSourceOverrideMode.
	Firmware string
	// QEMU is the host; nil: no host (power state only).
	QEMU *QEMUConfig
}

// Main runs the BMC from the configuration file at configPath until SIGTERM or SIGINT: it prints
// "ready ADDR" on stdout once it serves, logs every request on stderr (slog JSON lines: msg "request", method, path, status), and powers its host off on
// the way out. It returns the process's exit status.
func Main(configPath string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(configPath, log); err != nil {
		log.Error("redfish-bmc", "error", err)
		return 1
	}
	return 0
}

func run(configPath string, log *slog.Logger) error {
	b, err := os.ReadFile(configPath)
	if err != nil {
		return err
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", configPath, err)
	}
	if cfg.Profile == "" {
		cfg.Profile = "dmtf"
	}
	prof, ok := Profiles[cfg.Profile]
	if !ok {
		return fmt.Errorf("profile %q: not one of the emulator's profiles", cfg.Profile)
	}
	if cfg.User == "" || cfg.Password == "" {
		return errors.New("user and password are required")
	}
	t, err := loadTree(cfg.Tree)
	if err != nil {
		return err
	}
	var newMachine func(func() Boot) (Machine, error)
	if cfg.QEMU != nil {
		q := *cfg.QEMU
		newMachine = func(nextBoot func() Boot) (Machine, error) { return newQEMU(q, nextBoot) }
	}
	s, err := newServer(t, prof, cfg.SystemID, cfg.User, cfg.Password, cfg.StateDir, cfg.Firmware, log, newMachine)
	if err != nil {
		return err
	}
	defer s.m.Close()
	cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(l, "", "") }()
	fmt.Printf("ready %s\n", l.Addr())
	log.Info("serving", "addr", l.Addr().String(), "profile", prof.Name, "system", cfg.SystemID, "host", cfg.QEMU != nil)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		_ = srv.Close()
		return nil
	case err := <-done:
		return err
	}
}
