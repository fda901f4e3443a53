// Command statestore runs the local state store as a standalone server: an
// MQTT v5 broker with the Azure IoT Operations state store built in, for
// developing on a laptop instead of a cluster.
//
//	go run ./cmd/statestore                   # serves on 127.0.0.1:1883
//	go run ./cmd/statestore -listen :1883     # every interface
//	go run ./cmd/statestore -listen 127.0.0.1:0  # a free port, logged
//
// It logs the address it listens on and stops cleanly on SIGINT or SIGTERM.
// Data lives in memory only.
//
// Limits: a value is at most -max-value-size bytes (default 1 MiB; a larger
// SET gets "the quota has been exceeded"), and an MQTT packet at most
// -max-packet-size bytes (default 4 MiB; a client that sends or even declares
// a larger one is disconnected). Raise both together for larger values.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/dsslock/dsslock/sskv/localstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "statestore:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:1883", "plain MQTT `address` to listen on")
	tlsListen := flag.String("tls-listen", "127.0.0.1:8883", "TLS MQTT `address` (used with -tls-cert and -tls-key)")
	certFile := flag.String("tls-cert", "", "PEM certificate `file` for the TLS listener")
	keyFile := flag.String("tls-key", "", "PEM private key `file` for the TLS listener")
	maxKeys := flag.Int("max-keys", 0, "maximum number of keys (0: no limit)")
	maxValueSize := flag.Int("max-value-size", 1<<20, "maximum value size in `bytes` (0: only the packet size limits it)")
	maxPacketSize := flag.Int("max-packet-size", localstore.DefaultMaxPacketSize, "maximum MQTT packet size in `bytes` (at most 268435455)")
	verbose := flag.Bool("v", false, "log every connection and broker event")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if *maxKeys < 0 || *maxValueSize < 0 || *maxPacketSize <= 0 {
		return fmt.Errorf("-max-keys and -max-value-size must be 0 or more, -max-packet-size more than 0")
	}
	cfg := localstore.Config{Addr: *listen, MaxKeys: *maxKeys, MaxValueSize: *maxValueSize,
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
