package localstore

import (
	"crypto/tls"
	"log/slog"
	"time"
)

// Config configures a local state store. The zero value serves anonymous
// clients on a free loopback port, with no limit on keys, key size or value
// size, and MQTT packets of at most DefaultMaxPacketSize (4 MiB). The
// standalone store (cmd/statestore) has the same defaults for these, so a
// test passes or fails alike on both. The zero value sets none of the
// per-user and per-connection limits (MaxKeysPerUser and the fields after
// it), which the standalone store does set by default: 10,000 watches and
// 1,000 subscriptions per connection, 1,000 retained messages and 16 MiB of
// them per user, and, when it authenticates clients, 10,000 keys and
// 256 MiB of them per user.
type Config struct {
	// Addr is the plain TCP listen address. Empty means "127.0.0.1:0" (a free
	// loopback port, see Server.Addr); "-" disables the plain listener.
	Addr string

	// TLS, when not nil, adds a TLS listener on TLSAddr (empty means
	// "127.0.0.1:0"). Set ClientAuth in it to require client certificates.
	TLS     *tls.Config
	TLSAddr string

	// Users, when not nil, requires every client to authenticate with one of
	// these username/password pairs (or a SAT token, see SATTokens).
	Users map[string]string

	// SATTokens, when not nil, accepts MQTT v5 enhanced authentication with
	// method "K8S-SAT" (as Azure IoT Operations uses for Kubernetes service
	// account tokens): the authentication data must be one of these tokens,
	// and the client is then known by the mapped user name.
	SATTokens map[string]string

	// KeyPrefixes, when not nil, is a per-user key ACL: a user may read, write
	// and watch only keys that start with one of its prefixes; anything else
	// gets "not authorized". Anonymous clients have user name "".
	KeyPrefixes map[string][]string

	// MaxKeys limits the number of keys (0: no limit). A SET that would add a
	// key beyond it gets "the quota has been exceeded".
	MaxKeys int
	// MaxKeySize and MaxValueSize limit key and value length in bytes (0: no
	// limit); a SET beyond them gets "the quota has been exceeded".
	MaxKeySize   int
	MaxValueSize int

	// MaxKeysPerUser and MaxBytesPerUser limit, for each user (see the
	// package documentation, "Tenants"; anonymous clients are the user ""),
	// the number of keys it created and their size in bytes, key plus value
	// (0: no limit). A key counts against the user whose SET created it for
	// as long as it exists, whoever updates it later. A SET that would take
	// its creator beyond either limit gets "the quota has been exceeded";
	// other users' SETs are unaffected, so that no user's keys can refuse
	// another's lock. MaxKeys, if set, still bounds all users together:
	// keep it at least MaxKeysPerUser times the number of users, or 0.
	MaxKeysPerUser  int
	MaxBytesPerUser int64

	// MaxWatchesPerClient limits the watches (KEYNOTIFY) of one connection
	// (0: no limit). A KEYNOTIFY that would add one beyond it gets "the
	// quota has been exceeded"; one of a key already watched succeeds.
	MaxWatchesPerClient int

	// MaxSubscriptionsPerClient limits the subscriptions of one client's
	// session, those it resumed included (0: no limit). A filter of a
	// SUBSCRIBE that would add one beyond it is refused with SUBACK 0x97,
	// quota exceeded (an MQTT 3 client gets 0x80); subscribing again to a
	// filter it has is always allowed. The store's own subscriptions for
	// watches do not count.
	MaxSubscriptionsPerClient int

	// MaxRetainedPerUser and MaxRetainedBytesPerUser limit, for each user,
	// the number of retained messages it published and their size in bytes
	// (topic, payload and properties; 0: no limit). A retained message
	// counts against the user that published it until it is replaced,
	// cleared or expires. A PUBLISH with retain beyond either limit is
	// refused with PUBACK 0x97, quota exceeded (an MQTT 3 client is
	// disconnected; a QoS 0 message is dropped), and a retained Will is
	// published without retain. Clearing a retained message (an empty
	// payload) is always allowed. With either limit set, a Will with a
	// delay is never retained, as it could be published long after the
	// check.
	MaxRetainedPerUser      int
	MaxRetainedBytesPerUser int64

	// MaxDrift is how far ahead of the store's clock a request's __ts or __ft
	// may be (default 60 s, as the service).
	MaxDrift time.Duration

	// NodeID is the node id of the store's hybrid logical clock (default
	// "statestore").
	NodeID string

	// MaxPacketSize is the largest MQTT packet, in bytes, the store accepts
	// from a client (default DefaultMaxPacketSize, 4 MiB); it is announced in
	// CONNACK. The broker checks a packet's declared length before it
	// allocates anything for it: a client that declares a larger packet,
	// even an unauthenticated CONNECT, has its connection closed. It bounds
	// the value of a SET too (a value is a little smaller than its packet).
	// Raise it for larger values, up to 268435455 (MQTT's largest packet).
	MaxPacketSize int

	// MaxPendingMessages is how many messages the store holds for one
	// connection (default DefaultMaxPendingMessages, 8192): QoS 1 messages
	// sent to the client and not yet acknowledged (responses, notifications
	// and ordinary MQTT messages), and notifications not yet handed to the
	// broker. A client that reaches it is disconnected with DISCONNECT 0x97
	// (quota exceeded) rather than have messages dropped; a request that
	// arrives while it is reached is not executed. At most 60000.
	MaxPendingMessages int

	// WriteTimeout bounds every write to a client's socket (default
	// DefaultWriteTimeout, 5 s). A client that does not read, so that a
	// write cannot complete within it, has its connection closed.
	WriteTimeout time.Duration

	// CloseTimeout bounds how long Close waits for clients to take their
	// DISCONNECT before their connections are cut (default 2 s).
	CloseTimeout time.Duration

	// Logger receives the store's and the broker's logs (default: discarded).
	Logger *slog.Logger

	// Persist says which keys the store keeps across a restart, in
	// DataDir: none (PersistNone, the default: every key is lost), those
	// whose SET asked for it with aio-persistence: true (PersistDynamic),
	// or all (PersistAll). A persisted key comes back after a restart with
	// its value, version, fencing token and expiry (a wall-clock deadline:
	// a key whose deadline passed while the store was down is gone). The
	// answer to a request, and its PUBACK, go out only once the writes it
	// made or saw are durable (see docs/protocol.md for the rules).
	Persist PersistMode

	// DataDir is the directory of the persisted keys, created if missing;
	// required with Persist, refused without. Only one store at a time may
	// use it: Start fails with ErrDataDirInUse while another has it open.
	DataDir string
}

// Defaults of Config's limits.
const (
	DefaultMaxPacketSize      = 4 << 20
	DefaultMaxPendingMessages = 8192
	DefaultWriteTimeout       = 5 * time.Second
)

// clientReadBufferSize is the size of the buffer the broker reads each
// connection through (mochi's default is 2 KiB), held for as long as the
// connection lasts. A larger packet's payload is read straight into its own
// buffer, so a smaller one only means more reads for a burst of small
// packets.
const clientReadBufferSize = 512

// maxPacketSizeLimit is MQTT's largest packet: a remaining length of at most
// 268,435,455 bytes.
const maxPacketSizeLimit = 268435455

// maxPendingLimit keeps MaxPendingMessages well below the 65535 packet ids a
// client has, and below the broker's own in-flight limit (see Start), so
// that the store's limit is always the one reached first.
const maxPendingLimit = 60000
