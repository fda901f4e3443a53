// Command statestore runs the local state store as a standalone server: an
// MQTT v5 broker with the Azure IoT Operations state store built in, for
// developing on a laptop instead of a cluster.
//
// Install and run it:
//
//	go install github.com/dsslock/dsslock/cmd/statestore@latest
//	statestore                            # serves on 127.0.0.1:1883
//	statestore -listen 127.0.0.1:0        # a free port, logged
//	statestore -listen :1883              # every interface: anyone who reaches it may connect
//	statestore -version
//
// It logs the address it listens on and stops cleanly on SIGINT or SIGTERM.
// Data lives in memory only. It asks for no credentials.
//
// Its defaults are those of an embedded store (localstore.Config's zero
// value), so a test passes or fails alike on both: no limit on the number of
// keys or on the size of a key or value (-max-keys, -max-key-size,
// -max-value-size; a SET beyond a limit gets "the quota has been exceeded"),
// and MQTT packets of at most 4 MiB (-max-packet-size, announced in CONNACK:
// a client that sends or declares a larger one is disconnected, and sskv
// refuses to send one). A value is thus a little under 4 MiB at most; raise
// -max-packet-size for larger ones.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/dsslock/dsslock/sskv/localstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "statestore:", err)
		os.Exit(1)
	}
}

func run() error { return runArgs(flag.CommandLine, os.Args[1:]) }

// runArgs defines the flags on fs, parses args and runs the store until
// SIGINT or SIGTERM.
func runArgs(fs *flag.FlagSet, args []string) error {
	listen := fs.String("listen", "127.0.0.1:1883", "plain MQTT `address` to listen on")
	tlsListen := fs.String("tls-listen", "127.0.0.1:8883", "TLS MQTT `address` (used with -tls-cert and -tls-key)")
	certFile := fs.String("tls-cert", "", "PEM certificate `file` for the TLS listener")
	keyFile := fs.String("tls-key", "", "PEM private key `file` for the TLS listener")
	maxKeys := fs.Int("max-keys", 0, "maximum number of keys (0: no limit)")
	maxKeySize := fs.Int("max-key-size", 0, "maximum key size in `bytes` (0: only the packet size limits it)")
	maxValueSize := fs.Int("max-value-size", 0, "maximum value size in `bytes` (0: only the packet size limits it)")
	maxPacketSize := fs.Int("max-packet-size", localstore.DefaultMaxPacketSize, "maximum MQTT packet size in `bytes` (at most 268435455)")
	verbose := fs.Bool("v", false, "log every connection and broker event")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Println(versionLine())
		return nil
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if *maxKeys < 0 || *maxKeySize < 0 || *maxValueSize < 0 || *maxPacketSize <= 0 {
		return fmt.Errorf("-max-keys, -max-key-size and -max-value-size must be 0 or more, -max-packet-size more than 0")
	}
	cfg := localstore.Config{Addr: *listen, MaxKeys: *maxKeys, MaxKeySize: *maxKeySize, MaxValueSize: *maxValueSize,
		MaxPacketSize: *maxPacketSize, Logger: log}
	if !*verbose {
		// The broker logs every connection at INFO; keep only its warnings.
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if (*certFile == "") != (*keyFile == "") {
		return fmt.Errorf("-tls-cert and -tls-key go together")
	}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return err
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		cfg.TLSAddr = *tlsListen
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := localstore.Start(cfg)
	if err != nil {
		return err
	}
	log.Info("listening", "addr", srv.Addr())
	if cfg.TLS != nil {
		log.Info("listening", "tls_addr", srv.TLSAddr())
	}
	<-ctx.Done()
	log.Info("shutting down")
	return srv.Close()
}

// versionLine describes the program: its module version (as go install
// module@version stamps it) and the Go it was built with.
func versionLine() string {
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	return fmt.Sprintf("statestore %s (github.com/dsslock/dsslock, %s)", version, runtime.Version())
}
