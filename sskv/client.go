package sskv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/clientlocal"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// closeGrace bounds how long Close waits for DISCONNECT to be written
// before it closes the socket.
const closeGrace = 250 * time.Millisecond

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

	local clientlocal.Values // values of the module's own packages (internal/clientlocal)
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

func init() {
	clientlocal.Of = func(c any) *clientlocal.Values { return &c.(*Client).local }
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
			// A connection is marked lost just before the state that
			// says so is stored: wait for that state rather than hand
			// out a connection that has ended.
			if !st.conn.ended() {
				return st, nil
			}
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
