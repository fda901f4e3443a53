package sskv

import (
	"errors"
	"strconv"
	"strings"

	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// Errors reported by the state store. A request the service refuses returns
// a *[ServiceError]; errors.Is matches it against these sentinels.
var (
	// ErrTimestampSkew: the request's __ts is more than a minute ahead of the
	// service's clock.
	ErrTimestampSkew = errors.New("sskv: request timestamp too far in the future")
	// ErrFencingTokenRequired: the key is fenced and the request has no token.
	ErrFencingTokenRequired = errors.New("sskv: fencing token required")
	// ErrFencingTokenSkew: the fencing token is more than a minute ahead of
	// the service's clock.
	ErrFencingTokenSkew = errors.New("sskv: fencing token too far in the future")
	// ErrFencingTokenLower: the fencing token is older than the key's.
	ErrFencingTokenLower = errors.New("sskv: fencing token lower than the key's")
	// ErrQuotaExceeded: the service's key, key size or value size quota.
	ErrQuotaExceeded = errors.New("sskv: quota exceeded")
	// ErrSyntax: the service could not parse the request.
	ErrSyntax = errors.New("sskv: syntax error")
	// ErrNotAuthorized: the client may not use this key.
	ErrNotAuthorized = errors.New("sskv: not authorized")
	// ErrUnknownCommand: the service does not know the request's verb.
	ErrUnknownCommand = errors.New("sskv: unknown command")
	// ErrWrongArgs: wrong number of arguments for the verb.
	ErrWrongArgs = errors.New("sskv: wrong number of arguments")
	// ErrMissingTimestamp: a SET without __ts.
	ErrMissingTimestamp = errors.New("sskv: missing timestamp")
	// ErrMalformedTimestamp: an unparseable __ts or __ft.
	ErrMalformedTimestamp = errors.New("sskv: malformed timestamp")
	// ErrKeyLengthZero: the key is empty. The client sends empty keys to the
	// service like any other and reports its answer.
	ErrKeyLengthZero = errors.New("sskv: key length is zero")
)

// Errors of the client itself.
var (
	// ErrMalformedResponse reports a response the client cannot understand:
	// no __stat, an unexpected reply type, a malformed payload or __ts. The
	// error wraps it with the detail.
	ErrMalformedResponse = errors.New("sskv: malformed response")

	// ErrClosed is returned by calls on a closed Client, and by requests in
	// flight when it is closed.
	ErrClosed = errors.New("sskv: client closed")

	// ErrConnectionLost reports a request whose outcome is unknown: it may or
	// may not have been executed, because the connection was lost after the
	// request was handed to it, and its answer cannot come: the session
	// that would have delivered it did not survive (the broker reported no
	// session on reconnect), or the request was bound to the lost
	// connection ([Conn]) and is not sent again. Requests of the Client
	// that were certainly not sent are retried instead.
	ErrConnectionLost = errors.New("sskv: connection lost, request outcome unknown")

	// ErrNotSent reports a request bound to a connection ([Conn]) that was
	// lost before the request went out: it was not sent, and not executed.
	ErrNotSent = errors.New("sskv: request not sent: its connection was lost")

	// ErrPublishRejected reports a request the broker refused to accept (a
	// PUBACK with a failure reason code, e.g. not authorized to publish). The
	// service never saw it.
	ErrPublishRejected = errors.New("sskv: broker rejected the request")

	// ErrInvalidOption reports a request option that cannot be sent, found
	// before anything is sent.
	ErrInvalidOption = errors.New("sskv: invalid option")

	// ErrTooLarge: the request's MQTT packet would be larger than the
	// broker's Maximum Packet Size (announced in its CONNACK; 4 MiB on the
	// local store by default). MQTT forbids a client to send it, and a
	// broker closes the connection of a client that does: the request is
	// not sent, and nothing else is disturbed. The error says the sizes.
	ErrTooLarge = errors.New("sskv: request larger than the broker's maximum packet size")

	// ErrKeyTooLong: a watch of a key too long to be notified of. A
	// notification's topic carries the key and the client id, in hex, and
	// an MQTT topic is at most 65,535 bytes: see [Client.MaxWatchKey]. The
	// client sends no KEYNOTIFY for it.
	ErrKeyTooLong = errors.New("sskv: key too long to watch")

	// ErrTLSMismatch: the client and the server disagree about TLS. A
	// client with Config.TLS met a server that answered in plain MQTT (or
	// not in TLS at all), or a client without it met a server that speaks
	// TLS. Dial fails at once with it: retrying cannot help.
	ErrTLSMismatch = errors.New("sskv: TLS mismatch")

	// ErrNoAnswer: the server accepted the TCP connection but did not answer
	// within the connection attempt's bound (see Config.HandshakeTimeout):
	// no TLS handshake, or no CONNACK to CONNECT. The address may not be an
	// MQTT broker's, or the broker is stalled: Dial keeps trying, unless
	// Config.FailFast.
	ErrNoAnswer = errors.New("sskv: the server does not answer")
)

// noAnswerError is a connection attempt the server did not answer: it
// matches ErrNoAnswer and its cause (the timeout).
type noAnswerError struct {
	msg   string
	cause error
}

func (e *noAnswerError) Error() string   { return e.msg }
func (e *noAnswerError) Unwrap() []error { return []error{ErrNoAnswer, e.cause} }

// ServiceError is an error answered by the state store ("-ERR <message>").
// Message is the service's text, verbatim. errors.Is matches it against the
// sentinel of a known message (ErrNotAuthorized, ErrFencingTokenLower, ...);
// an unknown message matches none of them.
type ServiceError struct {
	Message string
}

func (e *ServiceError) Error() string {
	return "sskv: state store error: " + e.Message
}

// Is reports whether target is the sentinel for e's message.
func (e *ServiceError) Is(target error) bool {
	s := sentinelFor(e.Message)
	return s != nil && s == target
}

var sentinels = map[string]error{
	wire.MsgTimestampSkew:    ErrTimestampSkew,
	wire.MsgFencingRequired:  ErrFencingTokenRequired,
	wire.MsgFencingSkew:      ErrFencingTokenSkew,
	wire.MsgFencingLower:     ErrFencingTokenLower,
	wire.MsgFencingLowerDoc:  ErrFencingTokenLower,
	wire.MsgQuotaExceeded:    ErrQuotaExceeded,
	wire.MsgSyntaxError:      ErrSyntax,
	wire.MsgNotAuthorized:    ErrNotAuthorized,
	wire.MsgUnknownCommand:   ErrUnknownCommand,
	wire.MsgWrongArgs:        ErrWrongArgs,
	wire.MsgMissingTimestamp: ErrMissingTimestamp,
	wire.MsgMalformedTS:      ErrMalformedTimestamp,
	wire.MsgKeyLengthZero:    ErrKeyLengthZero,
}

func sentinelFor(msg string) error { return sentinels[msg] }

// opError is the error of one operation of the client: it names the
// operation (and the key) once, with a single "sskv: " prefix, whatever the
// wrapped error says. errors.Is and errors.As see the wrapped error.
type opError struct {
	op     string // "GET", "SET", "watch", "dial host:port", ...
	key    string
	hasKey bool
	err    error
}

func (e *opError) Error() string {
	var b strings.Builder
	b.WriteString("sskv: ")
	b.WriteString(e.op)
	if e.hasKey {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(e.key))
	}
	b.WriteString(": ")
	msg := e.err.Error()
	for strings.HasPrefix(msg, "sskv: ") {
		msg = msg[len("sskv: "):]
	}
	b.WriteString(msg)
	return b.String()
}

func (e *opError) Unwrap() error { return e.err }

// keyErr wraps err, unless nil, as the error of operation op on key.
func keyErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var oe *opError
	if errors.As(err, &oe) && oe.op == op && oe.hasKey && oe.key == key {
		return err
	}
	return &opError{op: op, key: key, hasKey: true, err: err}
}
