package localstore

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/hlc"
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
