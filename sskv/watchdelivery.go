package sskv

// forwarder is what a channel watcher's forwarder goroutine needs, made the
// first time one starts.
type forwarder struct {
	stop   chan struct{} // closed when the watcher ends: a send blocked on Events gives up
	exited chan struct{} // closed when the Events channel is
}

// deliveries are the callback watchers that have events to deliver and
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
// callback watcher for the caller to deliver (nil otherwise). The caller
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
	if w.out != nil {
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

// deliver calls a callback watcher's f with its pending events, one at a
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
