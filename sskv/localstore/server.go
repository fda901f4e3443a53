package localstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// Errors returned by Server methods.
var (
	// ErrNoClient is returned by Kick, Drop and Hold when no client with the
	// given id is connected.
	ErrNoClient = errors.New("localstore: no such connected client")
	// ErrClosed is returned by Start when the listener could not be opened and
	// by methods called after Close.
	ErrClosed = errors.New("localstore: server closed")
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

// Server is a running local state store: an MQTT v5 broker with the state
// store built in. Create one with Start; stop it with Close.
type Server struct {
	cfg    Config
	log    *slog.Logger
	broker *mqtt.Server
	inline *mqtt.Client // publishes responses and notifications
	clock  *hlc.Clock
	offset atomic.Int64 // nanoseconds added to the wall clock of the HLC

	mu  sync.Mutex // guards tab and answered, and orders notifications
	tab *table
	// persist writes persisted keys to DataDir; nil with PersistNone.
	persist *persister
	// answered keeps the answers to recent SET, DEL and VDEL requests, so
	// that a copy a resumed session sends again is not executed twice.
	answered answers
	wake     chan struct{} // nudges the expiry loop when the next deadline moves earlier
	// expiryAt is when (table time, see table.now) the expiry loop wakes at
	// the latest: the earliest deadline it saw, or an earlier one it was
	// woken for since. A SET with a deadline before it wakes the loop; one
	// after it does not. math.MaxInt64: no deadline. Guarded by mu.
	expiryAt int64

	connMu sync.Mutex
	conns  map[string]*mqtt.Client // the current connection of each client id
	latest map[string]*connRec     // the newest authenticated connection of each client id, until it ends
	recs   map[net.Conn]*connRec   // every authenticated connection, until it ends

	requests sync.Map // client id -> *atomic.Int64: requests received (see Requests)

	tenants tenants // the user each client namespace belongs to (see identity.go)

	retained retainedLedger // whose each retained message is, when they are limited (see limits.go)

	faultMu sync.Mutex
	faults  map[string]*clientFaults // by client id (see SetResponseFault)

	// observe, set only by tests, sees every notification as it is published.
	observe func(clientID, key string, payload []byte, ts string)
	// onRoomWait, set only by tests, sees every sender that starts waiting
	// for room in a client's queue of pending writes (see waitForRoom).
	onRoomWait atomic.Pointer[func(clientID string)]

	plain, secure *listener
	bg            sync.WaitGroup // drain goroutines and slow-client disconnects
	stop          chan struct{}
	loopDone      chan struct{}
	closeOnce     sync.Once
	closed        atomic.Bool
}

// Start starts a local state store and returns once it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.MaxDrift <= 0 {
		cfg.MaxDrift = hlc.DefaultMaxDrift
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "statestore"
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 2 * time.Second
	}
	if cfg.MaxKeys < 0 || cfg.MaxKeySize < 0 || cfg.MaxValueSize < 0 || cfg.MaxPacketSize < 0 ||
		cfg.MaxPendingMessages < 0 || cfg.WriteTimeout < 0 ||
		cfg.MaxKeysPerUser < 0 || cfg.MaxBytesPerUser < 0 || cfg.MaxWatchesPerClient < 0 ||
		cfg.MaxSubscriptionsPerClient < 0 || cfg.MaxRetainedPerUser < 0 || cfg.MaxRetainedBytesPerUser < 0 {
		return nil, errors.New("localstore: negative limit in Config")
	}
	if err := checkIdentityConfig(&cfg); err != nil {
		return nil, err
	}
	if cfg.MaxPacketSize == 0 {
		cfg.MaxPacketSize = DefaultMaxPacketSize
	}
	if cfg.MaxPacketSize > maxPacketSizeLimit {
		return nil, fmt.Errorf("localstore: MaxPacketSize %d is above MQTT's largest packet, %d", cfg.MaxPacketSize, maxPacketSizeLimit)
	}
	if cfg.MaxPendingMessages == 0 {
		cfg.MaxPendingMessages = DefaultMaxPendingMessages
	}
	if cfg.MaxPendingMessages > maxPendingLimit {
		return nil, fmt.Errorf("localstore: MaxPendingMessages %d is above %d", cfg.MaxPendingMessages, maxPendingLimit)
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	switch {
	case cfg.Persist < PersistNone || cfg.Persist > PersistAll:
		return nil, fmt.Errorf("localstore: unknown Persist mode %d", int(cfg.Persist))
	case cfg.Persist != PersistNone && cfg.DataDir == "":
		return nil, fmt.Errorf("localstore: Persist %s needs a DataDir", cfg.Persist)
	case cfg.Persist == PersistNone && cfg.DataDir != "":
		return nil, errors.New("localstore: DataDir is set but Persist is none: nothing would be persisted")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      cfg,
		log:      log,
		tab:      newTable(cfg.NodeID),
		expiryAt: math.MaxInt64,
		wake:     make(chan struct{}, 1),
		conns:    make(map[string]*mqtt.Client),
		latest:   make(map[string]*connRec),
		recs:     make(map[net.Conn]*connRec),
		faults:   make(map[string]*clientFaults),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	s.answered.init() // before any request: key and slot then only read the seeds
	if err := hlc.ValidateNode(cfg.NodeID); err != nil {
		return nil, fmt.Errorf("localstore: node id: %w", err)
	}
	var floor int64
	if cfg.Persist != PersistNone {
		p, err := openPersister(cfg.DataDir, log, s.wallClock, s.loadRecord)
		if err != nil {
			return nil, err
		}
		p.storeMu, p.undo = &s.mu, s.restoreKey
		p.issued = func() int64 { return s.clock.Peek().Wall }
		floor = p.hwm.Load()
		s.persist = p
		log.Info("loaded persisted keys", "dir", cfg.DataDir, "mode", cfg.Persist.String(), "keys", s.tab.len())
	}
	started := false
	defer func() {
		if !started && s.persist != nil {
			_ = s.persist.db.Close()
		}
	}()
	clock, err := hlc.NewClock(cfg.NodeID, hlc.WithMaxDrift(cfg.MaxDrift), hlc.WithWallClock(s.wallClock), hlc.WithFloor(floor))
	if err != nil {
		return nil, fmt.Errorf("localstore: node id: %w", err)
	}
	s.clock = clock

	caps := mqtt.NewDefaultServerCapabilities()
	// PUBACKs must not echo the request's user properties, and messages
	// without an expiry must not get one.
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	caps.MaximumMessageExpiryInterval = 0
	// Checked against each packet's declared length before the broker
	// allocates its buffer (Client.ReadFixedHeader), CONNECT included.
	caps.MaximumPacketSize = uint32(cfg.MaxPacketSize)
	// The broker silently drops a message to a client that has
	// MaximumInflight messages unacknowledged, or MaximumClientWritesPending
	// waiting to be written. The store disconnects such a client first (see
	// outbox and hook.OnQosPublish): its own limit, MaxPendingMessages, is
	// the one reached, and a drop the broker still makes (OnPublishDropped)
	// disconnects the client too. Senders wait for room in the queue of
	// pending writes (see writequeue.go).
	caps.MaximumInflight = 65535
	// Senders wait for room in the queue of pending writes (see
	// writequeue.go), so it need not hold every message the store allows.
	caps.MaximumClientWritesPending = int32(cfg.MaxPendingMessages)
	if writeQueueKnown() {
		caps.MaximumClientWritesPending = writeQueueSize
	}
	s.broker = mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       slog.New(packetSummaries{log.Handler()}).With("component", "broker"),
		// mochi coalesces writes in a buffer while a client's write queue is
		// not empty, and flushes it only when it fills or the queue empties.
		// A DISCONNECT (DisconnectClient: Kick, a slow client, receive
		// maximum exceeded) written then sits in that buffer, and the
		// connection is closed under it: the DISCONNECT and every message
		// buffered with it are lost. With a buffer size of 1 every packet is
		// written as it comes.
		ClientNetWriteBufferSize: 1,
		ClientNetReadBufferSize:  clientReadBufferSize,
		SysTopicResendInterval:   30,
	})
	s.inline = s.broker.NewClient(nil, "local", "$statestore", true)
	s.inline.Properties.ProtocolVersion = 5
	if err := s.broker.AddHook(&hook{s: s}, nil); err != nil {
		return nil, fmt.Errorf("localstore: %w", err)
	}

	if cfg.Addr != "-" {
		addr := cfg.Addr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		if s.plain, err = listen(s, "tcp", addr, nil); err != nil {
			return nil, err
		}
		_ = s.broker.AddListener(s.plain)
	}
	if cfg.TLS != nil {
		addr := cfg.TLSAddr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		if s.secure, err = listen(s, "tls", addr, cfg.TLS); err != nil {
			if s.plain != nil {
				_ = s.plain.ln.Close()
			}
			return nil, err
		}
		_ = s.broker.AddListener(s.secure)
	}
	if s.plain == nil && s.secure == nil {
		return nil, errors.New("localstore: no listener configured")
	}
	if err := s.broker.Serve(); err != nil {
		return nil, fmt.Errorf("localstore: %w", err)
	}
	if s.persist != nil {
		s.persist.start()
	}
	started = true
	go s.expiryLoop()
	return s, nil
}

// Addr returns the host:port of the plain TCP listener ("" when disabled).
func (s *Server) Addr() string {
	if s.plain == nil {
		return ""
	}
	return s.plain.ln.Addr().String()
}

// TLSAddr returns the host:port of the TLS listener ("" when disabled).
func (s *Server) TLSAddr() string {
	if s.secure == nil {
		return ""
	}
	return s.secure.ln.Addr().String()
}

// Close disconnects every client (each gets a DISCONNECT "server shutting
// down"), stops the listeners and the expiry timer, and returns once every
// goroutine of the server has ended. Clients that do not take their DISCONNECT
// within Config.CloseTimeout have their connections cut, so Close never hangs;
// those whose traffic from the store is held (Hold) are cut at once. Delayed
// responses (SetResponseFault) not yet sent are discarded. Keys not
// persisted (see Config.Persist) are gone after Close; persisted ones are
// committed to Config.DataDir first, and the data directory is released.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.loopDone
		_ = s.broker.Close()
		if s.persist != nil {
			// Commits what is queued: the answers waiting for it go out
			// (to nobody, now) and end.
			if err := s.persist.close(); err != nil {
				s.log.Warn("closing the data directory", "dir", s.cfg.DataDir, "error", err)
			}
		}
		s.bg.Wait()
	})
	return nil
}

// Kick disconnects the client with the given id the way an administrator
// would: it sends DISCONNECT (reason 0x98, administrative action) and closes
// the connection. It returns once the store has finished with the connection:
// the client's watches have ended and Connected reports false (unless the
// client has already reconnected). A connection whose traffic from the store
// is held (Hold) is closed at once, without DISCONNECT.
func (s *Server) Kick(clientID string) error {
	return s.disconnect(clientID, func(cl *mqtt.Client) {
		_ = s.broker.DisconnectClient(cl, packets.ErrAdministrativeAction)
	})
}

// Drop cuts the network connection of the client with the given id without
// a DISCONNECT, as a network failure would. It returns once the store has
// finished with the connection, as Kick does.
func (s *Server) Drop(clientID string) error {
	return s.disconnect(clientID, func(cl *mqtt.Client) {
		if cl.Net.Conn != nil {
			_ = cl.Net.Conn.Close()
		}
	})
}

func (s *Server) disconnect(clientID string, how func(*mqtt.Client)) error {
	s.connMu.Lock()
	cl := s.conns[clientID]
	var rec *connRec
	if cl != nil {
		rec = s.recs[cl.Net.Conn]
	}
	s.connMu.Unlock()
	if cl == nil {
		return fmt.Errorf("%w: %q", ErrNoClient, clientID)
	}
	cutHeld(cl)
	how(cl)
	if rec != nil {
		t := time.NewTimer(s.cfg.CloseTimeout)
		defer t.Stop()
		select {
		case <-rec.done:
		case <-t.C:
		}
	}
	return nil
}

// Requests returns how many requests (PUBLISHes to the state store's invoke
// topic) the client with the given id has sent since the store started,
// executed, refused or dropped as expired, over all its connections; a
// request is counted once the broker has read it, before it waits for the
// store's lock. Tests of clients use it to check what a client sends: a lock
// waiter, say, must send nothing while the holder keeps renewing.
func (s *Server) Requests(clientID string) int64 {
	if n, ok := s.requests.Load(clientID); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// Connected reports whether a client with the given id is connected.
func (s *Server) Connected(clientID string) bool {
	return s.current(clientID) != nil
}

// Watching reports whether the client with the given id has a watch
// (KEYNOTIFY) on key, so that tests of clients can check what they registered.
func (s *Server) Watching(clientID, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tab.watchers([]byte(key))[clientID]
	return ok
}

// SetClockOffset shifts the wall clock of the store's hybrid logical clock by
// d (negative: behind real time), to test clock skew between clients and the
// store. The store's versions stay monotonic whatever the offset. Key expiry
// (PX) runs on real elapsed time and is not affected.
func (s *Server) SetClockOffset(d time.Duration) {
	s.offset.Store(int64(d))
}

// Now returns the store's current hybrid logical clock time (it ticks the
// clock). A store that persists keys issues no version at or below it
// after a restart either.
func (s *Server) Now() hlc.Timestamp {
	ts := s.clock.Now()
	if s.persist != nil {
		if err := s.persist.raiseHWM(ts.Wall); err != nil {
			s.log.Warn("could not persist the high-water mark of versions", "error", err)
		}
	}
	return ts
}

// Len returns the number of keys stored (expired keys not yet collected may
// be counted).
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tab.len()
}

func (s *Server) wallClock() time.Time {
	return time.Now().Add(time.Duration(s.offset.Load()))
}

// clientRef names the connection a request came from.
type clientRef struct {
	id string
	cl *mqtt.Client
}

// current returns the current connection of clientID, or nil.
func (s *Server) current(clientID string) *mqtt.Client {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.conns[clientID]
}

// handleRequest executes a PUBLISH to the invoke topic and publishes the
// response (as the client's ResponseFault says). It runs on the publishing
// client's read goroutine, so the requests of one connection are executed in
// order. A non-nil result is the reason code of the request's PUBACK: the
// request was not executed.
//
// A request whose Message Expiry Interval passes before it is executed,
// counted from the moment the broker read it (see hook.OnPacketRead), is
// dropped: not executed, not answered, and logged, as MQTT requires of a
// message that expired before delivery [MQTT-3.3.2-5]. Its PUBACK is a
// success, as for any such message. A request waits only for the store's
// lock, behind other clients' requests, so its expiry is checked once it
// holds the lock (see serve).
func (s *Server) handleRequest(cl *mqtt.Client, pk packets.Packet) error {
	received := receivedAt(cl)
	n, ok := s.requests.Load(cl.ID)
	if !ok {
		n, _ = s.requests.LoadOrStore(cl.ID, new(atomic.Int64))
	}
	n.(*atomic.Int64).Add(1)
	respTopic := pk.Properties.ResponseTopic
	if respTopic == "" {
		s.log.Warn("dropped state store request without response topic", "client", cl.ID)
		return nil
	}
	if wire.ForbiddenResponseTopic(respTopic) {
		s.log.Warn("disconnecting client: forbidden response topic", "client", cl.ID, "topic", respTopic)
		_ = s.broker.DisconnectClient(cl, packets.ErrTopicNameInvalid)
		return nil
	}
	// A response topic one cannot publish to (a wildcard, $SYS) means the
	// response could never reach the caller: refuse the request in its
	// PUBACK rather than execute it with an outcome nobody learns.
	if !mqtt.IsValidFilter(respTopic, true) {
		s.log.Warn("refused state store request: response topic is not a valid topic name", "client", cl.ID, "topic", respTopic)
		return packets.ErrTopicNameInvalid
	}
	// The response goes only where the client could publish it itself: never
	// into another user's namespace (see acl.go).
	if !s.mayPublish(cl, respTopic) {
		s.log.Warn("refused state store request: "+msgRespTopicACL, "client", cl.ID, "user", userOf(cl), "topic", respTopic)
		return packets.ErrNotAuthorized
	}
	// The response would be one more unacknowledged message: beyond the
	// limit, the broker would drop it after the request was executed.
	if inflight := cl.State.Inflight.Len(); inflight >= s.cfg.MaxPendingMessages {
		if rec := s.recOf(cl); rec != nil {
			s.slowClient(rec, "too many unacknowledged messages", "unacknowledged", inflight, "limit", s.cfg.MaxPendingMessages)
		}
		return codeSlowClient
	}
	corr := pk.Properties.CorrelationData
	switch {
	case pk.FixedHeader.Qos != 1:
		s.log.Warn("refused state store request not at QoS 1", "client", cl.ID, "qos", pk.FixedHeader.Qos)
		s.answer(cl, respTopic, corr, errResult(MsgNotQoS1))
		return nil
	case len(corr) == 0:
		s.log.Warn("refused state store request without correlation data", "client", cl.ID)
		s.answer(cl, respTopic, corr, errResult(MsgNoCorrelation))
		return nil
	}

	var expires time.Time
	expiry := time.Duration(pk.Properties.MessageExpiryInterval) * time.Second
	if expiry > 0 {
		expires = received.Add(expiry)
	}
	res, ok := s.serve(clientRef{id: cl.ID, cl: cl}, string(cl.Properties.Username), pk.Payload, pk.Properties.User, expires,
		repeatable{corr: corr, id: clientPacketID(cl, pk.PacketID), expiry: expiry})
	if !ok {
		s.log.Warn("dropped state store request: its message expiry passed before it could be executed",
			"client", cl.ID, "age", time.Since(received), "expiry", expiry)
		return nil
	}
	if b := res.wait; b != nil {
		if !b.finished() {
			s.answerDurable(cl, respTopic, corr, res)
			return nil
		}
		if b.failedFor(res.key) {
			res = errResult(MsgPersistFailed)
		}
	}
	s.answer(cl, respTopic, corr, res)
	return nil
}

// receivedAt returns when the broker read the PUBLISH from cl being handled,
// or now if that is not known.
func receivedAt(cl *mqtt.Client) time.Time {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok && !dc.readAt.IsZero() {
		return dc.readAt
	}
	return time.Now()
}

// serve parses and executes one request payload with its user properties. A
// request that is still waiting for the store's lock at expires (zero: it
// never expires) is not executed: serve then returns false.
//
// A SET, DEL or VDEL with the correlation data, payload and timestamp of
// one of the client's requests answered within its window (see answers)
// is a copy of it that the client's resumed session sent again: it gets
// the answer the first one got, and is not executed again.
func (s *Server) serve(cl clientRef, user string, payload []byte, props []packets.UserProperty, expires time.Time, rep repeatable) (result, bool) {
	var argBuf [8][]byte
	args, err := resp.ParseCommand(payload, argBuf[:0])
	if err != nil {
		return errResult(wire.MsgSyntaxError), true
	}
	req := request{args: args, clientID: cl.id, user: user}
	for _, p := range props {
		switch p.Key {
		case wire.PropTimestamp:
			req.ts, req.hasTS = p.Val, true
		case wire.PropFencingToken:
			req.ft, req.hasFT = p.Val, true
		case wire.PropPersistence:
			req.persist = strings.EqualFold(p.Val, "true")
		}
	}
	// The hashes of a request that may be repeated are taken before the
	// store's lock: its payload may be megabytes.
	keep := len(rep.corr) > 0 && rep.id != 0 && changes(args[0])
	var (
		key  answerKey
		slot answerSlot
	)
	if keep {
		key, slot = s.answered.key(cl.id, rep.corr, payload, req.ts), s.answered.slot(cl.id, rep.id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !expires.IsZero() && time.Now().After(expires) {
		return result{}, false
	}
	if keep {
		if res, ok := s.answered.lookup(key, time.Now()); ok {
			s.log.Debug("answered a repeated request as the first time, without executing it again", "client", cl.id, "verb", string(args[0]))
			return res, true
		}
	}
	res := s.execute(cl, &req)
	if res.wait = s.durableAfter(); res.wait != nil && len(req.args) > 1 {
		res.key = string(req.args[1])
	}
	if keep {
		s.answered.keep(key, slot, res, answerWindow(rep.expiry), time.Now())
	}
	return res, true
}

// repeatable is what tells a request's copy from another request: its
// correlation data (nil: none), the packet id the client gave it (0: none
// known), and its Message Expiry Interval (zero: none).
type repeatable struct {
	corr   []byte
	id     uint16
	expiry time.Duration
}

// clientPacketID returns the packet id that cl gave the PUBLISH the broker
// handles under id (see renumberInbound).
func clientPacketID(cl *mqtt.Client, id uint16) uint16 {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok {
		return dc.clientPacketID(id)
	}
	return id
}

// changes reports whether verb is one that may change the store.
func changes(verb []byte) bool {
	switch string(verb) {
	case "SET", "DEL", "VDEL":
		return true
	}
	return false
}

// The store's own -ERR messages, for cases the service's documentation gives
// no text for (see docs/protocol.md): they are this package's, not the
// service's. Official clients never send requests that get the first two.
const (
	// MsgNotQoS1 answers a request published at QoS 0.
	MsgNotQoS1 = "requests must be published with QoS 1"
	// MsgNoCorrelation answers a request without correlation data.
	MsgNoCorrelation = "requests must carry correlation data"
	// MsgClockAhead answers a request while the store's own clock is more
	// than Config.MaxDrift ahead of its wall clock: the wall clock stepped
	// back after the store issued versions. Requests succeed again once the
	// wall clock has caught up (or the drift allows it).
	MsgClockAhead = "the state store's clock is more than the maximum drift ahead of its system clock, which has stepped back; retry once the system clock has caught up"
	// MsgResponseTooLarge answers a request whose response would be larger
	// than the Maximum Packet Size the client announced in CONNECT, which
	// the broker would have to drop (see answer).
	MsgResponseTooLarge = "the response is larger than the client's maximum packet size"
)

// respond publishes a response through the broker.
func (s *Server) respond(topic string, corr []byte, res result) {
	s.publish(topic, res.payload, responseProps(corr, res))
}

// responseProps returns the properties of the response res.
func responseProps(corr []byte, res result) packets.Properties {
	props := packets.Properties{
		CorrelationData: corr,
		ContentType:     wire.ContentType,
		User:            make([]packets.UserProperty, 0, 3),
	}
	props.User = append(props.User,
		packets.UserProperty{Key: wire.PropStatus, Val: wire.StatusOK},
		packets.UserProperty{Key: wire.PropProtocolVer, Val: wire.ProtocolVersion})
	if !res.version.IsZero() {
		props.User = append(props.User, packets.UserProperty{Key: wire.PropTimestamp, Val: res.version.String()})
	}
	return props
}

// publish injects a QoS 1 PUBLISH from the store into the broker, which
// routes it to the subscribers of topic.
func (s *Server) publish(topic string, payload []byte, props packets.Properties) {
	err := s.broker.InjectPacket(s.inline, packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID:    1, // required for QoS 1; the broker assigns each subscriber its own
		TopicName:   topic,
		Payload:     payload,
		Properties:  props,
	})
	if err != nil {
		s.log.Warn("publish failed", "topic", topic, "error", err)
	}
}

// expiryLoop deletes keys when their PX deadline passes, each with a DELETE
// notification. It sleeps until the earliest deadline; set and Close wake it.
func (s *Server) expiryLoop() {
	defer close(s.loopDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		now := s.tab.now()
		for i := s.tab.expired(now); i >= 0; i = s.tab.expired(now) {
			key := string(s.tab.key(i))
			s.removeSlot(i)
			s.notifyDelete(key)
		}
		next, ok := s.tab.nextExpiry()
		s.expiryAt = math.MaxInt64
		if ok {
			s.expiryAt = next
		}
		s.mu.Unlock()

		wait := time.Hour
		if ok {
			wait = s.tab.untilDeadline(next)
		}
		timer.Reset(wait)
		select {
		case <-s.stop:
			return
		case <-timer.C:
		case <-s.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}
}

// kickExpiry wakes the expiry loop to recompute its deadline.
func (s *Server) kickExpiry() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
