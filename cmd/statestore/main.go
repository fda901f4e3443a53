// Command statestore runs the local state store as a standalone server: an
// MQTT v5 broker with the Azure IoT Operations state store built in, for
// developing on a laptop instead of a cluster.
//
// Install and run it:
//
//	go install github.com/dsslock/dsslock/cmd/statestore@latest
//	statestore                            # serves on 127.0.0.1:1883, to anonymous clients
//	statestore -listen 127.0.0.1:0        # a free port, logged
//	statestore -version
//
// It logs the address it listens on and stops cleanly on SIGINT or SIGTERM.
// Keys live in memory only, unless persistence is on (below).
//
// # Persistence
//
// As the service's broker, it can keep keys across a restart, in a data
// directory:
//
//	statestore -data-dir ./ss-data -persist dynamic
//	statestore -data-dir ./ss-data -persist all
//
// The modes of -persist:
//
//   - none (default): every key is lost when the store stops.
//   - dynamic: keys whose SET carried the user property
//     aio-persistence: true (sskv's SetOptions.Persist, the Go SDK's
//     WithPersist) are kept, the service's dynamic persistence; a later
//     SET without it makes the key memory-only again.
//   - all: every key is kept.
//
// A kept key comes back with its value, version, fencing token and expiry
// (a key whose expiry passed while the store was down is gone); versions go
// on above every one issued before, persisted or not. A write that persists
// a key is answered once it is on disk (about one fsync; concurrent writes
// share one). -data-dir is created if missing; the store refuses to start
// on a directory it cannot write, a corrupt data file, or a directory
// another statestore process is using. A full disk fails persisted writes
// (the client gets the error) while reads and other writes go on.
//
// # Who may connect
//
// By default it asks for no credentials, and listens on the loopback
// interface only: every client is the same anonymous user, which may read,
// change and delete every key and every other client's locks. That is what
// a laptop needs, and all a store that anyone who reaches it may use
// should ever be. It refuses to listen anywhere else (say -listen :1883,
// every interface) without authentication, unless -allow-anonymous-network
// says so.
//
// To authenticate clients and keep them apart (see the package
// documentation of sskv/localstore, "Tenants", and docs/localstore.md):
//
//		statestore -listen :1883 -users users.txt -key-prefix alice=a/ -key-prefix bob=b/
//		statestore -listen - -tls-listen :8883 -tls-cert server.pem -tls-key server.key \
//		    -client-ca ca.pem -key-prefixes prefixes.txt
//
//	  - -users FILE: lines "name:password" (blank lines and lines starting
//	    with # are skipped, spaces around each part ignored). A client must
//	    give one of these, or a token of -sat-tokens.
//	  - -sat-tokens FILE: lines "user:token", Kubernetes service account
//	    tokens accepted with MQTT v5 enhanced authentication (method
//	    K8S-SAT), as Azure IoT Operations does; the client is then that user.
//	  - -client-ca FILE: PEM CA certificates; the TLS listener then requires a
//	    client certificate they verify. Without -users and -sat-tokens, the
//	    client's user is its certificate's Subject CommonName; with them, a
//	    certificate is required too but the user is the one its password or
//	    token names. The plain listener never sees certificates: disable it
//	    (-listen -) unless it is on loopback for anonymous clients.
//	  - -key-prefix user=prefix, repeated, and -key-prefixes FILE (lines
//	    "user=prefix"): each user reads, writes and watches only keys that
//	    start with one of its prefixes (the user "" is the anonymous one; the
//	    prefix "" is every key). A user with no prefix has no keys at all
//	    ("not authorized").
//
// Passwords and tokens cross the plain listener in clear: off loopback,
// use the TLS listener.
//
// # Limits
//
// Its limits on the size of things default to those of an embedded store
// (localstore.Config's zero value), so a test passes or fails alike on
// both: no limit on the number of keys or on the size of a key or value
// (-max-keys, -max-key-size, -max-value-size; a SET beyond a limit gets
// "the quota has been exceeded"), and MQTT packets of at most 4 MiB
// (-max-packet-size, announced in CONNACK: a client that sends or declares
// a larger one is disconnected, and sskv refuses to send one). A value is
// thus a little under 4 MiB at most; raise -max-packet-size for larger
// ones.
//
// Unlike an embedded store's, whose zero Config sets none of them, it
// limits by default what one user or connection can make it keep, so that
// no client exhausts its memory for the others (0 turns a limit off):
//
//   - -max-watches-per-client 10000: KEYNOTIFYs of one connection (beyond:
//     "the quota has been exceeded");
//   - -max-subscriptions-per-client 1000: subscriptions of one client
//     (beyond: SUBACK 0x97, quota exceeded);
//   - -max-retained-per-user 1000 and -max-retained-bytes-per-user 16 MiB:
//     retained messages of one user (beyond: PUBACK 0x97);
//   - -max-keys-per-user 10000 and -max-bytes-per-user 256 MiB: keys one
//     user created, and their bytes (beyond: "the quota has been
//     exceeded"). These apply by default only when clients authenticate
//     (-users, -sat-tokens or -client-ca): without, all clients are one
//     user, and the store keeps an embedded store's behaviour unless they
//     are given explicitly.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
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

// Defaults of the standalone store's limits that an embedded store does not
// set (see the package documentation, "Limits").
const (
	defaultMaxWatchesPerClient       = 10000
	defaultMaxSubscriptionsPerClient = 1000
	defaultMaxRetainedPerUser        = 1000
	defaultMaxRetainedBytesPerUser   = 16 << 20
	defaultMaxKeysPerUser            = 10000
	defaultMaxBytesPerUser           = 256 << 20
)

// runArgs defines the flags on fs, parses args and runs the store until
// SIGINT or SIGTERM.
func runArgs(fs *flag.FlagSet, args []string) error {
	cfg, log, err := configure(fs, args)
	if err != nil || cfg == nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := localstore.Start(*cfg)
	if err != nil {
		return err
	}
	if cfg.Addr != "-" {
		log.Info("listening", "addr", srv.Addr())
	}
	if cfg.TLS != nil {
		log.Info("listening", "tls_addr", srv.TLSAddr())
	}
	trimmed := make(chan struct{})
	go func() {
		defer close(trimmed)
		trimStacks(ctx, trimInterval, trimThreshold) // see trim.go
	}()
	<-ctx.Done()
	<-trimmed
	log.Info("shutting down")
	return srv.Close()
}

// configure defines the flags on fs, parses args and returns the store's
// configuration and the program's logger; a nil Config (and no error) when
// there is nothing to run (-version).
func configure(fs *flag.FlagSet, args []string) (*localstore.Config, *slog.Logger, error) {
	listen := fs.String("listen", "127.0.0.1:1883", "plain MQTT `address` to listen on (- disables it); off loopback only with authentication (or -allow-anonymous-network)")
	tlsListen := fs.String("tls-listen", "127.0.0.1:8883", "TLS MQTT `address` (used with -tls-cert and -tls-key)")
	certFile := fs.String("tls-cert", "", "PEM certificate `file` for the TLS listener")
	keyFile := fs.String("tls-key", "", "PEM private key `file` for the TLS listener")
	usersFile := fs.String("users", "", "`file` of name:password lines: clients must authenticate as one of these users")
	satFile := fs.String("sat-tokens", "", "`file` of user:token lines: Kubernetes service account tokens accepted (MQTT v5 enhanced authentication K8S-SAT)")
	clientCA := fs.String("client-ca", "", "PEM CA certificates `file`: the TLS listener requires client certificates they verify (user = Subject CommonName without -users and -sat-tokens)")
	prefixes := keyPrefixes{}
	fs.Func("key-prefix", "`user=prefix`: the user may use only keys with one of its prefixes (repeat it; the user \"\" is the anonymous one, the prefix \"\" every key)", prefixes.add)
	prefixFile := fs.String("key-prefixes", "", "`file` of user=prefix lines, as -key-prefix")
	allowAnon := fs.Bool("allow-anonymous-network", false, "allow listening off loopback without authentication: anyone who reaches the store may read and change every key")
	maxKeys := fs.Int("max-keys", 0, "maximum number of keys (0: no limit)")
	maxKeySize := fs.Int("max-key-size", 0, "maximum key size in `bytes` (0: only the packet size limits it)")
	maxValueSize := fs.Int("max-value-size", 0, "maximum value size in `bytes` (0: only the packet size limits it)")
	maxPacketSize := fs.Int("max-packet-size", localstore.DefaultMaxPacketSize, "maximum MQTT packet size in `bytes` (at most 268435455)")
	maxKeysPerUser := fs.Int("max-keys-per-user", defaultMaxKeysPerUser, "maximum keys one user creates (0: no limit); by default only when clients authenticate")
	maxBytesPerUser := fs.Int64("max-bytes-per-user", defaultMaxBytesPerUser, "maximum `bytes` (keys and values) of the keys one user creates (0: no limit); by default only when clients authenticate")
	maxWatches := fs.Int("max-watches-per-client", defaultMaxWatchesPerClient, "maximum watches (KEYNOTIFY) of one connection (0: no limit)")
	maxSubs := fs.Int("max-subscriptions-per-client", defaultMaxSubscriptionsPerClient, "maximum subscriptions of one client (0: no limit)")
	maxRetained := fs.Int("max-retained-per-user", defaultMaxRetainedPerUser, "maximum retained messages of one user (0: no limit)")
	maxRetainedBytes := fs.Int64("max-retained-bytes-per-user", defaultMaxRetainedBytesPerUser, "maximum `bytes` of one user's retained messages (0: no limit)")
	dataDir := fs.String("data-dir", "", "`directory` of persisted keys (with -persist dynamic or all; created if missing, one store at a time)")
	persist := fs.String("persist", "none", "persistence `mode`, which keys survive a restart in -data-dir: none, dynamic (those whose SET carried aio-persistence: true) or all")
	verbose := fs.Bool("v", false, "log every connection and broker event")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if *version {
		fmt.Println(versionLine())
		return nil, nil, nil
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if *maxKeys < 0 || *maxKeySize < 0 || *maxValueSize < 0 || *maxPacketSize <= 0 {
		return nil, nil, fmt.Errorf("-max-keys, -max-key-size and -max-value-size must be 0 or more, -max-packet-size more than 0")
	}
	if *maxKeysPerUser < 0 || *maxBytesPerUser < 0 || *maxWatches < 0 || *maxSubs < 0 || *maxRetained < 0 || *maxRetainedBytes < 0 {
		return nil, nil, fmt.Errorf("-max-keys-per-user, -max-bytes-per-user, -max-watches-per-client, -max-subscriptions-per-client, " +
			"-max-retained-per-user and -max-retained-bytes-per-user must be 0 (no limit) or more")
	}
	mode, err := localstore.ParsePersistMode(*persist)
	if err != nil {
		return nil, nil, fmt.Errorf("-persist: %w", err)
	}
	if mode != localstore.PersistNone && *dataDir == "" {
		return nil, nil, fmt.Errorf("-persist %s needs -data-dir", mode)
	}
	if mode == localstore.PersistNone && *dataDir != "" {
		return nil, nil, errors.New("-data-dir needs -persist dynamic or all: with -persist none nothing is kept")
	}
	addr := *listen
	if addr == "" {
		addr = "-"
	}
	cfg := localstore.Config{Addr: addr, MaxKeys: *maxKeys, MaxKeySize: *maxKeySize, MaxValueSize: *maxValueSize,
		MaxPacketSize: *maxPacketSize, MaxWatchesPerClient: *maxWatches, MaxSubscriptionsPerClient: *maxSubs,
		MaxRetainedPerUser: *maxRetained, MaxRetainedBytesPerUser: *maxRetainedBytes, Logger: log,
		Persist: mode, DataDir: *dataDir}
	if !*verbose {
		// The broker logs every connection at INFO; keep only its warnings.
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	if *usersFile != "" {
		if cfg.Users, err = readPairs(*usersFile, ":", "name:password", "user"); err != nil {
			return nil, nil, err
		}
	}
	var tokenUsers map[string]string // token -> user, as localstore wants it
	if *satFile != "" {
		byUser, err := readLines(*satFile, ":", "user:token")
		if err != nil {
			return nil, nil, err
		}
		tokenUsers = make(map[string]string)
		for _, l := range byUser {
			if first, dup := tokenUsers[l.val]; dup {
				return nil, nil, fmt.Errorf("%s:%d: this token is already given to %q", *satFile, l.line, first)
			}
			tokenUsers[l.val] = l.key
		}
		cfg.SATTokens = tokenUsers
	}
	if *prefixFile != "" {
		lines, err := readLines(*prefixFile, "=", "user=prefix")
		if err != nil {
			return nil, nil, err
		}
		for _, l := range lines {
			prefixes[l.key] = append(prefixes[l.key], l.val)
		}
	}

	if (*certFile == "") != (*keyFile == "") {
		return nil, nil, fmt.Errorf("-tls-cert and -tls-key go together")
	}
	if *clientCA != "" && *certFile == "" {
		return nil, nil, fmt.Errorf("-client-ca needs the TLS listener: give -tls-cert and -tls-key too")
	}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return nil, nil, err
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		cfg.TLSAddr = *tlsListen
		if *clientCA != "" {
			pem, err := os.ReadFile(*clientCA)
			if err != nil {
				return nil, nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("%s: no PEM certificate in it", *clientCA)
			}
			cfg.TLS.ClientCAs = pool
			cfg.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	if cfg.Addr == "-" && cfg.TLS == nil {
		return nil, nil, fmt.Errorf("no listener: -listen - disables the plain listener, and there is no TLS listener without -tls-cert and -tls-key")
	}

	passwords := cfg.Users != nil || cfg.SATTokens != nil
	authenticated := passwords || *clientCA != ""
	if len(prefixes) > 0 {
		cfg.KeyPrefixes = prefixes
		if passwords && *clientCA == "" {
			if err := knownUsers(prefixes, cfg.Users, cfg.SATTokens); err != nil {
				return nil, nil, err
			}
		}
	}
	if !authenticated {
		if !set["max-keys-per-user"] {
			*maxKeysPerUser = 0
		}
		if !set["max-bytes-per-user"] {
			*maxBytesPerUser = 0
		}
	}
	cfg.MaxKeysPerUser, cfg.MaxBytesPerUser = *maxKeysPerUser, *maxBytesPerUser

	if err := checkExposure(cfg.Addr, "-listen", passwords, *allowAnon); err != nil {
		return nil, nil, err
	}
	if cfg.TLS != nil {
		if err := checkExposure(cfg.TLSAddr, "-tls-listen", authenticated, *allowAnon); err != nil {
			return nil, nil, err
		}
	}
	if authenticated && cfg.Addr != "-" && !passwords {
		log.Warn("the plain listener accepts anonymous clients: only the TLS listener verifies client certificates; -listen - disables it",
			"addr", cfg.Addr)
	}
	if passwords && cfg.Addr != "-" {
		if loop, _ := isLoopback(cfg.Addr); !loop {
			log.Warn("passwords and tokens cross the plain listener in clear; prefer the TLS listener off loopback", "addr", cfg.Addr)
		}
	}
	if authenticated {
		log.Info("authenticating clients", "users", len(cfg.Users), "sat_tokens", len(cfg.SATTokens),
			"client_ca", *clientCA, "key_prefix_users", len(cfg.KeyPrefixes))
	}
	return &cfg, log, nil
}

// keyPrefixes collects -key-prefix flags.
type keyPrefixes map[string][]string

func (p keyPrefixes) add(v string) error {
	user, prefix, ok := strings.Cut(v, "=")
	if !ok {
		return errors.New("want user=prefix")
	}
	p[user] = append(p[user], prefix)
	return nil
}

// knownUsers refuses key prefixes for a user that no password or token
// names: a typo would otherwise leave the intended user without keys.
func knownUsers(prefixes keyPrefixes, users, tokens map[string]string) error {
	known := make(map[string]bool)
	for u := range users {
		known[u] = true
	}
	for _, u := range tokens {
		known[u] = true
	}
	var unknown []string
	for u := range prefixes {
		if !known[u] {
			unknown = append(unknown, u)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return fmt.Errorf("key prefixes for users %q, whom neither -users nor -sat-tokens names: no client could use them", unknown)
}

// checkExposure refuses a listener off loopback that anyone may use.
func checkExposure(addr, flagName string, authenticated, allowAnon bool) error {
	if addr == "-" || authenticated || allowAnon {
		return nil
	}
	loop, err := isLoopback(addr)
	if err != nil {
		return fmt.Errorf("%s %s: %w", flagName, addr, err)
	}
	if loop {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s (%s) without authentication: anyone who can reach it could read, "+
		"change and delete every key and take every lock. Authenticate clients (-users, -sat-tokens, or -client-ca on the TLS listener), "+
		"listen on loopback (e.g. %s 127.0.0.1:1883), or pass -allow-anonymous-network if an open store is what you want",
		addr, flagName, flagName)
}

// isLoopback reports whether the listen address addr is on a loopback
// interface only: its host is localhost or a loopback IP. An empty host
// (every interface) and any other host name are not.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false, nil // a host name: it could resolve to anything
	}
	return ip.IsLoopback(), nil
}

// line is one key-value line of a file, with its line number.
type line struct {
	key, val string
	line     int
}

// readLines reads the lines "key<sep>value" of path: blank lines and lines
// starting with # are skipped, spaces around key and value are removed.
// Neither key nor value may be empty, except the key (the anonymous user)
// of a "user=prefix" line, whose value may be empty too.
func readLines(path, sep, form string) ([]line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := []line{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		k, v, ok := strings.Cut(text, sep)
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || sep != "=" && (k == "" || v == "") {
			return nil, fmt.Errorf("%s:%d: want %s", path, n, form)
		}
		out = append(out, line{key: k, val: v, line: n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no %s line in it", path, form)
	}
	return out, nil
}

// readPairs reads a file of readLines whose keys (of what) are unique.
func readPairs(path, sep, form, what string) (map[string]string, error) {
	lines, err := readLines(path, sep, form)
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(lines))
	first := make(map[string]int, len(lines))
	for _, l := range lines {
		if n, dup := first[l.key]; dup {
			return nil, fmt.Errorf("%s:%d: %s %q is already on line %d", path, l.line, what, l.key, n)
		}
		first[l.key] = l.line
		m[l.key] = l.val
	}
	return m, nil
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
