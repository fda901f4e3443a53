package sskv

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dsslock/dsslock/hlc"
)

// Defaults applied by [Dial] to zero fields of [Config].
const (
	DefaultKeepAlive      = 5 * time.Second
	DefaultPingTimeout    = time.Second
	DefaultMaxPacketSize  = 16 << 20
	DefaultSessionExpiry  = 5 * time.Minute
	DefaultRequestTimeout = 10 * time.Second
	DefaultReconnectMin   = 100 * time.Millisecond
	DefaultReconnectMax   = 10 * time.Second
	DefaultWatchBuffer    = 1024
)

// Config configures a [Client]. Only Addr is required; every other zero
// field means "use the default".
type Config struct {
	// Addr is the broker's "host:port". An empty host (":1883") is this
	// machine ("localhost"), as for net.Dial.
	Addr string

	// TLS, when not nil, connects with TLS using this configuration (its
	// ServerName defaults to the host of Addr). Nil means plain TCP.
	TLS *tls.Config

	// ClientID is the MQTT client id, which is also the node id of the
	// client's hybrid logical clock and part of its response and notification
	// topics. It must not contain ':', '+', '#', '/' or control characters.
	// Default: "dsslock-" followed by 16 random hex digits.
	ClientID string

	// CleanStart discards any session the broker holds for ClientID on the
	// first connection. Reconnections always resume the session.
	CleanStart bool

	// KeepAlive is the MQTT keep alive (whole seconds, at most 65535 s):
	// the client pings the broker when nothing has been both sent and
	// received for this long, and the broker drops a client it has not
	// heard from for 1.5 times as long. Default 5 s, so that an idle dead
	// connection is found within KeepAlive+PingTimeout (6 s), less than the
	// leases of a few seconds that locks hold; it costs one 2-byte ping
	// each way per KeepAlive on an idle connection. See "Costs" in the
	// package documentation.
	KeepAlive time.Duration

	// PingTimeout is how long the client waits for any packet from the
	// broker after a PINGREQ before it drops the connection as dead and
	// reconnects. The client also pings at once when a request times out,
	// so a dead connection under traffic is replaced about PingTimeout
	// after the first request that timed out. At most KeepAlive.
	// Default 1 s.
	PingTimeout time.Duration

	// MaxPacketSize is the largest MQTT packet the client accepts from the
	// broker, in bytes, fixed header included. It is announced in CONNECT
	// (Maximum Packet Size), so a conforming broker never sends more; a
	// packet that declares more ends the connection before anything is
	// allocated for it ([ErrPacketTooLarge]). From 1 KiB to 268435460 (the
	// MQTT maximum). Default 16 MiB.
	//
	// What a smaller MaxPacketSize costs: a value whose response or
	// notification does not fit in it can be neither read nor watched. A
	// message's topic, properties and framing take about 220 bytes with the
	// default ClientID (more with a longer one), a notification's also
	// twice the key's length. Against the local state store (package
	// localstore) a GET of such a value fails at once with a
	// *[ServiceError], and a watcher of a key set to it is disconnected,
	// then ended with that error ([Watcher.Err]) when it reads the key again
	// after the reconnect. Against the deployed broker the broker drops the
	// message: the GET times out, and the watcher misses the change without
	// a word.
	MaxPacketSize int

	// FailFast makes Dial give up after the first connection attempt that
	// fails, whatever the reason (e.g. connection refused), instead of
	// retrying until its context ends: for command-line tools, where a
	// person waits. Reconnections after Dial has returned are not affected.
	// Failures that retrying cannot cure end Dial at once anyway (see
	// [Dial]).
	FailFast bool

	// HandshakeTimeout, when positive, bounds each wait of Dial's
	// connection attempts for the server's answer once the TCP connection
	// is up: the TLS handshake (with TLS), then the answer to CONNECT. A
	// server silent that long fails the attempt with [ErrNoAnswer]. Zero:
	// only the attempt's own bound, min(RequestTimeout,
	// KeepAlive+PingTimeout). A command-line tool sets it short, with
	// FailFast, so that an address that accepts connections but is no MQTT
	// broker is named at once: sskv uses 1 s, as a live broker answers
	// within a ping's time (PingTimeout). Reconnections after Dial has
	// returned are not affected: a broker slow to answer after an outage
	// is not cut short. A negative value is an error.
	HandshakeTimeout time.Duration

	// SessionExpiry is how long the broker keeps the session after the
	// connection drops (whole seconds). It must be positive: the session is
	// what carries a request in flight, and its response, across a reconnect.
	// Default 5 minutes. A negative value is an error.
	SessionExpiry time.Duration

	// Username, with Password or PasswordFile, authenticates with MQTT
	// username and password.
	Username string
	Password []byte
	// PasswordFile is read on every connection attempt (for rotated
	// secrets); its content is the password. It excludes Password.
	PasswordFile string

	// SATFile is the path of a Kubernetes service account token. When set, the
	// client authenticates with MQTT v5 enhanced authentication, method
	// "K8S-SAT", as Azure IoT Operations expects; the file is read on every
	// connection attempt, so a rotated token is used on the next reconnect.
	// It excludes Password and PasswordFile.
	SATFile string

	// RequestTimeout bounds a request whose context has no deadline.
	// Default 10 s.
	RequestTimeout time.Duration

	// ReconnectMin and ReconnectMax bound the jittered exponential delay
	// between connection attempts after the connection is lost. Defaults
	// 100 ms and 10 s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration

	// WatchBuffer is the number of events each Watcher buffers before a slow
	// consumer's events are coalesced (see [Watcher]). Default 1024. The
	// buffer grows only while events wait, so an idle watcher holds none: a
	// burst (a lock's queue, hundreds joining at once) is delivered event by
	// event rather than coalesced.
	WatchBuffer int

	// Logger receives the client's logs. Default: discarded.
	Logger *slog.Logger

	// Metrics are hooks for the client's metrics (see [Metrics]).
	Metrics Metrics

	// WallClock is the wall clock read by the client's hybrid logical clock,
	// which stamps every request (__ts). Default: time.Now. It is for tests
	// that simulate a host whose clock is skewed, e.g.
	// func() time.Time { return time.Now().Add(2 * time.Minute) }; the
	// state store refuses requests stamped more than a minute ahead of its
	// own clock ([ErrTimestampSkew]). It is called with the clock's lock
	// held and must not block. Timeouts, keep alives and backoffs use the
	// real clock whatever it returns.
	WallClock func() time.Time
}

// maxMQTTPacket is the largest packet MQTT can encode: a Remaining Length
// of 268435455 and a 5-byte fixed header.
const maxMQTTPacket = 268435455 + 5

// ErrConfig is wrapped by every error about an invalid [Config].
var ErrConfig = errors.New("sskv: invalid config")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

// withDefaults validates cfg and returns it with defaults filled in. It never
// reads files: PasswordFile and SATFile are read when connecting.
func (cfg Config) withDefaults(needAddr bool) (Config, error) {
	if needAddr {
		if cfg.Addr == "" {
			return cfg, configErr("Addr is empty")
		}
		host, port, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return cfg, configErr("Addr %q: %v", cfg.Addr, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return cfg, configErr("Addr %q: bad port", cfg.Addr)
		}
		if host == "" { // this machine, as for net.Dial and a listen address
			cfg.Addr = net.JoinHostPort("localhost", port)
		}
	}
	if cfg.ClientID == "" {
		cfg.ClientID = randomClientID()
	}
	if err := validateClientID(cfg.ClientID); err != nil {
		return cfg, err
	}
	switch {
	case cfg.KeepAlive < 0 || cfg.KeepAlive > math.MaxUint16*time.Second:
		return cfg, configErr("KeepAlive %v out of range", cfg.KeepAlive)
	case cfg.KeepAlive == 0:
		cfg.KeepAlive = DefaultKeepAlive
	}
	cfg.KeepAlive = (cfg.KeepAlive + time.Second - 1).Truncate(time.Second) // what CONNECT can say
	switch {
	case cfg.PingTimeout < 0 || cfg.PingTimeout > cfg.KeepAlive:
		return cfg, configErr("PingTimeout %v out of range (0 to KeepAlive %v)", cfg.PingTimeout, cfg.KeepAlive)
	case cfg.PingTimeout == 0:
		cfg.PingTimeout = min(DefaultPingTimeout, cfg.KeepAlive)
	}
	switch {
	case cfg.MaxPacketSize == 0:
		cfg.MaxPacketSize = DefaultMaxPacketSize
	case cfg.MaxPacketSize < 1024 || cfg.MaxPacketSize > maxMQTTPacket:
		return cfg, configErr("MaxPacketSize %d out of range (1024 to %d)", cfg.MaxPacketSize, maxMQTTPacket)
	}
	switch {
	case cfg.SessionExpiry < 0 || cfg.SessionExpiry > math.MaxUint32*time.Second:
		return cfg, configErr("SessionExpiry %v out of range (it must be positive so that requests survive a reconnect)", cfg.SessionExpiry)
	case cfg.SessionExpiry == 0:
		cfg.SessionExpiry = DefaultSessionExpiry
	case cfg.SessionExpiry < time.Second:
		return cfg, configErr("SessionExpiry %v is less than one second", cfg.SessionExpiry)
	}
	if cfg.HandshakeTimeout < 0 {
		return cfg, configErr("negative HandshakeTimeout %v", cfg.HandshakeTimeout)
	}
	if cfg.RequestTimeout < 0 {
		return cfg, configErr("negative RequestTimeout %v", cfg.RequestTimeout)
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.ReconnectMin < 0 || cfg.ReconnectMax < 0 {
		return cfg, configErr("negative ReconnectMin or ReconnectMax")
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = max(DefaultReconnectMax, cfg.ReconnectMin)
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		return cfg, configErr("ReconnectMax %v is less than ReconnectMin %v", cfg.ReconnectMax, cfg.ReconnectMin)
	}
	if cfg.WatchBuffer < 0 {
		return cfg, configErr("negative WatchBuffer %d", cfg.WatchBuffer)
	}
	if cfg.WatchBuffer == 0 {
		cfg.WatchBuffer = DefaultWatchBuffer
	}
	if len(cfg.Password) > 0 && cfg.PasswordFile != "" {
		return cfg, configErr("both Password and PasswordFile are set")
	}
	if cfg.SATFile != "" && (len(cfg.Password) > 0 || cfg.PasswordFile != "") {
		return cfg, configErr("SATFile excludes Password and PasswordFile")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

func validateClientID(id string) error {
	if !utf8.ValidString(id) {
		return configErr("ClientID %q is not valid UTF-8", id)
	}
	if strings.ContainsAny(id, "+#/") {
		return configErr("ClientID %q contains '+', '#' or '/'", id)
	}
	if err := hlc.ValidateNode(id); err != nil {
		return configErr("ClientID %q cannot be a clock node id: %v", id, err)
	}
	return nil
}

func randomClientID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "dsslock-" + hex.EncodeToString(b[:])
}

// Environment variables read by [ConfigFromEnv]: those Azure IoT Operations
// gives to applications.
const (
	EnvBrokerHostname = "AIO_BROKER_HOSTNAME"
	EnvBrokerPort     = "AIO_BROKER_TCP_PORT"
	EnvUseTLS         = "AIO_MQTT_USE_TLS"
	EnvClientID       = "AIO_MQTT_CLIENT_ID"
	EnvCleanStart     = "AIO_MQTT_CLEAN_START"
	EnvKeepAlive      = "AIO_MQTT_KEEP_ALIVE"
	EnvSessionExpiry  = "AIO_MQTT_SESSION_EXPIRY"
	EnvUsername       = "AIO_MQTT_USERNAME"
	EnvPasswordFile   = "AIO_MQTT_PASSWORD_FILE"
	EnvSATFile        = "AIO_SAT_FILE"
	EnvTLSCAFile      = "AIO_TLS_CA_FILE"
	EnvTLSCertFile    = "AIO_TLS_CERT_FILE"
	EnvTLSKeyFile     = "AIO_TLS_KEY_FILE"
)

// ConfigFromEnv builds a Config from the environment variables Azure IoT
// Operations sets for applications:
//
//	AIO_BROKER_HOSTNAME      broker host (required)
//	AIO_BROKER_TCP_PORT      broker port (default 18883 with TLS, 1883 without)
//	AIO_MQTT_USE_TLS         "true"/"false" (default true)
//	AIO_MQTT_CLIENT_ID       client id (default: random)
//	AIO_MQTT_CLEAN_START     "true"/"false" (default false)
//	AIO_MQTT_KEEP_ALIVE      seconds
//	AIO_MQTT_SESSION_EXPIRY  seconds (must be > 0)
//	AIO_MQTT_USERNAME        user name
//	AIO_MQTT_PASSWORD_FILE   file holding the password
//	AIO_SAT_FILE             service account token file (K8S-SAT)
//	AIO_TLS_CA_FILE          PEM CA bundle that verifies the broker
//	AIO_TLS_CERT_FILE        PEM client certificate (with AIO_TLS_KEY_FILE)
//	AIO_TLS_KEY_FILE         PEM client key
//
// The CA and client certificate files are read now; the password and token
// files on every connection attempt. An invalid value gives an error that
// wraps [ErrConfig] and names the variable.
func ConfigFromEnv() (Config, error) {
	return configFromLookup(os.LookupEnv)
}

func configFromLookup(lookup func(string) (string, bool)) (Config, error) {
	get := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	var cfg Config
	boolVar := func(name string, def bool) (bool, error) {
		v := get(name)
		if v == "" {
			return def, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, configErr("%s=%q: not a boolean", name, v)
		}
		return b, nil
	}
	secondsVar := func(name string) (time.Duration, error) {
		v := get(name)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, configErr("%s=%q: not a whole number of seconds", name, v)
		}
		return time.Duration(n) * time.Second, nil
	}

	host := get(EnvBrokerHostname)
	if host == "" {
		return cfg, configErr("%s is not set", EnvBrokerHostname)
	}
	useTLS, err := boolVar(EnvUseTLS, true)
	if err != nil {
		return cfg, err
	}
	port := get(EnvBrokerPort)
	if port == "" {
		port = "1883"
		if useTLS {
			port = "18883"
		}
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return cfg, configErr("%s=%q: not a port number", EnvBrokerPort, port)
	}
	cfg.Addr = net.JoinHostPort(host, port)
	cfg.ClientID = get(EnvClientID)
	if cfg.ClientID != "" {
		if err := validateClientID(cfg.ClientID); err != nil {
			return cfg, fmt.Errorf("%s: %w", EnvClientID, err)
		}
	}
	if cfg.CleanStart, err = boolVar(EnvCleanStart, false); err != nil {
		return cfg, err
	}
	if cfg.KeepAlive, err = secondsVar(EnvKeepAlive); err != nil {
		return cfg, err
	}
	if cfg.KeepAlive > math.MaxUint16*time.Second {
		return cfg, configErr("%s=%q: more than 65535 seconds", EnvKeepAlive, get(EnvKeepAlive))
	}
	if v := get(EnvSessionExpiry); v != "" {
		if cfg.SessionExpiry, err = secondsVar(EnvSessionExpiry); err != nil {
			return cfg, err
		}
		if cfg.SessionExpiry == 0 {
			return cfg, configErr("%s=0: the session expiry must be positive", EnvSessionExpiry)
		}
	}
	cfg.Username = get(EnvUsername)
	cfg.PasswordFile = get(EnvPasswordFile)
	cfg.SATFile = get(EnvSATFile)
	if cfg.SATFile != "" && cfg.PasswordFile != "" {
		return cfg, configErr("%s and %s are both set", EnvSATFile, EnvPasswordFile)
	}

	caFile, certFile, keyFile := get(EnvTLSCAFile), get(EnvTLSCertFile), get(EnvTLSKeyFile)
	if useTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return cfg, configErr("%s: %v", EnvTLSCAFile, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return cfg, configErr("%s=%q: no PEM certificate found", EnvTLSCAFile, caFile)
			}
			tc.RootCAs = pool
		}
		switch {
		case certFile != "" && keyFile != "":
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return cfg, configErr("%s/%s: %v", EnvTLSCertFile, EnvTLSKeyFile, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		case certFile != "":
			return cfg, configErr("%s is set without %s", EnvTLSCertFile, EnvTLSKeyFile)
		case keyFile != "":
			return cfg, configErr("%s is set without %s", EnvTLSKeyFile, EnvTLSCertFile)
		}
		cfg.TLS = tc
	} else if caFile != "" || certFile != "" || keyFile != "" {
		return cfg, configErr("TLS files are set but %s is false", EnvUseTLS)
	}
	return cfg, nil
}
