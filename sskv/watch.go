package sskv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
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

// Event is a change of a watched key.
type Event struct {
	Key string
	Op  Op
	// Value is the new value for OpSet, nil for OpDelete. It may be shared
	// with other watchers of the key: do not modify it.
	Value []byte
	// Version is the key's new version for OpSet, and the service's time of
	// the deletion for OpDelete. It is zero in a Resync event reporting a
	// deletion the client did not see happen (the service gives no version
	// for a missing key).
	Version hlc.Timestamp
	// Resync marks an event that reports the key's latest known state in
	// place of changes the watcher did not get one by one: changes made
	// while the connection was down, or events coalesced because the
	// watcher did not keep up.
	Resync bool
}

// Watcher receives the changes of one key. Create one with [Client.Watch],
// which delivers them on the [Watcher.Events] channel, or [Client.WatchFunc],
// which calls a function with them.
//
// Events are delivered in version order and none twice. Each Watcher buffers
// up to Config.WatchBuffer events (a channel watcher one more, in its
// channel); a consumer that falls further behind never
// blocks the connection or other watchers: its later events are coalesced
// into a single Resync event carrying the key's latest known state, delivered
// after the buffered ones as soon as the consumer reads again. So the last
// event a watcher receives always reflects the latest state the client knows,
// and its memory stays bounded.
//
// An idle Watcher costs no goroutine and no buffer: an event goes straight
// into the Events channel (of capacity 1) when it is empty, and a goroutine
// forwards events only while more are pending than the channel holds.
type Watcher struct {
	c   *Client
	reg *registration // the key's registration when the watcher was made; reg.key is the key
	out chan Event    // nil for a WatchFunc watcher
	fn  func(Event)   // WatchFunc's f; nil for a channel watcher
	// fwd exists once a channel watcher's forwarder has run: a watcher
	// whose consumer keeps up never needs it.
	fwd *forwarder

	// Guarded by c.wmu.
	onDone    func(error) // WatchFunc's done, until it is called
	q         []Event     // ring buffer of pending events, grown up to Config.WatchBuffer; nil while empty
	head, n   int32
	running   bool // a forwarder goroutine runs, or f is being called: only while events are pending
	held      bool // the forwarder holds an event it is sending: it counts against the buffer
	outClosed bool // the watch has ended and delivers nothing more (Events is closed, done was called)
	chClosed  bool // Events is closed: the watch ended, or was handed off to a function
	resync    bool // a Resync event is owed after the queue
	ended     bool
	last      stamp // the state of the last event handed out (or the baseline), so that a Resync never repeats it
	err       error
	stopAfter func() bool
}

// forwarder is what a channel watcher's forwarder goroutine needs, made the
// first time one starts.
type forwarder struct {
	stop   chan struct{} // closed when the watcher ends: a send blocked on Events gives up
	exited chan struct{} // closed when the Events channel is
}

// stamp is the part of a key's state that tells two states apart.
type stamp struct {
	version hlc.Timestamp
	exists  bool
}

// registration is the client's watch of one key, shared by its watchers.
// Guarded by c.wmu. Its booleans sit side by side, as keyState's do: every
// watched key has one, and so it takes a size class less.
type registration struct {
	key      string
	watchers []*Watcher
	known    keyState // the latest state known
	lastSeq  uint64   // sequence number of the last notification applied
	initial  bool     // the first sync (at Watch) has not finished
	// Between a disconnect and the GET that follows re-registration,
	// notifications update known without being delivered; base is the state
	// last delivered before it.
	resyncing bool
	base      stamp
	syncGen   uint64        // connection of the latest sync started
	ready     chan struct{} // closed when the first sync ends (err says how), then nil
	err       error
	// syncs counts the syncs in progress, each started while reg was the
	// key's registration: the KEYNOTIFY STOP that ends reg waits for them,
	// so that it reaches the store after any KEYNOTIFY they sent.
	syncs sync.WaitGroup
}

type keyState struct {
	value   []byte
	version hlc.Timestamp
	exists  bool
	// unseen marks a deletion learned from a GET, not from a notification:
	// version is then the last version the client knew, not the time of the
	// deletion, which the service does not tell.
	unseen bool
}

func (s keyState) stamp() stamp { return stamp{version: s.version, exists: s.exists} }

// same reports whether s is the state t tells apart.
func (s keyState) same(t stamp) bool {
	if s.exists != t.exists {
		return false
	}
	return !s.exists || s.version == t.version
}

func (reg *registration) beginResync() {
	if !reg.resyncing {
		reg.resyncing = true
		reg.base = reg.known.stamp()
	}
}

// Watch starts watching key and returns once the watch is registered with the
// service: every change made after Watch returns is delivered on
// [Watcher.Events]. Watchers of the same key share one registration, which is
// ended (KEYNOTIFY STOP) when the last of them stops.
//
// The watch survives reconnects: the client registers it again by itself,
// reads the key, and delivers one Resync event if the key changed while the
// connection was down. The watch ends, and the Events channel is closed,
// when ctx is done, Stop is called, the Client is closed, or the service
// refuses to register it again after a reconnect; [Watcher.Err] says which.
func (c *Client) Watch(ctx context.Context, key string) (*Watcher, error) {
	return c.watch(ctx, key, nil, nil, false)
}

// WatchFunc is [Client.Watch] with a function in place of the Events
// channel: it calls f with each event of key, and done once when the watch
// ends, with the reason Watch's [Watcher.Err] gives (nil after Stop). It
// has no channel and no goroutine of its own: an idle callback watch costs
// only its registration.
//
// Everything Watch promises holds: events come in version order, none
// twice, Resync events report changes missed during a disconnect or
// coalesced, and the watch is registered again after a reconnect. f is
// called for one event at a time, never concurrently for one watcher, and
// done after the last call of f has returned; f may be called before
// WatchFunc returns.
//
// f and done run on the client's goroutines (done also in Stop, or
// Close), often the one that receives every response and notification of
// the connection: they must
// return quickly, and must not wait for anything the client does, such as
// a request's answer (hand such work to a goroutine of your own). They may
// call [Watcher.Stop]. While f is slow, the watcher's later events queue
// and are coalesced as for a slow reader of Events.
//
// If WatchFunc returns an error, done is never called and f is not called
// after it returned.
func (c *Client) WatchFunc(ctx context.Context, key string, f func(Event), done func(error)) (*Watcher, error) {
	return c.watchFunc(ctx, key, f, done, false)
}

// WatchDetached is [Client.Watch] with ctx bounding only the registration:
// once WatchDetached has returned, the watch lasts until [Watcher.Stop] is
// called, the Client is closed, or the service refuses to register it
// again after a reconnect, whatever ctx does. A watch that lasts as long as
// something other than a context (a lease, say) so costs no context of its
// own and nothing registered with ctx.
func (c *Client) WatchDetached(ctx context.Context, key string) (*Watcher, error) {
	return c.watch(ctx, key, nil, nil, true)
}

// WatchFuncDetached is [Client.WatchFunc] with ctx bounding only the
// registration, as for [Client.WatchDetached]: once it has returned, the
// watch lasts until Stop, Close or a refused re-registration.
func (c *Client) WatchFuncDetached(ctx context.Context, key string, f func(Event), done func(error)) (*Watcher, error) {
	return c.watchFunc(ctx, key, f, done, true)
}

func (c *Client) watchFunc(ctx context.Context, key string, f func(Event), done func(error), detached bool) (*Watcher, error) {
	if f == nil {
		return nil, keyErr("watch", key, errors.New("nil function"))
	}
	if done == nil {
		done = func(error) {}
	}
	return c.watch(ctx, key, f, done, detached)
}

// watch registers a watcher of key. Unless detached, ctx also bounds the
// life of the watch.
func (c *Client) watch(ctx context.Context, key string, f func(Event), done func(error), detached bool) (*Watcher, error) {
	if max := c.MaxWatchKey(); len(key) > max {
		return nil, keyErr("watch", key, fmt.Errorf("%w: %d bytes; client %q can watch keys of at most %d", ErrKeyTooLong, len(key), c.id, max))
	}
	w, reg, err := c.attach(ctx, key, f)
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
		if !detached {
			w.stopAfter = context.AfterFunc(ctx, func() { w.end(ctx.Err(), true) })
		}
		w.onDone = done // from now on the end is reported
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

// attach adds a watcher of key, creating the key's registration if needed.
// f is WatchFunc's, or nil for a channel watcher.
func (c *Client) attach(ctx context.Context, key string, f func(Event)) (*Watcher, *registration, error) {
	c.wmu.Lock()
	for {
		if c.closed.Load() {
			c.wmu.Unlock()
			return nil, nil, ErrClosed
		}
		ch, ok := c.stopping[key]
		if !ok {
			break
		}
		c.wmu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-c.ctx.Done():
			return nil, nil, ErrClosed
		}
		c.wmu.Lock()
	}
	reg := c.regs[key]
	if reg == nil {
		reg = &registration{key: key, resyncing: true, initial: true, ready: make(chan struct{})}
		c.regs[key] = reg
	}
	w := &Watcher{c: c, reg: reg, fn: f, last: reg.known.stamp()}
	if f == nil {
		w.out = make(chan Event, 1)
	}
	if reg.resyncing {
		w.last = reg.base // what the registration's other watchers were last told
	}
	reg.watchers = append(reg.watchers, w)
	c.wmu.Unlock()
	return w, reg, nil
}

// awaitSynced registers reg with the service unless it is already, and waits
// until its baseline is known.
func (c *Client) awaitSynced(ctx context.Context, reg *registration) error {
	for {
		c.wmu.Lock()
		initial, ready := reg.initial, reg.ready
		c.wmu.Unlock()
		if !initial {
			break
		}
		st, err := c.waitReady(ctx, 0)
		if err != nil {
			return err
		}
		if st.notifyErr != nil {
			return st.notifyErr
		}
		c.wmu.Lock()
		reg.syncGen = max(reg.syncGen, st.gen)
		c.wmu.Unlock()
		err = c.syncReg(ctx, reg, st.conn)
		if errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrNotSent) {
			continue
		}
		if err != nil {
			return err
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.ctx.Done():
			return ErrClosed
		}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return reg.err
}

// maxAmbiguousReads bounds the GETs of a sync that keep finding the key
// missing while notifications of it come in (see syncReg).
const maxAmbiguousReads = 3

// syncReg sends KEYNOTIFY for reg on connection cn, then GETs the key on it
// to learn its state, and ends reg's resync (for cn; a sync for an older
// connection changes nothing). Both requests are bound to cn: a watch
// belongs to a connection, and one registered on an earlier connection
// must never be registered again on a later one by a resent request.
func (c *Client) syncReg(ctx context.Context, reg *registration, cn *Conn) error {
	c.wmu.Lock()
	if c.regs[reg.key] != reg {
		c.wmu.Unlock()
		return nil // its last watcher stopped meanwhile: nothing to register
	}
	reg.syncs.Add(1)
	c.wmu.Unlock()
	defer reg.syncs.Done()
	if c.testHookSync != nil {
		c.testHookSync(reg.key)
	}

	r, err := c.do(ctx, cn, verbKeyNotify, command(nil, "KEYNOTIFY", reg.key), hlc.Timestamp{}, false)
	if err == nil {
		err = keyNotifyResult(verbKeyNotify, r)
	}
	if err != nil {
		return err
	}
	for reads := 1; ; reads++ {
		sent := c.nseq.Load()
		r, err = c.do(ctx, cn, verbGet, command(nil, "GET", reg.key), hlc.Timestamp{}, false)
		if err != nil {
			return err
		}
		g, err := getResult(r)
		if err != nil {
			return err
		}
		c.wmu.Lock()
		if !reg.resyncing || cn.gen != reg.syncGen {
			c.wmu.Unlock()
			return nil
		}
		// "Not found" carries no version, so it cannot be ordered against a
		// notification that came in while the GET was under way: the SET
		// it reports may have been made after the GET ran. Read again; the
		// notifications, which report every change since the KEYNOTIFY,
		// settle it if the key keeps changing.
		ambiguous := !g.Found && reg.lastSeq > sent
		if ambiguous && reads < maxAmbiguousReads {
			c.wmu.Unlock()
			continue
		}
		// A notification routed after the GET's response is newer than it.
		if reg.lastSeq <= r.seq && !ambiguous {
			switch {
			case g.Found && (reg.known.version.IsZero() || !reg.known.version.After(g.Version)):
				// A copy: the value may sit in a much larger read buffer.
				reg.known = keyState{exists: true, value: bytes.Clone(g.Value), version: g.Version}
			case !g.Found && reg.known.exists:
				reg.known = keyState{version: reg.known.version, unseen: true}
			}
		}
		break
	}
	reg.resyncing = false
	if reg.initial {
		reg.initial = false
		for _, w := range reg.watchers {
			w.last = reg.known.stamp() // the baseline: Watch reports changes after it
		}
		close(reg.ready)
		reg.ready = nil // nobody waits for it any more: free it
		c.wmu.Unlock()
		return nil
	}
	var calls deliveries
	if !reg.known.same(reg.base) {
		for _, w := range reg.watchers {
			// A watcher already told the latest state (by a Resync owed
			// for an overflow, delivered during the restore) is owed
			// nothing: marking it anyway would fold its next change into
			// a needless Resync, if that change came before its
			// forwarder ran.
			if !reg.known.same(w.told()) {
				calls.add(w.markResync())
			}
		}
		if f := c.cfg.Metrics.WatchResync; f != nil {
			f(reg.key)
		}
	}
	c.wmu.Unlock()
	calls.run()
	return nil
}

// forgetVersions makes the watches take the next state they learn as new,
// whatever its version, after a reconnect on which the broker had lost the
// client's session: most likely it restarted, and a restarted store, which
// has lost its keys, may give versions below those of its predecessor for a
// while (its clock is the wall clock; the old one's may have been pushed
// ahead by clients' clocks, or the wall clock may have stepped back). A
// watch that compared the new versions with the old ones would take a new
// SET for a stale one and drop it.
func (c *Client) forgetVersions() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for _, reg := range c.regs {
		reg.known.version = hlc.Timestamp{}
	}
}

// resyncWatches re-registers, after connection cn came up, every watch not
// yet synced on it.
func (c *Client) resyncWatches(cn *Conn) {
	gen := cn.gen
	c.wmu.Lock()
	var regs []*registration
	for _, reg := range c.regs {
		if reg.syncGen < gen {
			reg.beginResync()
			reg.syncGen = gen
			regs = append(regs, reg)
		}
	}
	c.wmu.Unlock()
	if len(regs) == 0 {
		return
	}
	if err := c.state.Load().notifyErr; err != nil {
		for _, reg := range regs {
			c.endRegistration(reg, err, false)
		}
		return
	}
	var g errgroup.Group
	g.SetLimit(16)
	for _, reg := range regs {
		g.Go(func() error {
			c.resyncOne(reg, cn)
			return nil
		})
	}
	_ = g.Wait()
}

func (c *Client) resyncOne(reg *registration, cn *Conn) {
	b := retryBackoff(c.cfg.ReconnectMin, c.cfg.ReconnectMax)
	for {
		c.wmu.Lock()
		live := c.regs[reg.key] == reg
		c.wmu.Unlock()
		if !live {
			return // its last watcher stopped meanwhile
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.RequestTimeout)
		err := c.syncReg(ctx, reg, cn)
		cancel()
		if err == nil || c.ctx.Err() != nil || c.state.Load().gen != cn.gen || errors.Is(err, ErrNotSent) {
			return // done, closing, or the next connection's setup takes over
		}
		var se *ServiceError
		if errors.As(err, &se) {
			c.log.Warn("watch refused on re-registration", "key", reg.key, "error", err)
			c.endRegistration(reg, err, true) // its KEYNOTIFY may have been applied
			return
		}
		c.log.Debug("watch re-registration failed; retrying", "key", reg.key, "error", err)
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
	}
}

// endRegistration ends every watcher of reg with err.
// With unregister, it also ends the service's watch (KEYNOTIFY STOP), as
// the last watcher's Stop does.
func (c *Client) endRegistration(reg *registration, err error, unregister bool) {
	c.wmu.Lock()
	var stopped chan struct{}
	if c.regs[reg.key] == reg {
		delete(c.regs, reg.key)
		if unregister && !c.closed.Load() {
			stopped = make(chan struct{})
			c.stopping[reg.key] = stopped
		}
	}
	reg.err = err
	if reg.initial {
		reg.initial = false
		close(reg.ready)
		reg.ready = nil
	}
	ws := append([]*Watcher(nil), reg.watchers...)
	c.wmu.Unlock()
	for _, w := range ws {
		w.end(err, false)
	}
	if stopped != nil {
		c.sendStop(reg.key)
		c.wmu.Lock()
		delete(c.stopping, reg.key)
		c.wmu.Unlock()
		close(stopped)
	}
}

// closeWatches ends every watcher when the client closes.
func (c *Client) closeWatches() {
	c.wmu.Lock()
	var ws []*Watcher
	for key, reg := range c.regs {
		ws = append(ws, reg.watchers...)
		delete(c.regs, key)
	}
	c.wmu.Unlock()
	for _, w := range ws {
		w.end(ErrClosed, false)
	}
}

// notification is a decoded KEYNOTIFY notification.
type notification struct {
	op      Op
	value   []byte
	version hlc.Timestamp
}

// parseNotification decodes a notification's payload and user properties:
// "NOTIFY SET VALUE v" or "NOTIFY DELETE" (or "DEL"), with __ts. It never
// panics, whatever the input.
func parseNotification(payload []byte, user paho.UserProperties) (notification, error) {
	var n notification
	ts, ok := "", false
	for _, p := range user {
		if p.Key == wire.PropTimestamp {
			ts, ok = p.Value, true
		}
	}
	if !ok {
		return n, errors.New("notification without __ts")
	}
	var err error
	if n.version, err = hlc.Parse(ts); err != nil {
		return n, err
	}
	var buf [4][]byte
	args, err := resp.ParseCommand(payload, buf[:0])
	if err != nil {
		return n, err
	}
	if len(args) < 2 || !bytes.EqualFold(args[0], []byte("NOTIFY")) {
		return n, errors.New("not a NOTIFY")
	}
	switch {
	case bytes.EqualFold(args[1], []byte("SET")) && len(args) == 4 && bytes.EqualFold(args[2], []byte("VALUE")):
		n.op, n.value = OpSet, args[3]
	case (bytes.EqualFold(args[1], []byte("DELETE")) || bytes.EqualFold(args[1], []byte("DEL"))) && len(args) == 2:
		n.op = OpDelete
	default:
		return n, fmt.Errorf("unknown notification %q with %d arguments", args[1], len(args))
	}
	return n, nil
}

// handleNotification runs on paho's receiving goroutine.
func (c *Client) handleNotification(key []byte, p *paho.Publish) {
	var user paho.UserProperties
	if p.Properties != nil {
		user = p.Properties.User
	}
	n, err := parseNotification(p.Payload, user)
	if err != nil {
		c.log.Warn("dropped malformed notification", "key", string(key), "error", err)
		return
	}
	if _, err := c.clock.Update(n.version); err != nil {
		c.log.Debug("clock not updated from a notification", "version", n.version, "error", err)
	}
	c.wmu.Lock()
	calls := c.notify(key, n)
	c.wmu.Unlock()
	calls.run()
}

// notify applies notification n of key to its registration, and returns
// the WatchFunc watchers whose f the caller must now call (see
// deliveries). The caller holds c.wmu.
func (c *Client) notify(key []byte, n notification) deliveries {
	seq := c.nseq.Add(1)
	reg := c.regs[string(key)]
	if reg == nil {
		return deliveries{}
	}
	reg.lastSeq = seq
	known := &reg.known
	switch n.op {
	case OpSet:
		if !known.version.IsZero() && !n.version.After(known.version) {
			return deliveries{} // a duplicate or stale notification
		}
		// A copy: the value sits in the packet's read buffer, often several
		// times its size, which the registration would keep while idle.
		n.value = bytes.Clone(n.value)
		*known = keyState{exists: true, value: n.value, version: n.version}
	case OpDelete:
		if !known.exists || !n.version.After(known.version) {
			if n.version.After(known.version) {
				known.version = n.version
			}
			return deliveries{}
		}
		*known = keyState{version: n.version}
	}
	if reg.resyncing {
		return deliveries{}
	}
	ev := Event{Key: reg.key, Op: n.op, Value: n.value, Version: n.version}
	var calls deliveries
	for _, w := range reg.watchers {
		calls.add(w.enqueue(ev))
	}
	return calls
}

// deliveries are the WatchFunc watchers that have events to deliver and
// no call of f under way: whoever made them so calls f for them, after
// releasing c.wmu, on its own goroutine. Most keys have one watcher.
type deliveries struct {
	one  *Watcher
	more []*Watcher
}

// add notes w, if it is not nil.
func (d *deliveries) add(w *Watcher) {
	switch {
	case w == nil:
	case d.one == nil:
		d.one = w
	default:
		d.more = append(d.more, w)
	}
}

// run delivers the pending events of each watcher noted. The caller does
// not hold c.wmu.
func (d *deliveries) run() {
	if d.one != nil {
		d.one.deliver()
	}
	for _, w := range d.more {
		w.deliver()
	}
}

// Events returns the channel of the watcher's events. It is closed when the
// watch ends. A watcher made by WatchFunc has none: Events returns nil.
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
// empty, before Stop returns. A WatchFunc watcher's f is not called after
// Stop returns, except for a call already under way on another goroutine;
// done is called once that has returned, maybe after Stop did. Stop may be
// called from f or done. When it is the key's last watcher, Stop also ends
// the registration with the service (KEYNOTIFY STOP, bounded by
// RequestTimeout; skipped while disconnected, since the service ends
// watches on disconnect; a WatchFunc watcher's goes out in the background).
// Stop is idempotent.
func (w *Watcher) Stop() { w.end(nil, true) }

// end ends the watcher with err. unregister sends KEYNOTIFY STOP when it was
// the key's last watcher.
func (w *Watcher) end(err error, unregister bool) {
	c := w.c
	c.wmu.Lock()
	if w.ended {
		wait := w.fn == nil && !w.outClosed // its forwarder is closing Events
		c.wmu.Unlock()
		if wait {
			<-w.fwd.exited
		}
		return
	}
	w.ended, w.err = true, err
	reg := w.reg
	for i, o := range reg.watchers {
		if o == w {
			reg.watchers = append(reg.watchers[:i], reg.watchers[i+1:]...)
			break
		}
	}
	if len(reg.watchers) == 0 {
		reg.watchers = nil
	}
	var stopped chan struct{}
	if len(reg.watchers) == 0 && c.regs[reg.key] == reg {
		delete(c.regs, reg.key)
		if unregister && !c.closed.Load() {
			stopped = make(chan struct{})
			c.stopping[reg.key] = stopped
		}
	}
	// A delivery under way (a forwarder, or a call of f) ends the
	// watcher's output itself when it sees the watcher ended.
	running := w.running
	var done func(error)
	switch {
	case !running:
		done = w.closeOut()
	case w.fn == nil:
		close(w.fwd.stop) // a send blocked on Events gives up
	}
	stopAfter := w.stopAfter
	c.wmu.Unlock()
	if stopAfter != nil {
		stopAfter()
	}
	if done != nil {
		done(err)
	}
	if running && w.fn == nil {
		<-w.fwd.exited
	}
	if stopped == nil {
		return
	}
	unregisterKey := func() {
		reg.syncs.Wait() // a KEYNOTIFY in flight goes before the STOP
		c.sendStop(reg.key)
		c.wmu.Lock()
		delete(c.stopping, reg.key)
		c.wmu.Unlock()
		close(stopped)
	}
	// A WatchFunc watcher may be stopped from f, on the goroutine that
	// receives the answers: it must not wait for one there. Its STOP goes
	// out in the background (a new watch of the key waits for it).
	if w.fn == nil || !c.spawn(unregisterKey) {
		unregisterKey()
	}
}

// sendStop ends the service's watch of key, if connected. While the client
// is not, there is nothing to end: watches end with their connection, and
// no KEYNOTIFY is ever sent again on a later one (syncReg binds it to its
// connection).
func (c *Client) sendStop(key string) {
	c.bgMu.Lock()
	if c.bgClosed {
		c.bgMu.Unlock()
		return
	}
	c.wg.Add(1)
	c.bgMu.Unlock()
	defer c.wg.Done()
	st := c.state.Load()
	if !st.ready {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.RequestTimeout)
	defer cancel()
	r, err := c.do(ctx, st.conn, verbKeyNotifyStop, command(nil, "KEYNOTIFY", key, "STOP"), hlc.Timestamp{}, false)
	if err == nil {
		err = keyNotifyResult(verbKeyNotifyStop, r)
	}
	if err != nil {
		c.log.Debug("KEYNOTIFY STOP failed", "key", key, "error", err)
	}
}

// enqueue queues ev, or owes a Resync event when the buffer is full. It
// returns the watcher if the caller must deliver its events (see
// deliveries), else nil. The caller holds c.wmu.
func (w *Watcher) enqueue(ev Event) *Watcher {
	if w.ended {
		return nil
	}
	if w.fn == nil && !w.running && w.n == 0 && !w.resync {
		// Nothing pending: straight into the channel if it has room, with
		// no goroutine.
		select {
		case w.out <- ev:
			w.last = stamp{version: ev.Version, exists: ev.Op == OpSet}
			return nil
		default:
		}
	}
	if w.resync || int(w.n) >= w.c.cfg.WatchBuffer-btoi(w.held) {
		w.resync = true
	} else {
		if int(w.n) == len(w.q) {
			w.grow()
		}
		w.q[(int(w.head)+int(w.n))%len(w.q)] = ev
		w.n++
	}
	return w.signal()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// grow doubles the ring buffer, up to Config.WatchBuffer. The caller holds
// c.wmu.
func (w *Watcher) grow() {
	q := make([]Event, min(max(2, 2*len(w.q)), w.c.cfg.WatchBuffer))
	for i := range int(w.n) {
		q[i] = w.q[(int(w.head)+i)%len(w.q)]
	}
	w.q, w.head = q, 0
}

// told is the state the watcher's consumer knows once it has been handed
// every event queued: that of the last queued event, or else of the last
// handed out. The caller holds c.wmu.
func (w *Watcher) told() stamp {
	if w.n > 0 {
		ev := w.q[(int(w.head)+int(w.n)-1)%len(w.q)]
		return stamp{version: ev.Version, exists: ev.Op == OpSet}
	}
	return w.last
}

// markResync owes the watcher a Resync event. It returns the watcher if
// the caller must deliver its events (see deliveries), else nil. The
// caller holds c.wmu.
func (w *Watcher) markResync() *Watcher {
	if w.ended {
		return nil
	}
	w.resync = true
	return w.signal()
}

// signal has the watcher's pending events delivered, unless a delivery is
// under way: it starts a channel watcher's forwarder, and returns a
// WatchFunc watcher for the caller to deliver (nil otherwise). The caller
// holds c.wmu.
func (w *Watcher) signal() *Watcher {
	if w.running || w.outClosed {
		return nil
	}
	w.running = true
	if w.fn != nil {
		return w
	}
	if w.fwd == nil {
		w.fwd = &forwarder{stop: make(chan struct{}), exited: make(chan struct{})}
	}
	if !w.c.spawn(w.run) {
		w.running = false // Close has started: it ends the watcher
	}
	return nil
}

// closeOut ends the watcher's output once: it closes the Events channel,
// emptied, or returns the done function to call. The caller holds c.wmu.
func (w *Watcher) closeOut() (done func(error)) {
	if w.outClosed {
		return nil
	}
	w.outClosed = true
	w.q, w.head, w.n, w.resync = nil, 0, 0, false
	if w.out != nil && !w.chClosed {
		w.chClosed = true
		select {
		case <-w.out: // not received before the end: a stopped watcher's channel is empty
		default:
		}
		close(w.out)
		if w.fwd != nil {
			close(w.fwd.exited)
		}
	}
	if w.fn != nil {
		done, w.onDone = w.onDone, nil
		return done
	}
	return nil
}

// Handoff turns a watcher made by [Client.Watch] into one like those of
// [Client.WatchFunc]: from now on f is called with its events, starting
// with those not yet received from the Events channel, and done once when
// the watch ends. The Events channel is closed, without ending the watch.
// Nothing may receive from Events meanwhile or after. f and done follow
// the rules of WatchFunc; f may be called before Handoff returns. A
// program that stops reading a watcher can so go on with it without a
// goroutine, and without missing or repeating an event.
//
// Handoff returns once Events is closed. It reports false, and changes
// nothing, if the watch has ended or was made by WatchFunc or handed off
// already.
func (w *Watcher) Handoff(f func(Event), done func(error)) bool {
	if f == nil {
		return false
	}
	if done == nil {
		done = func(error) {}
	}
	c := w.c
	c.wmu.Lock()
	if w.ended || w.fn != nil {
		c.wmu.Unlock()
		return false
	}
	w.fn, w.onDone = f, done
	if w.running {
		close(w.fwd.stop) // the forwarder hands over (see run)
		c.wmu.Unlock()
		<-w.fwd.exited
		return true
	}
	next := w.handOver()
	c.wmu.Unlock()
	if next != nil {
		next.deliver()
	}
	return true
}

// handOver completes a Handoff once no forwarder runs: an event left in
// the channel goes back to the front of the queue, the channel is closed,
// and the pending events go to f. It returns the watcher if the caller
// must deliver them (see deliveries). The caller holds c.wmu.
func (w *Watcher) handOver() *Watcher {
	select {
	case ev := <-w.out:
		w.pushFront(ev)
	default:
	}
	w.chClosed = true
	close(w.out)
	if w.fwd != nil {
		close(w.fwd.exited)
	}
	w.running, w.held = false, false
	if w.n == 0 && !w.resync {
		return nil
	}
	return w.signal()
}

// pushFront puts ev back at the head of the queue, beyond WatchBuffer if
// need be: it was handed out once already. The caller holds c.wmu.
func (w *Watcher) pushFront(ev Event) {
	if int(w.n) == len(w.q) {
		q := make([]Event, max(2, 2*len(w.q)))
		for i := range int(w.n) {
			q[i] = w.q[(int(w.head)+i)%len(w.q)]
		}
		w.q, w.head = q, 0
	}
	w.head = int32((int(w.head) - 1 + len(w.q)) % len(w.q))
	w.q[w.head] = ev
	w.n++
}

// next pops the next event to deliver. The caller holds c.wmu.
func (w *Watcher) next() (Event, bool) {
	if w.n > 0 {
		ev := w.q[w.head]
		w.q[w.head] = Event{}
		w.head = int32((int(w.head) + 1) % len(w.q))
		w.n--
		if w.n == 0 {
			w.q, w.head = nil, 0 // an idle watcher keeps no buffer
		}
		w.last = stamp{version: ev.Version, exists: ev.Op == OpSet}
		return ev, true
	}
	if w.resync {
		w.resync = false
		k := w.reg.known
		if k.same(w.last) {
			// What this watcher was last told is still the state: a Resync
			// owed for an overflow, then for a reconnect, may both find the
			// same state, and one is enough.
			return Event{}, false
		}
		w.last = k.stamp()
		ev := Event{Key: w.reg.key, Op: OpDelete, Resync: true}
		switch {
		case k.exists:
			ev.Op, ev.Value, ev.Version = OpSet, k.value, k.version
		case !k.unseen:
			ev.Version = k.version
		}
		return ev, true
	}
	return Event{}, false
}

// run forwards a channel watcher's pending events to its channel, and
// returns when there are none (signal starts it again) or the watcher ends.
func (w *Watcher) run() {
	c := w.c
	for {
		c.wmu.Lock()
		if w.fn != nil && !w.ended { // handed off (see Handoff)
			next := w.handOver()
			c.wmu.Unlock()
			if next != nil {
				next.deliver()
			}
			return
		}
		var ev Event
		ok := false
		if !w.ended {
			ev, ok = w.next()
		}
		w.held = ok
		if !ok {
			w.running = false
			var done func(error)
			if w.ended {
				done = w.closeOut()
			}
			err := w.err
			c.wmu.Unlock()
			if done != nil {
				done(err)
			}
			return
		}
		c.wmu.Unlock()
		select {
		case w.out <- ev:
		case <-w.fwd.stop:
			c.wmu.Lock()
			if w.fn != nil && !w.ended { // handed off with ev in hand: it goes first
				w.pushFront(ev)
				next := w.handOver()
				c.wmu.Unlock()
				if next != nil {
					next.deliver()
				}
				return
			}
			w.running, w.held = false, false
			done := w.closeOut()
			err := w.err
			c.wmu.Unlock()
			if done != nil {
				done(err)
			}
			return
		}
	}
}

// deliver calls a WatchFunc watcher's f with its pending events, one at a
// time, until there are none (signal hands it out again), then done if the
// watcher has ended. The caller was handed w by signal, and does not hold
// c.wmu.
func (w *Watcher) deliver() {
	c := w.c
	for {
		c.wmu.Lock()
		var ev Event
		ok := false
		if !w.ended {
			ev, ok = w.next()
		}
		if !ok {
			w.running = false
			var done func(error)
			if w.ended {
				done = w.closeOut()
			}
			err := w.err
			c.wmu.Unlock()
			if done != nil {
				done(err)
			}
			return
		}
		c.wmu.Unlock()
		w.fn(ev)
	}
}
