package sskv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
	"github.com/eclipse/paho.golang/paho/store/memory"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// satMethod is the MQTT v5 enhanced authentication method of Azure IoT
// Operations for Kubernetes service account tokens.
const satMethod = "K8S-SAT"

// closeGrace bounds how long Close waits for DISCONNECT to be written
// before it closes the socket.
const closeGrace = 250 * time.Millisecond

// publishTimeout is paho's own bound on a PUBLISH, SUBSCRIBE or UNSUBSCRIBE.
// Our contexts always carry the real deadline; paho's default (10 s) would
// otherwise end a publish early and hide whether it was sent.
const publishTimeout = 24 * time.Hour

// Client is a state store client on one MQTT v5 connection, which it keeps up
// by itself. It is safe for concurrent use; many requests may be in flight at
// once. Create one with [Dial], [DialEnv] or [NewFromConnection], and Close it
// when done.
type Client struct {
	cfg          Config
	id           string
	log          *slog.Logger
	clock        *hlc.Clock
	cm           *autopaho.ConnectionManager
	cmSet        chan struct{} // closed once cm is set
	sess         *sessionStore // the MQTT session's store of requests; nil for NewFromConnection
	pub          *publisher    // hands requests to paho; nil for NewFromConnection
	ownsCM       bool
	respTopic    string
	notifyFilter string
	invokeTopic  string // wire.InvokeTopic; tests point it at a fake service

	ctx    context.Context // done when Close starts
	cancel context.CancelFunc

	// Connection state. state is read lock-free on every request; stMu
	// serialises changes and guards stChanged, closed and replaced on each.
	state     atomic.Pointer[connState]
	stMu      sync.Mutex
	stChanged chan struct{}
	lastErr   atomic.Pointer[errBox]                  // last failed connection attempt, for Dial's error
	downErr   atomic.Pointer[errBox]                  // why the last connection ended
	badEnd    atomic.Bool                             // the broker ended the last connection blaming a packet (see sessionStore)
	conn      atomic.Pointer[mqttConn]                // the socket of the current connection attempt or connection
	pinger    *pinger                                 // nil for NewFromConnection
	dialing   atomic.Pointer[context.CancelCauseFunc] // set while Dial waits: ends it on a permanent error

	pmu     sync.Mutex
	pending map[[16]byte]*pending
	bound   map[[16]byte]uint64 // requests bound to a Conn, while paho handles them: the Conn's sessionStore sequence number
	// The most entries pending and bound held since they were last made:
	// see shrunk.
	pendingPeak, boundPeak int

	wmu      sync.Mutex
	nseq     atomic.Uint64 // notifications routed so far
	regs     map[string]*registration
	stopping map[string]chan struct{} // keys whose KEYNOTIFY STOP is in flight

	bgMu     sync.Mutex
	bgClosed bool
	wg       sync.WaitGroup

	closeOnce sync.Once
	closed    atomic.Bool

	testHookSync func(key string) // tests: called by a watch's sync before its KEYNOTIFY

	sharedMu sync.Mutex
	shared   map[any]any // see Shared
}

// connState is one state of the connection. gen counts connections: it is 0
// before the first and grows by one on each. ready means the response and
// notification subscriptions of connection gen are acknowledged.
type connState struct {
	gen       uint64
	ready     bool
	conn      *Conn // connection gen; nil before the first
	err       error // the response subscription was refused: requests fail
	notifyErr error // the notification subscription was refused: watches fail
}

type errBox struct{ err error }

func newClient(cfg Config) (*Client, error) {
	clock, err := hlc.NewClock(cfg.ClientID, hlc.WithWallClock(cfg.WallClock))
	if err != nil {
		return nil, configErr("ClientID: %v", err)
	}
	c := &Client{
		cfg:          cfg,
		id:           cfg.ClientID,
		log:          cfg.Logger.With("client", cfg.ClientID),
		clock:        clock,
		respTopic:    "clients/" + cfg.ClientID + "/services/statestore/_any_/command/invoke/response",
		notifyFilter: wire.NotifyFilter(cfg.ClientID),
		invokeTopic:  wire.InvokeTopic,
		stChanged:    make(chan struct{}),
		cmSet:        make(chan struct{}),
		pending:      make(map[[16]byte]*pending),
		bound:        make(map[[16]byte]uint64),
		regs:         make(map[string]*registration),
		stopping:     make(map[string]chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.state.Store(&connState{})
	return c, nil
}

// Dial connects to the broker at cfg.Addr and returns once the first
// connection is up and the client's response and notification subscriptions
// are acknowledged. While the broker is unreachable it keeps trying; if ctx
// ends first, Dial returns ctx's error, wrapped together with the last
// connection error (or, when no attempt has failed yet, what the attempt in
// progress waits for, e.g. "no CONNACK yet"). A failure that retrying cannot
// cure ends Dial at once: a refused CONNACK for identity or credentials (a
// *[ConnectError], e.g. reason 0x86 bad user name or password), a server
// certificate that is not trusted (the crypto/x509 error), an unreadable
// PasswordFile or SATFile (the fs error), a server that does not answer in
// MQTT v5 ([ErrNotMQTT]: e.g. an HTTP server, or a malformed CONNACK), an
// oversized CONNACK ([ErrPacketTooLarge]), a TLS mismatch ([ErrTLSMismatch]:
// a client with Config.TLS at a server that answers in plain MQTT, or one
// without it at a server that speaks TLS; either is found by a probe of at
// most a second when the server closes the connection on the client's
// first packet), or a host name that does not exist
// (*net.DNSError with IsNotFound). A refused TCP connection is retried (the
// broker may be starting), and so is a server that accepts the connection
// but does not answer ([ErrNoAnswer], "connected to ADDR, but no MQTT
// answer", after cfg.HandshakeTimeout or the attempt's own bound), unless
// cfg.FailFast is set, which ends Dial on any failed attempt. An invalid
// cfg is reported at once with an error wrapping [ErrConfig].
//
// After Dial returns, the client reconnects by itself whenever the connection
// drops, with a jittered exponential backoff, until Close.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults(true)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &opError{op: "dial " + cfg.Addr, err: err} // its caller gave up already: no connection
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	scheme := "mqtt"
	if cfg.TLS != nil {
		scheme = "mqtts"
	}
	c.pinger = newPinger(cfg.PingTimeout)
	c.sess = newSessionStore(c)
	c.pub = newPublisher(c)
	acfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{{Scheme: scheme, Host: cfg.Addr}},
		TlsCfg:                        cfg.TLS,
		AttemptConnection:             c.attemptConnection,
		KeepAlive:                     uint16(cfg.KeepAlive / time.Second),
		CleanStartOnInitialConnection: cfg.CleanStart,
		SessionExpiryInterval:         uint32((cfg.SessionExpiry + time.Second - 1) / time.Second),
		ReconnectBackoff:              reconnectBackoff(cfg.ReconnectMin, cfg.ReconnectMax),
		ConnectTimeout:                c.connectTimeout(),
		ConnectPacketBuilder:          c.buildConnect,
		// Close means the client is done: end its session rather than leave
		// the broker holding it for SessionExpiry.
		DisconnectPacketBuilder: func() *paho.Disconnect {
			zero := uint32(0)
			return &paho.Disconnect{Properties: &paho.DisconnectProperties{SessionExpiryInterval: &zero}}
		},
		OnConnectionUp: func(_ *autopaho.ConnectionManager, ca *paho.Connack) {
			c.ConnectionUp(ca)
		},
		OnConnectionDown: func() bool {
			c.ConnectionDown()
			return !c.closed.Load()
		},
		OnConnectError: func(err error) {
			err = c.connectError(err)
			c.lastErr.Store(&errBox{err})
			if stop := c.dialing.Load(); stop != nil && (cfg.FailFast || permanent(err)) {
				(*stop)(err)
			}
			c.log.Debug("connection attempt failed", "error", err)
			if f := c.cfg.Metrics.ConnectFailed; f != nil {
				f(err)
			}
		},
		ClientConfig: paho.ClientConfig{
			ClientID:          cfg.ClientID,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){c.HandlePublish},
			PacketTimeout:     publishTimeout,
			Session:           trackedSession{State: state.New(c.sess, memory.New()), p: c.pub},
			AuthHandler:       satAuth{c: c},
			PingHandler:       c.pinger,
			OnClientError: func(err error) {
				c.downErr.Store(&errBox{err})
				c.log.Debug("connection error", "error", err)
			},
			OnServerDisconnect: func(d *paho.Disconnect) {
				c.badEnd.Store(badPacketReason(d.ReasonCode))
				err := fmt.Errorf("disconnected by the broker: reason 0x%02x", d.ReasonCode)
				if d.Properties != nil && d.Properties.ReasonString != "" {
					err = fmt.Errorf("%w: %s", err, d.Properties.ReasonString)
				}
				c.downErr.Store(&errBox{err})
				c.log.Info("disconnected by the broker", "reason", d.ReasonCode)
			},
		},
	}
	cm, err := autopaho.NewConnection(context.Background(), acfg)
	if err != nil {
		return nil, configErr("%v", err)
	}
	c.cm, c.ownsCM = cm, true
	close(c.cmSet)
	dctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	c.dialing.Store(&stop)
	err = c.awaitFirst(dctx)
	c.dialing.Store(nil)
	if err != nil {
		_ = c.Close()
		if cause := context.Cause(dctx); cause != nil && ctx.Err() == nil && (cfg.FailFast || permanent(cause)) {
			err = cause // the attempt's failure, not ctx's end
		}
		return nil, &opError{op: "dial " + cfg.Addr, err: err}
	}
	return c, nil
}

// connectError rewords autopaho's report of a failed connection attempt: a
// refused CONNECT becomes a *ConnectError, and a CONNECT answered with a
// CONNACK that paho could not decode an error wrapping ErrNotMQTT.
func (c *Client) connectError(err error) error {
	if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(err.Error(), "failed to connect to ") {
		err = inner // autopaho's prefix repeats the address Dial's error names
	}
	var ce *autopaho.ConnackError
	if !errors.As(err, &ce) {
		mc := c.conn.Load()
		if mc != nil && mc.connack.Load() && !errors.Is(err, ErrNotMQTT) && !errors.Is(err, ErrPacketTooLarge) {
			return fmt.Errorf("%w: malformed CONNACK: %w", ErrNotMQTT, err)
		}
		// The server took the connection and CONNECT, and said nothing
		// until the attempt's bound (HandshakeTimeout's read deadline, or
		// the attempt's context).
		if mc != nil && !mc.answered.Load() && (errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)) {
			return &noAnswerError{fmt.Sprintf("connected to %s, but no MQTT answer within %v (no CONNACK to CONNECT): is it an MQTT broker's port?", mc.RemoteAddr(), mc.answerBy), err}
		}
		// A server that closes the connection without a word on CONNECT may
		// be a TLS port: while dialling, find out, so that Dial can say so
		// at once instead of retrying until its deadline.
		if mc != nil && !mc.connack.Load() && c.cfg.TLS == nil && closedEarly(err) && c.dialing.Load() != nil && speaksTLS(c.ctx, c.cfg.Addr) {
			return fmt.Errorf("%w: the server at %s speaks TLS: set Config.TLS (sskv -tls), or connect to its plain MQTT port (%w)", ErrTLSMismatch, c.cfg.Addr, err)
		}
		return err
	}
	msg := fmt.Sprintf("broker refused the connection: reason 0x%02x", ce.ReasonCode)
	if name := connackReasons[ce.ReasonCode]; name != "" {
		msg += " (" + name + ")"
	}
	if ce.Reason != "" {
		msg += ": " + ce.Reason
	}
	return &ConnectError{ReasonCode: ce.ReasonCode, msg: msg, err: err}
}

// ConnectError is a connection the broker refused in its CONNACK.
type ConnectError struct {
	ReasonCode byte // the MQTT v5 CONNACK reason code
	msg        string
	err        error
}

func (e *ConnectError) Error() string { return "sskv: " + e.msg }
func (e *ConnectError) Unwrap() error { return e.err }

var connackReasons = map[byte]string{
	0x80: "unspecified error", 0x81: "malformed packet", 0x82: "protocol error",
	0x83: "implementation specific error", 0x84: "unsupported protocol version",
	0x85: "client identifier not valid", 0x86: "bad user name or password",
	0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy",
	0x8A: "banned", 0x8C: "bad authentication method", 0x97: "quota exceeded",
	0x9F: "connection rate exceeded",
}

// badPacketReason reports whether a DISCONNECT's reason code blames a packet
// the client sent.
func badPacketReason(code byte) bool {
	switch code {
	case 0x81, 0x82, 0x90, 0x95, 0x99, 0x9A, 0x9B: // malformed, protocol error, topic name invalid, packet too large, payload format invalid, retain or QoS not supported
		return true
	}
	return false
}

// closedEarly reports whether err is a connection the server closed (or
// reset) before answering.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// probeTimeout bounds a probe of what the server at the other end speaks.
const probeTimeout = time.Second

// receiveMaximum is the Receive Maximum the client declares in CONNECT: how
// many QoS 1 messages (responses and notifications) the broker may have
// sent it unacknowledged. paho allocates a queue of incoming messages this
// long for every connection: at MQTT's default of 65,535 that was 512 KiB
// per client, made again at each reconnect. The client acknowledges each
// message as soon as it has handed it on, so it is never that far behind
// unless it cannot keep up; then a broker holds the rest back, and the
// local store disconnects a client that falls behind by its
// MaxPendingMessages, 8,192 by default, as it always did.
const receiveMaximum = 8192

// probe dials addr and reports what speaks says of the connection, all
// within probeTimeout.
func probe(ctx context.Context, addr string, speaks func(context.Context, net.Conn) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer raw.Close()
	deadline, _ := ctx.Deadline()
	_ = raw.SetDeadline(deadline)
	return speaks(ctx, raw)
}

// speaksTLS reports whether the server at addr completes a TLS handshake
// (certificates unchecked: only the protocol matters) or answers one with
// a TLS alert.
func speaksTLS(ctx context.Context, addr string) bool {
	return probe(ctx, addr, func(ctx context.Context, raw net.Conn) bool {
		host, _, _ := net.SplitHostPort(addr)
		tc := tls.Client(raw, &tls.Config{ServerName: host, InsecureSkipVerify: true}) // a probe of the protocol: nothing is sent over it
		err := tc.HandshakeContext(ctx)
		var alert tls.AlertError
		return err == nil || errors.As(err, &alert)
	})
}

// speaksPlainMQTT reports whether the server at addr answers a plain MQTT
// CONNECT with a CONNACK.
func speaksPlainMQTT(ctx context.Context, addr string) bool {
	return probe(ctx, addr, func(_ context.Context, raw net.Conn) bool {
		cp := packets.NewControlPacket(packets.CONNECT)
		connect := cp.Content.(*packets.Connect)
		connect.ProtocolName, connect.ProtocolVersion, connect.CleanStart = "MQTT", 5, true
		if _, err := cp.WriteTo(raw); err != nil {
			return false
		}
		var first [1]byte
		if _, err := io.ReadFull(raw, first[:]); err != nil {
			return false
		}
		_, _ = packets.NewControlPacket(packets.DISCONNECT).WriteTo(raw)
		return first[0] == packets.CONNACK<<4
	})
}

// tlsHandshakeError rewords a failed TLS handshake with addr: a server that
// answered in plain MQTT, or closed the connection on the handshake and
// answers a plain CONNECT, is a TLS mismatch.
func (c *Client) tlsHandshakeError(ctx context.Context, addr string, err error) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) || closedEarly(err) && c.dialing.Load() != nil && speaksPlainMQTT(ctx, addr) {
		return fmt.Errorf("%w: the server at %s does not speak TLS: leave Config.TLS unset (no sskv -tls), or connect to its TLS port (%w)", ErrTLSMismatch, addr, err)
	}
	return err
}

// permanent reports whether a failed connection attempt will fail the same
// way when retried: the broker refused the client's identity or credentials,
// the server's certificate is not trusted, or a credentials file cannot be
// read, the server is not an MQTT v5 broker (its answer to CONNECT is no
// CONNACK, or a malformed or oversized one), TLS meets a server that does not
// speak it, or the host name does not exist. Dial gives up at once on these; a client that was connected keeps
// retrying (a rotated secret or a fixed file may cure them).
func permanent(err error) bool {
	if errors.Is(err, ErrNotMQTT) || errors.Is(err, ErrPacketTooLarge) {
		return true
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) || errors.Is(err, ErrTLSMismatch) {
		return true // TLS to a server that does not speak it, or the reverse
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return true
	}
	var ce *ConnectError
	if errors.As(err, &ce) {
		switch ce.ReasonCode {
		case 0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C:
			return true
		}
		return false
	}
	var verr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &verr) || errors.As(err, &unknownCA) || errors.As(err, &hostErr) || errors.As(err, &invalid) {
		return true
	}
	return errors.Is(err, errCredentialsFile)
}

// errCredentialsFile marks a PasswordFile or SATFile that cannot be read.
var errCredentialsFile = errors.New("credentials file unreadable")

// DialEnv is [Dial] with the Config from [ConfigFromEnv].
func DialEnv(ctx context.Context) (*Client, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return Dial(ctx, cfg)
}

// NewFromConnection builds a Client on a connection the application already
// owns. clientID must be the connection's MQTT client id; cfg.Addr, TLS,
// credentials, KeepAlive, SessionExpiry and reconnect settings are ignored
// (they belong to cm). It waits for the connection to be up, subscribes to
// the client's response and notification topics, and returns.
//
// The application must route the connection's events to the client, or
// responses never arrive and watches do not survive a reconnect:
//
//   - add [Client.HandlePublish] to its ClientConfig.OnPublishReceived (a
//     handler added later with cm.AddOnPublishReceived is lost when autopaho
//     v0.23 reconnects, so use the config);
//   - call [Client.ConnectionUp] from its OnConnectionUp, and
//     [Client.ConnectionDown] from its OnConnectionDown.
//
// The session should have a positive expiry, so that a request in flight
// survives a reconnect (see the package documentation). The session is the
// application's, so what it sends again after a reconnect is up to it: a
// request whose caller gave up may be executed late, and a request bound to
// a [Conn] is checked before it is handed to the connection, but not kept
// from being resent by the session. Close does not disconnect cm.
func NewFromConnection(ctx context.Context, cm *autopaho.ConnectionManager, clientID string, cfg Config) (*Client, error) {
	if cm == nil {
		return nil, configErr("nil ConnectionManager")
	}
	cfg.ClientID = clientID
	if clientID == "" {
		return nil, configErr("empty client id")
	}
	cfg, err := cfg.withDefaults(false)
	if err != nil {
		return nil, err
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	c.cm = cm
	close(c.cmSet)
	if err := cm.AwaitConnection(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("sskv: waiting for the connection: %w", err)
	}
	if c.state.Load().gen == 0 {
		// Nothing is pending yet, so whether the session is present does
		// not matter.
		c.ConnectionUp(&paho.Connack{SessionPresent: true})
	}
	if err := c.awaitFirst(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("sskv: %w", err)
	}
	return c, nil
}

// awaitFirst waits until the first connection is ready. When ctx ends
// first, the error says how far the connection got: the last failed
// attempt's error, or, when no attempt has failed yet (one is still waiting
// for the broker), what the attempt waits for.
func (c *Client) awaitFirst(ctx context.Context) error {
	_, err := c.waitReady(ctx, 0)
	if err == nil || ctx.Err() == nil {
		return err
	}
	if b := c.lastErr.Load(); b != nil {
		return fmt.Errorf("%w (last connection error: %v)", err, b.err)
	}
	switch mc := c.conn.Load(); {
	case c.state.Load().gen > 0:
		return fmt.Errorf("%w (connected; subscribing to the response topic)", err)
	case mc != nil:
		return fmt.Errorf("%w (connected to %s, no CONNACK yet)", err, mc.RemoteAddr())
	case c.ownsCM:
		return fmt.Errorf("%w (no connection yet)", err)
	}
	return err
}

// ID returns the client's MQTT client id.
func (c *Client) ID() string { return c.id }

// Close ends the client: requests in flight fail with [ErrClosed], every
// Watcher's channel is closed, and the connection is closed with a
// DISCONNECT that also ends the client's MQTT session, since nothing will
// come back for it (unless the connection came from [NewFromConnection],
// which Close leaves alone). If the DISCONNECT cannot be written within
// 250 ms (a stalled socket), the socket is closed without it. It waits for
// the client's goroutines to end.
// Close is idempotent and always returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.cancel()
		c.bgMu.Lock()
		c.bgClosed = true
		c.bgMu.Unlock()
		c.failPending(func(*pending) bool { return true }, ErrClosed)
		c.setState(func(old connState) connState {
			old.conn.markLost()
			return old
		})
		c.closeWatches()
		if c.ownsCM {
			// autopaho sends DISCONNECT and closes the socket; a write to a
			// stalled socket would hold it until the write deadline, so
			// the socket is closed under it after a short grace.
			ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
			err := c.cm.Disconnect(ctx)
			cancel()
			if err != nil {
				if mc := c.conn.Load(); mc != nil {
					mc.abort()
				}
				<-c.cm.Done()
				c.log.Debug("disconnect: socket closed without DISCONNECT", "error", err)
			}
		}
		c.wg.Wait()
		if c.pub != nil {
			c.pub.endAll() // paho leaves the session to us: it has ended
		}
	})
	return nil
}

// Done returns a channel that is closed when Close starts: a lease built on
// the client (package lock) ends then, without waiting for its next request
// to fail.
func (c *Client) Done() <-chan struct{} { return c.ctx.Done() }

// Shared returns the value this client keeps under key, calling create to
// make it the first time. It lets a package built on the client keep one
// instance of something per client without global state: package lock
// renews all the leases taken through a client with one scheduler. Use a
// key of an unexported type, as with context values. create runs once per
// key, under a lock: it must not call Shared.
func (c *Client) Shared(key any, create func() any) any {
	c.sharedMu.Lock()
	defer c.sharedMu.Unlock()
	if v, ok := c.shared[key]; ok {
		return v
	}
	if c.shared == nil {
		c.shared = make(map[any]any)
	}
	v := create()
	c.shared[key] = v
	return v
}

// spawn runs f on a goroutine that Close waits for. It reports false, and
// does not run f, once Close has started.
func (c *Client) spawn(f func()) bool {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.bgClosed {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// setState replaces the connection state and wakes everyone waiting for a
// change. It returns the new state.
func (c *Client) setState(f func(old connState) connState) *connState {
	c.stMu.Lock()
	defer c.stMu.Unlock()
	st := f(*c.state.Load())
	c.state.Store(&st)
	close(c.stChanged)
	c.stChanged = make(chan struct{})
	return &st
}

// waitReady returns the current connection state once it is ready and newer
// than connection after, or an error when ctx ends or the client closes.
func (c *Client) waitReady(ctx context.Context, after uint64) (*connState, error) {
	for {
		st := c.state.Load()
		if st.ready && st.gen > after {
			if st.err != nil {
				return nil, st.err
			}
			return st, nil
		}
		c.stMu.Lock()
		ch := c.stChanged
		changed := c.state.Load() != st
		c.stMu.Unlock()
		if changed {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// ConnectionUp tells the client that its connection is (again) up. A Client
// from [Dial] calls it itself; one from [NewFromConnection] needs the
// application to call it from OnConnectionUp. It does not block: the client
// re-subscribes, then re-registers its watches, on its own goroutine.
//
// connack is the connection's CONNACK: when it reports no session present,
// requests that were sent on an earlier connection and not yet answered can
// never be answered, and fail with [ErrConnectionLost].
func (c *Client) ConnectionUp(connack *paho.Connack) {
	if c.closed.Load() {
		return
	}
	sessionPresent := connack != nil && connack.SessionPresent
	var maxOut uint32
	var recvMax uint16
	if connack != nil && connack.Properties != nil {
		if connack.Properties.MaximumPacketSize != nil {
			maxOut = *connack.Properties.MaximumPacketSize
		}
		if connack.Properties.ReceiveMaximum != nil {
			recvMax = *connack.Properties.ReceiveMaximum
		}
	}
	var seq uint64
	if c.sess != nil {
		seq = c.sess.seq.Load()
	}
	st := c.setState(func(old connState) connState {
		old.conn.markLost() // if ConnectionDown was not called
		gen := old.gen + 1
		// Cut off before: a reconnection, or a first connection that came
		// after failed attempts (the broker was down, or unreachable).
		outage := gen > 1 || c.lastErr.Load() != nil
		cn := newConn(c, gen, seq, outage, recvMax)
		cn.maxOut = maxOut
		return connState{gen: gen, conn: cn}
	})
	c.badEnd.Store(false) // the session's resends are done
	if f := c.cfg.Metrics.ConnectionUp; f != nil {
		f(st.gen)
	}
	c.spawn(func() { c.setup(st.gen, sessionPresent) })
}

// ConnectionDown tells the client that its connection is down. A Client from
// [Dial] calls it itself; one from [NewFromConnection] needs the application
// to call it from OnConnectionDown. New requests wait for the next
// connection; requests in flight keep waiting for their responses.
func (c *Client) ConnectionDown() {
	st := c.setState(func(old connState) connState {
		old.conn.markLost()
		return connState{gen: old.gen, conn: old.conn}
	})
	if !c.closed.Load() {
		c.log.Info("connection lost; reconnecting", "connection", st.gen)
	}
	if f := c.cfg.Metrics.ConnectionDown; f != nil {
		var cause error
		if b := c.downErr.Load(); b != nil {
			cause = b.err
		}
		f(st.gen, cause)
	}
	c.wmu.Lock()
	for _, reg := range c.regs {
		reg.beginResync()
	}
	c.wmu.Unlock()
}

// setup prepares connection gen: it subscribes to the response and
// notification topics, fails requests whose responses the lost session would
// have carried, marks the connection ready and re-registers the watches.
func (c *Client) setup(gen uint64, sessionPresent bool) {
	select {
	case <-c.cmSet:
	case <-c.ctx.Done():
		return
	}
	var respErr, notifyErr error
	b := retryBackoff(c.cfg.ReconnectMin, c.cfg.ReconnectMax)
	for {
		if c.state.Load().gen != gen || c.ctx.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.RequestTimeout)
		sa, err := c.cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
			{Topic: c.respTopic, QoS: 1},
			{Topic: c.notifyFilter, QoS: 1},
		}})
		cancel()
		if err == nil && sa != nil && len(sa.Reasons) == 2 {
			if r := sa.Reasons[0]; r > 2 {
				respErr = fmt.Errorf("sskv: subscription to the response topic %q refused (reason 0x%02x)", c.respTopic, r)
				c.log.Error("subscription refused", "topic", c.respTopic, "reason", r)
			}
			if r := sa.Reasons[1]; r > 2 {
				notifyErr = fmt.Errorf("sskv: subscription to the notification topic %q refused (reason 0x%02x)", c.notifyFilter, r)
				c.log.Warn("subscription refused", "topic", c.notifyFilter, "reason", r)
			}
			break
		}
		if err == nil {
			err = errors.New("malformed SUBACK")
		}
		c.log.Debug("subscribe failed; retrying", "error", err)
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
	}
	// Requests handed to an earlier connection can be answered only through
	// the resumed session; nothing is sent again when the session is gone:
	// their outcome is unknown.
	if !sessionPresent {
		if n := c.failPending(func(p *pending) bool {
			g := p.gen.Load()
			return g != 0 && g < gen
		}, ErrConnectionLost); n > 0 {
			c.log.Warn("session lost on reconnect: requests in flight have an unknown outcome", "requests", n)
		}
		if gen > 1 {
			c.forgetVersions()
		}
	}
	st := c.setState(func(old connState) connState {
		if old.gen != gen {
			return old
		}
		return connState{gen: gen, ready: true, conn: old.conn, err: respErr, notifyErr: notifyErr}
	})
	if st.gen == gen {
		if gen > 1 {
			c.log.Info("connection restored", "connection", gen, "sessionPresent", sessionPresent)
		} else {
			c.log.Debug("connection ready", "connection", gen, "sessionPresent", sessionPresent)
		}
		if sessionPresent {
			c.spawn(func() { c.failOrphans(st.conn) })
		}
		c.resyncWatches(st.conn)
	}
}

// failOrphans fails, with ErrConnectionLost, the requests bound to a
// connection before cn that are still unanswered: they are never sent
// again (see sessionStore), so only the resumed session could have brought
// their answers. The broker delivers what it held for the client as soon
// as the session resumes, before anything sent on cn is answered, but paho
// routes incoming PUBLISHes on a goroutine of its own, behind the packets
// it reads: so the answer to a request sent on cn, routed in that same
// order, proves that everything the session brought has been routed. The
// request is a harmless read (a GET of an empty key, which the service
// refuses). Were its answer to fail, the orphans fail anyway.
func (c *Client) failOrphans(cn *Conn) {
	orphan := func(p *pending) bool {
		g := p.gen.Load()
		return p.bound && g != 0 && g < cn.gen
	}
	c.pmu.Lock()
	found := false
	for _, p := range c.pending {
		if found = orphan(p); found {
			break
		}
	}
	c.pmu.Unlock()
	if !found {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.RequestTimeout)
	_, _ = c.doRequest(ctx, cn, verbRaw, command(nil, "GET", ""), func(u paho.UserProperties) paho.UserProperties { return u })
	cancel()
	if n := c.failPending(orphan, ErrConnectionLost); n > 0 {
		c.log.Debug("requests bound to the lost connection have an unknown outcome", "requests", n)
	}
}

// HandlePublish routes a PUBLISH received on the client's connection: it
// takes responses to the client's requests and its key notifications, and
// reports whether it took the message. A Client from [Dial] is wired to it
// already; for [NewFromConnection] the application adds it to its
// ClientConfig.OnPublishReceived. It never blocks and never panics on
// malformed input.
func (c *Client) HandlePublish(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	if p == nil {
		return false, nil
	}
	if p.Topic == c.respTopic {
		c.handleResponse(p)
		return true, nil
	}
	if strings.HasPrefix(p.Topic, wire.NotifyPrefix) {
		if id, key, ok := wire.ParseNotifyTopic(p.Topic); ok && id == c.id {
			c.handleNotification(key, p)
			return true, nil
		}
	}
	return false, nil
}

// buildConnect completes the CONNECT packet of each connection attempt,
// reading the password and token files afresh.
func (c *Client) buildConnect(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
	if cp.Properties == nil {
		cp.Properties = &paho.ConnectProperties{}
	}
	if c.cfg.MaxPacketSize > 0 {
		v := uint32(c.cfg.MaxPacketSize)
		cp.Properties.MaximumPacketSize = &v
	}
	if cp.Properties.ReceiveMaximum == nil {
		v := uint16(receiveMaximum)
		cp.Properties.ReceiveMaximum = &v
	}
	if cp.Properties.SessionExpiryInterval == nil {
		v := uint32((c.cfg.SessionExpiry + time.Second - 1) / time.Second)
		cp.Properties.SessionExpiryInterval = &v
	}
	if c.cfg.Username != "" {
		cp.Username, cp.UsernameFlag = c.cfg.Username, true
	}
	switch {
	case len(c.cfg.Password) > 0:
		cp.Password, cp.PasswordFlag = c.cfg.Password, true
	case c.cfg.PasswordFile != "":
		pw, err := os.ReadFile(c.cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("sskv: reading PasswordFile: %w: %w", errCredentialsFile, err)
		}
		cp.Password, cp.PasswordFlag = pw, true
	}
	if c.cfg.SATFile != "" {
		tok, err := os.ReadFile(c.cfg.SATFile)
		if err != nil {
			return nil, fmt.Errorf("sskv: reading SATFile: %w: %w", errCredentialsFile, err)
		}
		cp.Properties.AuthMethod = satMethod
		cp.Properties.AuthData = tok
	}
	return cp, nil
}

// satAuth answers the broker's enhanced-authentication challenges with the
// current service account token. paho requires a handler whenever CONNACK
// names an authentication method.
type satAuth struct{ c *Client }

func (a satAuth) Authenticate(*paho.Auth) *paho.Auth {
	out := &paho.Auth{ReasonCode: 0x18, Properties: &paho.AuthProperties{AuthMethod: satMethod}} // continue authentication
	if a.c.cfg.SATFile != "" {
		tok, err := os.ReadFile(a.c.cfg.SATFile)
		if err != nil {
			a.c.log.Warn("reading SATFile for re-authentication", "error", err)
		}
		out.Properties.AuthData = tok
	}
	return out
}

func (satAuth) Authenticated() {}

// reconnectBackoff returns autopaho's delay before connection attempt n of
// each connection cycle: none before the very first connection, then a
// jittered exponential backoff between min and max, restarted on each
// cycle, whose first delay is at least min.
func reconnectBackoff(minD, maxD time.Duration) func(int) time.Duration {
	b := retryBackoff(minD, maxD)
	first := true
	return func(attempt int) time.Duration {
		if attempt == 0 {
			if first {
				first = false
				return 0
			}
			b.Reset()
		}
		return max(b.NextBackOff(), minD)
	}
}

func retryBackoff(minD, maxD time.Duration) *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = minD
	b.MaxInterval = maxD
	b.RandomizationFactor = 0.5
	b.Multiplier = 2
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}
