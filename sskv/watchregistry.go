package sskv

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/hlc"
)

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
	// notified: a sync of it has started, and may have sent KEYNOTIFY. A
	// registration that ends without one sends no KEYNOTIFY STOP either.
	notified bool
	base     stamp
	syncGen  uint64        // connection of the latest sync started
	ready    chan struct{} // closed when the first sync ends (err says how), then nil
	err      error
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

// attach adds a watcher of key, creating the key's registration if needed.
// f is WithCallback's, or nil for a channel watcher. The watcher's first
// event is queued now if the registration is synced, or else by the sync
// under way (syncReg).
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
	w := &Watcher{c: c, reg: reg, fn: f}
	if f == nil {
		w.out = make(chan Event, 1)
	}
	var calls deliveries
	switch {
	case reg.initial:
		// The registration's first sync, under way, starts the watch.
	case reg.resyncing:
		w.initOwed = true // the resync under way starts it (syncReg)
	default:
		calls.add(w.enqueue(reg.initialEvent()))
	}
	reg.watchers = append(reg.watchers, w)
	c.wmu.Unlock()
	calls.run()
	return w, reg, nil
}

// initialEvent is the event that starts a watch of reg's key: the latest
// state known. The caller holds c.wmu.
func (reg *registration) initialEvent() Event {
	ev := Event{Key: reg.key, Op: OpDelete, Initial: true}
	if reg.known.exists {
		ev.Op, ev.Value, ev.Version = OpSet, reg.known.value, reg.known.version
	}
	return ev
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
	// A request whose context has ended never goes out (exchange).
	reg.notified = reg.notified || ctx.Err() == nil
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
	var calls deliveries
	if reg.initial {
		reg.initial = false
		ev := reg.initialEvent() // what the watch starts from
		for _, w := range reg.watchers {
			calls.add(w.enqueue(ev))
		}
		close(reg.ready)
		reg.ready = nil // nobody waits for it any more: free it
		c.wmu.Unlock()
		calls.run()
		return nil
	}
	changed := !reg.known.same(reg.base)
	for _, w := range reg.watchers {
		switch {
		case w.initOwed:
			// Joined during this resync: the state read starts it.
			w.initOwed = false
			calls.add(w.enqueue(reg.initialEvent()))
		case changed && !reg.known.same(w.told()):
			// A watcher already told the latest state (by a Resync owed
			// for an overflow, delivered during the restore) is owed
			// nothing: marking it anyway would fold its next change into
			// a needless Resync, if that change came before its
			// forwarder ran.
			calls.add(w.markResync())
		}
	}
	if changed {
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
	// A registration's answers come within a round trip on a live
	// connection: one lost (dropped by the broker) must not leave the
	// watch deaf for the whole RequestTimeout. Each attempt waits twice
	// PingTimeout at first, twice as long as the last after that, up to
	// RequestTimeout, so that a merely slow store is not flooded.
	wait := min(c.cfg.RequestTimeout, 2*c.cfg.PingTimeout)
	for {
		c.wmu.Lock()
		live := c.regs[reg.key] == reg
		c.wmu.Unlock()
		if !live {
			return // its last watcher stopped meanwhile
		}
		ctx, cancel := context.WithTimeout(c.ctx, wait)
		err := c.syncReg(ctx, reg, cn)
		cancel()
		wait = min(2*wait, c.cfg.RequestTimeout)
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

// notify applies notification n of key to its registration, and returns
// the callback watchers whose f the caller must now call (see
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
		c.wmu.Lock()
		notified := reg.notified // no sync starts once reg is out of c.regs
		c.wmu.Unlock()
		if notified {
			c.sendStop(reg.key)
		}
		c.wmu.Lock()
		delete(c.stopping, reg.key)
		c.wmu.Unlock()
		close(stopped)
	}
	// A callback watcher may be stopped from f, on the goroutine that
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
