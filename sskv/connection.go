package sskv

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Conn is one connection of a [Client], from the moment it is ready until it
// is lost. Requests made through a Conn are bound to it: they go out on this
// connection or not at all.
//
//   - A request made after the connection was lost (or while a later one is
//     being set up) is not sent, and fails at once with an error wrapping
//     [ErrNotSent]: it was not executed.
//   - A request in flight when the connection is lost is never sent again
//     on a later connection, even when the client resumes its MQTT session.
//     If its answer does not come with the resumed session, it fails with
//     [ErrConnectionLost] once the next connection is set up: its outcome is
//     unknown, but it was executed, if at all, while this connection was up.
//
// That is what code needs whose requests are only safe in a state it has
// checked: a lock holder confirms after a reconnect that it still holds its
// key, then renews it through the connection on which it checked, so that no
// renewal can reach the store across an outage it has not checked. Requests
// made through the Client itself are not bound: they wait for the next
// connection, and one in flight is sent again after a reconnect while its
// caller still waits (see the package documentation).
//
// A Conn is cheap and safe for concurrent use.
type Conn struct {
	c      *Client
	gen    uint64
	seq    uint64 // the session store's number of the connection
	up     time.Time
	outage bool
	maxOut uint32              // the broker's Maximum Packet Size (CONNACK); 0: MQTT's limit
	slots  *semaphore.Weighted // the broker's Receive Maximum (CONNACK): requests unacknowledged at once
	// lost ends when the connection is lost: a context, so that a request
	// waiting for a slot hangs on it without a goroutine of its own.
	lost    context.Context
	endLost context.CancelFunc // ends lost

	// waiting ends the requests waiting for a slot when the connection is
	// lost: not AfterFuncs of lost, since a context keeps the room of the
	// most children it ever had, and a burst of waiters would leave it in
	// the heap for as long as the connection lasts. nil while none waits.
	wmu      sync.Mutex
	waiting  map[uint64]context.CancelFunc
	nwaiting uint64 // waiters so far: their keys in waiting
	gone     bool   // markLost has run
}

func newConn(c *Client, gen, seq uint64, outage bool, recvMax uint16) *Conn {
	if recvMax == 0 {
		recvMax = 65535 // MQTT's default when CONNACK has none
	}
	// Half of it: paho gives its own slot back a moment after Publish
	// returns, so a client that used every slot would still wait in paho's
	// queue now and then.
	lost, endLost := context.WithCancel(context.Background())
	return &Conn{c: c, gen: gen, seq: seq, up: time.Now(), outage: outage,
		slots: semaphore.NewWeighted(int64(max(recvMax/2, 1))), lost: lost, endLost: endLost}
}

// acquireSlot waits, as long as ctx allows and the connection lasts, until
// fewer than half the broker's Receive Maximum of this connection's requests
// are unacknowledged, and takes a slot; releaseSlot gives it back once paho has
// the PUBACK (or gave up). paho enforces the same limit, but waiting in its
// queue is what it cannot end cleanly: a request whose context ends just as
// its turn comes is reported on stdout. Waiting here, no request reaches
// paho's queue. It reports false when ctx ended or the connection was lost
// first.
func (cn *Conn) acquireSlot(ctx context.Context) bool {
	if cn.slots.TryAcquire(1) {
		return true
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// No goroutine: when a burst of requests waits for slots, a goroutine
	// each would stay on as heap (the runtime keeps a goroutine's g).
	cn.wmu.Lock()
	if cn.gone {
		cn.wmu.Unlock()
		return false
	}
	if cn.waiting == nil {
		cn.waiting = make(map[uint64]context.CancelFunc)
	}
	cn.nwaiting++
	id := cn.nwaiting
	cn.waiting[id] = cancel
	cn.wmu.Unlock()
	defer func() {
		cn.wmu.Lock()
		delete(cn.waiting, id)
		if len(cn.waiting) == 0 {
			cn.waiting = nil // made anew for the next burst: see waiting
		}
		cn.wmu.Unlock()
	}()
	return cn.slots.Acquire(ctx, 1) == nil
}

func (cn *Conn) releaseSlot() { cn.slots.Release(1) }

// markLost closes the Conn's Done channel. It may be called on nil, and
// more than once.
func (cn *Conn) markLost() {
	if cn != nil {
		cn.endLost()
		cn.wmu.Lock()
		waiting := cn.waiting
		cn.waiting, cn.gone = nil, true
		cn.wmu.Unlock()
		for _, cancel := range waiting {
			cancel()
		}
	}
}

// Connection returns the client's current connection once it is ready
// (subscribed to its response and notification topics), waiting for one as
// long as ctx allows. It fails with ctx's error, or ErrClosed.
func (c *Client) Connection(ctx context.Context) (*Conn, error) {
	st, err := c.waitReady(ctx, 0)
	if err != nil {
		return nil, &opError{op: "connection", err: err}
	}
	return st.conn, nil
}

// Done returns a channel that is closed when the connection is lost (or the
// client is closed). A later connection is another Conn.
func (cn *Conn) Done() <-chan struct{} { return cn.lost.Done() }

// ended reports whether the connection is lost. Every request asks: a
// receive from the closed-or-open channel takes no lock.
func (cn *Conn) ended() bool {
	select {
	case <-cn.lost.Done():
		return true
	default:
		return false
	}
}

// Since returns when the connection was set up, on this process's monotonic
// clock: whatever happened to the store while the client was disconnected
// (a restart that lost every key, say) happened before it.
func (cn *Conn) Since() time.Time { return cn.up }

// Client returns the client the connection is one of.
func (cn *Conn) Client() *Client { return cn.c }

// AfterOutage reports whether the client was cut off from the broker before
// this connection was set up: it is a reconnection, or the client's first
// connection came only after failed attempts (the broker was down or
// unreachable when the client started). Whatever the store lost meanwhile
// (every key, in a restart) it lost before Since.
func (cn *Conn) AfterOutage() bool { return cn.outage }

// Number returns the connection's number: 1 for the client's first
// connection, growing by one with each reconnection.
func (cn *Conn) Number() uint64 { return cn.gen }

// Get is [Client.Get] bound to this connection.
func (cn *Conn) Get(ctx context.Context, key string) (GetResult, error) {
	return cn.c.get(ctx, cn, key)
}

// Set is [Client.Set] bound to this connection.
func (cn *Conn) Set(ctx context.Context, key string, value []byte, opts SetOptions) (SetResult, error) {
	r, err := cn.c.set(ctx, cn, key, value, opts)
	return r, keyErr("SET", key, err)
}

// Del is [Client.Del] bound to this connection.
func (cn *Conn) Del(ctx context.Context, key string, opts DelOptions) (DelResult, error) {
	return cn.c.del(ctx, cn, key, opts)
}

// VDel is [Client.VDel] bound to this connection.
func (cn *Conn) VDel(ctx context.Context, key string, value []byte, opts DelOptions) (DelResult, error) {
	d, err := cn.c.vdel(ctx, cn, key, value, opts)
	return d, keyErr("VDEL", key, err)
}

// notSent is the error of a request bound to cn that was not sent.
func (cn *Conn) notSent() error {
	return fmt.Errorf("%w: connection %d was lost before the request went out", ErrNotSent, cn.gen)
}
