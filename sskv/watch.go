package sskv

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// Op is the kind of change an [Event] reports.
type Op uint8

const (
	// OpSet: the key was set; Event.Value holds its value.
	OpSet Op = iota + 1
	// OpDelete: the key was deleted or expired; Event.Value is nil.
	OpDelete
)

func (o Op) String() string {
	switch o {
	case OpSet:
		return "SET"
	case OpDelete:
		return "DELETE"
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// Event is a state of a watched key: the state the watch starts from, then
// each change.
type Event struct {
	Key string
	Op  Op
	// Value is the new value for OpSet, nil for OpDelete. It may be shared
	// with other watchers of the key: do not modify it.
	Value []byte
	// Version is the key's new version for OpSet, and the service's time of
	// the deletion for OpDelete. It is zero when the key is absent and the
	// client did not see it deleted: in the Initial event of a missing key,
	// and in a Resync event reporting a deletion the client missed (the
	// service gives no version for a missing key).
	Version hlc.Timestamp
	// Initial marks the first event of every watch: the key's state when
	// the watch was registered, read as part of the registration (OpSet
	// with the value and version, or OpDelete if the key is missing).
	Initial bool
	// Resync marks an event that reports the key's latest known state in
	// place of changes the watcher did not get one by one: changes made
	// while the connection was down, or events coalesced because the
	// watcher did not keep up.
	Resync bool
}

// Watcher receives the states of one key (see [Client.Watch]): on the
// [Watcher.Events] channel, or by calling the function given with
// [WithCallback].
//
// Events are delivered in version order and none twice. Each Watcher buffers
// up to Config.WatchBuffer events (a channel watcher one more, in its
// channel); a consumer that falls further behind never blocks the
// connection or other watchers: its later events are coalesced into a
// single Resync event carrying the key's latest known state, delivered
// after the buffered ones as soon as the consumer reads again. So the last
// event a watcher receives always reflects the latest state the client
// knows, and its memory stays bounded.
//
// An idle Watcher costs no goroutine and no buffer: an event goes straight
// into the Events channel (of capacity 1) when it is empty, and a goroutine
// forwards events only while more are pending than the channel holds.
type Watcher struct {
	c   *Client
	reg *registration // the key's registration when the watcher was made; reg.key is the key
	out chan Event    // nil for a callback watcher
	fn  func(Event)   // WithCallback's f; nil for a channel watcher
	// fwd exists once a channel watcher's forwarder has run: a watcher
	// whose consumer keeps up never needs it.
	fwd *forwarder

	// Guarded by c.wmu.
	onDone    func(error) // WithCallback's done, until it is called
	q         []Event     // ring buffer of pending events, grown up to Config.WatchBuffer; nil while empty
	head, n   int32
	running   bool // a forwarder goroutine runs, or f is being called: only while events are pending
	held      bool // the forwarder holds an event it is sending: it counts against the buffer
	outClosed bool // the watch has ended and delivers nothing more (Events is closed, done was called)
	resync    bool // a Resync event is owed after the queue
	ended     bool
	// initOwed: the watcher joined a registration in the middle of its
	// resync after a reconnect; its Initial event is the state the resync
	// reads.
	initOwed  bool
	last      stamp // the state of the last event handed out, so that a Resync never repeats it
	err       error
	stopAfter func() bool
}

// WatchOption changes how [Client.Watch] delivers a watch's events, or how
// long the watch lasts.
type WatchOption func(*watchConfig)

type watchConfig struct {
	callback bool // WithCallback was given
	fn       func(Event)
	done     func(error)
	detached bool
}

// WithCallback has the watch call f with each event, in place of the Events
// channel, and done once when the watch ends, with the reason
// [Watcher.Err] gives (nil after Stop). A callback watch has no channel and
// no goroutine of its own: idle, it costs only its registration.
//
// f is called for one event at a time, never concurrently, and done after
// the last call of f has returned. f may be called before Watch returns.
// f and done run on the client's goroutines (done also in Stop or Close),
// often the one that receives every response and notification of the
// connection: they must return quickly, and must not wait for anything the
// client does, such as a request's answer (hand such work to a goroutine
// of your own). They may call [Watcher.Stop]. While f is slow, later events
// queue and are coalesced as for a slow reader of Events. If Watch returns
// an error, done is never called and f is not called after Watch returned.
// A nil done is allowed.
func WithCallback(f func(Event), done func(error)) WatchOption {
	return func(o *watchConfig) { o.callback, o.fn, o.done = true, f, done }
}

// Detached has ctx bound only the registration: once Watch has returned,
// the watch lasts until [Watcher.Stop] is called, the Client is closed, or
// the service refuses to register it again after a reconnect, whatever ctx
// does. A watch that lasts as long as something other than a context (a
// lease, say) so costs no context of its own.
func Detached() WatchOption {
	return func(o *watchConfig) { o.detached = true }
}

// Watch starts watching key and returns once the watch is registered with
// the service and the key has been read. The first event is the key's
// state then (Initial); every change made after it follows, in order.
// Watchers of the same key share one registration, which is ended
// (KEYNOTIFY STOP) when the last of them stops.
//
// The watch survives reconnects: the client registers it again by itself,
// reads the key, and delivers one Resync event if the key changed while the
// connection was down. The watch ends, and the Events channel is closed (or
// done is called), when ctx is done (unless [Detached]), Stop is called,
// the Client is closed, or the service refuses to register it again after a
// reconnect; [Watcher.Err] says which.
func (c *Client) Watch(ctx context.Context, key string, opts ...WatchOption) (*Watcher, error) {
	var o watchConfig
	for _, opt := range opts {
		opt(&o)
	}
	if o.callback && o.fn == nil {
		return nil, keyErr("watch", key, errors.New("WithCallback: nil function"))
	}
	if o.callback && o.done == nil {
		o.done = func(error) {}
	}
	if max := c.MaxWatchKey(); len(key) > max {
		return nil, keyErr("watch", key, fmt.Errorf("%w: %d bytes; client %q can watch keys of at most %d", ErrKeyTooLong, len(key), c.id, max))
	}
	w, reg, err := c.attach(ctx, key, o.fn)
	if err != nil {
		return nil, keyErr("watch", key, err)
	}
	if err := c.awaitSynced(ctx, reg); err != nil {
		// Ending the watcher may send KEYNOTIFY STOP and wait for its
		// answer, up to RequestTimeout: that goes on in the background, so
		// that Watch returns as soon as ctx ends.
		if !c.spawn(func() { w.end(err, true) }) {
			w.end(err, false)
		}
		return nil, keyErr("watch", key, err)
	}
	c.wmu.Lock()
	if !w.ended {
		if !o.detached {
			w.stopAfter = context.AfterFunc(ctx, func() { w.end(ctx.Err(), true) })
		}
		w.onDone = o.done // from now on the end is reported
	}
	err = w.err
	c.wmu.Unlock()
	if err != nil {
		return nil, keyErr("watch", key, err)
	}
	return w, nil
}

// MaxWatchKey returns the length of the longest key c can watch: a
// notification's topic carries the key and the client id, in hex, and an
// MQTT topic is at most 65,535 bytes. With a client id of 40 bytes, it is
// 32,690 bytes. A watch of a longer key fails with [ErrKeyTooLong].
func (c *Client) MaxWatchKey() int { return max(0, wire.MaxNotifyKey(c.id)) }

// Events returns the channel of the watcher's events. It is closed when the
// watch ends. A callback watcher has none: Events returns nil.
func (w *Watcher) Events() <-chan Event { return w.out }

// Key returns the watched key.
func (w *Watcher) Key() string { return w.reg.key }

// Err returns why the watch ended: nil while it runs and after Stop, ctx's
// error when the context given to Watch ended, ErrClosed when the Client was
// closed, or the service's error when it refused to register the watch again
// after a reconnect.
func (w *Watcher) Err() error {
	w.c.wmu.Lock()
	defer w.c.wmu.Unlock()
	return w.err
}

// Stop ends the watch. A channel watcher's Events channel is closed, and
// empty, before Stop returns. A callback watcher's f is not called after
// Stop returns, except for a call already under way on another goroutine;
// done is called once that has returned, maybe after Stop did. Stop may be
// called from f or done. When it is the key's last watcher, Stop also ends
// the registration with the service (KEYNOTIFY STOP, bounded by
// RequestTimeout; skipped while disconnected, since the service ends
// watches on disconnect, and for a watch whose KEYNOTIFY never went out;
// a callback watcher's goes out in the background). Stop is idempotent.
func (w *Watcher) Stop() { w.end(nil, true) }
