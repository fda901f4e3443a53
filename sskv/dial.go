package sskv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
	"github.com/eclipse/paho.golang/paho/store/memory"
)

// publishTimeout is paho's own bound on a PUBLISH, SUBSCRIBE or UNSUBSCRIBE.
// Our contexts always carry the real deadline; paho's default (10 s) would
// otherwise end a publish early and hide whether it was sent.
const publishTimeout = 24 * time.Hour

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
