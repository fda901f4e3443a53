package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsslock/dsslock/sskv"
)

// Exit statuses.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var cf connFlags
	gfs := newConnFlags(&cf)
	if err := gfs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return exitOK
		}
		return usageFail(stderr, "", err.Error())
	}
	cf.set = map[string]bool{}
	gfs.Visit(func(f *flag.Flag) { cf.set[f.Name] = true })

	args = gfs.Args()
	if len(args) == 0 {
		return usageFail(stderr, "", "no command (one of "+commandNames()+")")
	}
	if args[0] == "version" {
		fmt.Fprintln(stdout, versionLine("sskv"))
		return exitOK
	}
	if args[0] == "help" {
		switch {
		case len(args) == 1 || len(args) == 2 && isHelpFlag(args[1]):
			usage(stdout)
		case len(args) == 2 && findCommand(args[1]) != nil:
			findCommand(args[1]).usage(stdout)
		default:
			return usageFail(stderr, "", fmt.Sprintf("help %s: unknown command (one of %s)", strings.Join(args[1:], " "), commandNames()))
		}
		return exitOK
	}
	cmd := findCommand(args[0])
	if cmd == nil {
		return usageFail(stderr, "", fmt.Sprintf("unknown command %q (one of %s)", args[0], commandNames()))
	}

	o := cmdOpts{given: map[string]bool{}}
	fs := cmd.flagSet(&o)
	pos, err := parseInterspersed(fs, args[1:])
	fs.Visit(func(f *flag.Flag) { o.given[f.Name] = true })
	if err == nil {
		err = checkArgs(cmd, &o, pos)
	}
	if errors.Is(err, flag.ErrHelp) {
		cmd.usage(stdout)
		return exitOK
	}
	if err != nil {
		msg := fmt.Sprintf("%s: %v", cmd.name, err)
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok && gfs.Lookup(strings.TrimPrefix(name, "-")) != nil {
			msg += fmt.Sprintf("\n(-%s is a connection flag: give it before the command)", name)
		}
		return usageFail(stderr, cmd.name, msg)
	}

	cfg, err := cf.config(stderr)
	if err != nil {
		return fail(stderr, err)
	}
	var value []byte
	if cmd.fileArgs {
		if value, err = readValue(&o, pos, stdin); err != nil {
			return fail(stderr, err)
		}
	}

	dctx, cancel := context.WithTimeout(ctx, cf.timeout)
	c, err := sskv.Dial(dctx, cfg)
	cancel()
	if err != nil {
		code := fail(stderr, err)
		dialHint(stderr, cfg.Addr, cf.handshake, err)
		return code
	}
	defer c.Close()

	switch cmd.name {
	case "watch":
		return watch(ctx, c, pos, stdout, stderr)
	case "lock":
		// The lock's warnings reach the user; its loss, sskv reports
		// itself, unless -v shows all the lock's own logs.
		log := cfg.Logger
		if !cf.verbose {
			log = slog.New(withoutLoss{log.Handler()})
		}
		return runLocked(ctx, c, pos[0], lockKind{limit: o.limit, read: o.read, write: o.write}, pos[1:], o.ttl, o.maxHold, log, stdin, stdout, stderr)
	case "elect":
		if o.listen {
			return observeElection(ctx, c, pos[0], stdout, stderr)
		}
		var log *slog.Logger // sskv reports a loss itself; -v shows the election's own logs
		if cf.verbose {
			log = cfg.Logger
		}
		prio := -1 // not a candidate of the priority protocol
		if o.given["priority"] {
			prio = o.prio
		}
		return elect(ctx, c, pos[0], []byte(pos[1]), o.ttl, prio, log, stdout, stderr)
	}
	rctx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	if o.force {
		o.ft = forceToken(cmd.name, time.Now())
	}
	var code int
	switch cmd.name {
	case "get":
		return get(rctx, c, pos[0], o.raw, stdout, stderr)
	case "set":
		code, err = set(rctx, c, pos[0], value, &o, stdout, stderr)
	case "del":
		var res sskv.DelResult
		res, err = c.Del(rctx, pos[0], sskv.DelOptions{FencingToken: o.ft})
		code = delOutcome(res, err, stdout, stderr)
	case "vdel":
		var res sskv.DelResult
		res, err = c.VDel(rctx, pos[0], value, sskv.DelOptions{FencingToken: o.ft})
		code = delOutcome(res, err, stdout, stderr)
	default:
		return fail(stderr, fmt.Errorf("command %s not implemented", cmd.name))
	}
	fencingHint(stderr, cmd.name, pos[0], err)
	return code
}

func checkArgs(cmd *command, o *cmdOpts, pos []string) error {
	minArgs, maxArgs := cmd.minArgs, cmd.maxArgs
	if cmd.fileArgs && o.file != "" {
		minArgs, maxArgs = minArgs-1, maxArgs-1 // VALUE comes from the file
	}
	switch {
	case len(pos) < minArgs:
		return usagef("missing arguments (want %s)", cmd.args)
	case maxArgs >= 0 && len(pos) > maxArgs:
		if cmd.fileArgs && o.file != "" {
			return usagef("VALUE and -file are both given")
		}
		return usagef("too many arguments %q", pos[maxArgs:])
	case o.nx && o.nex:
		return usagef("-nx and -nex exclude each other")
	case o.force && o.given["ft"]:
		return usagef("-force and -ft exclude each other")
	case cmd.check != nil:
		return cmd.check(o, pos)
	}
	return nil
}

func readValue(o *cmdOpts, pos []string, stdin io.Reader) ([]byte, error) {
	switch o.file {
	case "":
		return []byte(pos[1]), nil
	case "-":
		if stdin == nil {
			return nil, errors.New("no standard input")
		}
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
		return b, nil
	}
	return os.ReadFile(o.file)
}

// config builds the client's configuration from the connection flags.
func (cf *connFlags) config(stderr io.Writer) (sskv.Config, error) {
	if cf.timeout <= 0 {
		return sskv.Config{}, usagef("-timeout must be positive")
	}
	if cf.handshake <= 0 {
		return sskv.Config{}, usagef("-handshake-timeout must be positive")
	}
	var cfg sskv.Config
	if cf.env {
		var err error
		if cfg, err = sskv.ConfigFromEnv(); err != nil {
			return cfg, err
		}
	}
	if !cf.env || cf.set["addr"] {
		if err := checkAddr(cf.addr); err != nil {
			return cfg, err
		}
		cfg.Addr = cf.addr
	}
	if cf.set["client-id"] {
		cfg.ClientID = cf.clientID
	}
	if cf.set["user"] {
		cfg.Username = cf.user
	}
	if cf.set["password-file"] {
		cfg.PasswordFile = cf.passwordFile
		if !cf.set["sat-file"] {
			cfg.SATFile = ""
		}
	}
	if cf.set["sat-file"] {
		cfg.SATFile = cf.satFile
		if !cf.set["password-file"] {
			cfg.PasswordFile = ""
		}
	}
	if cfg.SATFile != "" && cfg.PasswordFile != "" {
		if cf.set["sat-file"] && cf.set["password-file"] {
			return cfg, usagef("-sat-file and -password-file exclude each other")
		}
	}
	// The client reads these files on every connection attempt, and would
	// retry until -timeout if one cannot be read: check them now.
	for _, f := range []struct{ flag, path string }{{"-password-file", cfg.PasswordFile}, {"-sat-file", cfg.SATFile}} {
		if f.path == "" {
			continue
		}
		fh, err := os.Open(f.path)
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", f.flag, err)
		}
		_ = fh.Close()
	}
	if !cf.env || cf.set["client-id"] {
		// A one-shot client never wants a session left by an earlier run
		// with the same id.
		cfg.CleanStart = true
	}
	cfg.RequestTimeout = cf.timeout
	// A command line wants the first failure's cause at once, not retries
	// until -timeout (a refused connection, a wrong port, a TLS mismatch).
	cfg.FailFast = true
	// And a server that accepts connections but does not answer (no MQTT
	// broker there, or a stalled one) is named after -handshake-timeout,
	// not after the attempt's 6 s with a bare "deadline exceeded".
	cfg.HandshakeTimeout = cf.handshake
	level := slog.LevelWarn
	if cf.verbose {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	tlsFlags := cf.set["ca"] || cf.set["cert"] || cf.set["key"] || cf.insecure
	useTLS := cfg.TLS != nil || tlsFlags
	if cf.set["tls"] {
		useTLS = cf.useTLS
	}
	if !useTLS {
		if tlsFlags {
			return cfg, usagef("-ca, -cert, -key and -insecure-skip-verify need TLS, but -tls=false")
		}
		cfg.TLS = nil
		return cfg, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLS != nil {
		tc = cfg.TLS.Clone()
	}
	if cf.caFile != "" {
		pem, err := os.ReadFile(cf.caFile)
		if err != nil {
			return cfg, fmt.Errorf("-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, fmt.Errorf("-ca %s: no PEM certificate found", cf.caFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case cf.certFile != "" && cf.keyFile != "":
		cert, err := tls.LoadX509KeyPair(cf.certFile, cf.keyFile)
		if err != nil {
			return cfg, fmt.Errorf("-cert/-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case cf.certFile != "" || cf.keyFile != "":
		return cfg, usagef("-cert and -key go together")
	}
	if cf.insecure {
		tc.InsecureSkipVerify = true
		fmt.Fprintln(stderr, "sskv: warning: -insecure-skip-verify: the broker's certificate is not verified; use it only for development")
	}
	cfg.TLS = tc
	return cfg, nil
}

// checkAddr refuses an -addr that is not host:port with a numeric port, as a
// usage error. An empty host (":1883") is this machine, as for net.Dial.
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("-addr %q: want host:port", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return usagef("-addr %q: the port must be a number from 1 to 65535", addr)
	}
	return nil
}

// dialHint says what to check after a connection failed, by its cause.
func dialHint(stderr io.Writer, addr string, handshake time.Duration, err error) {
	var ce *sskv.ConnectError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		fmt.Fprintf(stderr, "sskv: nothing listens on %s: is the broker running there, and is -addr right?\n", addr)
	case errors.Is(err, sskv.ErrNoAnswer):
		fmt.Fprintf(stderr, "sskv: a broker that is slow to answer needs a longer -handshake-timeout (now %v)\n", handshake)
	case errors.As(err, new(x509.UnknownAuthorityError)):
		fmt.Fprintln(stderr, "sskv: the broker's certificate is not trusted here: give the CA that signed it with -ca\n(with -env: AIO_TLS_CA_FILE)")
	case errors.As(err, new(x509.HostnameError)):
		fmt.Fprintln(stderr, "sskv: the broker's certificate does not name the host of -addr: connect by a name it has")
	case errors.As(err, &ce) && (ce.ReasonCode == 0x86 || ce.ReasonCode == 0x87 || ce.ReasonCode == 0x8C):
		fmt.Fprintln(stderr, "sskv: check the credentials: -user and -password-file, or -sat-file\n(with -env: AIO_MQTT_USERNAME, AIO_MQTT_PASSWORD_FILE, AIO_SAT_FILE)")
	}
}

// usageFail prints a usage error, then where to read the usage (that of
// command cmd, or sskv's when cmd is ""), not the usage itself: the error
// must not scroll away. It returns exitUsage.
func usageFail(stderr io.Writer, cmd, msg string) int {
	fmt.Fprintf(stderr, "sskv: %s\n", msg)
	if cmd != "" {
		fmt.Fprintf(stderr, "Run 'sskv help %s' for usage.\n", cmd)
	} else {
		fmt.Fprintln(stderr, "Run 'sskv -h' for usage.")
	}
	return exitUsage
}

// commandNames lists the commands, for a usage error.
func commandNames() string {
	names := make([]string, 0, len(commands)+2)
	for _, c := range commands {
		names = append(names, c.name)
	}
	return strings.Join(append(names, "help", "version"), ", ")
}

// fail prints err and returns the exit status for it.
func fail(stderr io.Writer, err error) int {
	msg := strings.TrimPrefix(err.Error(), "sskv: ")
	fmt.Fprintf(stderr, "sskv: %s\n", msg)
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "Run 'sskv -h' for usage.")
		return exitUsage
	}
	return exitError
}
