package lock

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// The waiters of a lock queue in the order they came, without a list or a
// scan in the store, and without telling every waiter of every change.
//
// The holder keeps the queue, in memory. Each Lock that waits, holds or has
// just held the lock watches its own inbox key (the lock's name, inboxInfix
// and its HolderID), and the others tell it things with a SET of that key:
//
//   - A waiter learns the holder from the lock's key (a GET) and joins by
//     writing its acquisition record into the holder's inbox. The holder
//     appends it to the queue and confirms it (msgAck), or tells it to
//     watch the lock's key (msgHead).
//   - Two waiters watch the lock's key (keyWatchers), and nobody else does:
//     they see the holder's renewals, its release and its expiry. The
//     holder picks them from the back of its queue, and they watch until
//     they hold (or leave), so that most handovers need no new watcher: a
//     new one is told, and watches, only when one of them took the lock.
//     ('1': it was alone in the queue when told; '2': others were ahead.)
//     A waiter whose join is not confirmed yet watches the key too, in case
//     the holder keeps no queue (it took a free lock without waiting, or
//     with TryLock).
//   - The holder releases (VDEL, or with FenceKey a fenced SET of the first
//     waiter's record: a reservation only that waiter can take), and hands
//     the queue to the first waiter (msgTurn), which takes the lock and
//     keeps the queue from then on. A first waiter that watches the key is
//     sent the turn with the delete, not after its answer, and takes the
//     key once it has seen both; one that does not is sent it after the
//     delete's answer, and finds the key free. A holder that locks again
//     joins at the back.
//   - A Lock that has handed the queue on passes whatever it is still told
//     (a join or a leave that crossed the handover) to the one it handed to.
//
// So a handover costs a fixed number of requests and notifications, however
// many wait: the release, the turn, the acquisition, and the old holder's
// join if it locks again (it joins the Lock it handed to, without a GET);
// and, when a watcher took the lock, telling a new one at the back to watch
// (msgHead, and its KEYNOTIFY and GET) and the new holder's KEYNOTIFY STOP,
// which with N waiters comes about twice every N handovers.
//
// When the holder is gone without handing over (it crashed, or its holding
// was lost), the watchers see the key expire. The first waiter takes it at
// once: a watcher that is the first does (one told '1', or one that has seen
// every waiter it was told was ahead of it take the key), and a watcher
// that is not tells the first of those (msgExpired: both watchers do, one
// message each), which takes it; a Lock that was told and no longer waits
// tells the next. A waiter that leaves the queue is struck from the
// watchers' lists: the holder tells
// the watchers behind it (msgLeft), one message each. A watcher takes the key itself after coverGrace, in case
// the first is gone too (or merely slow). Not after a Resync: a key that
// vanished unseen is left alone for a TTL (see Lock). A holder that took
// the lock without being handed the queue, or whose inbox lost track of
// what it was told (a Resync), cannot know every waiter: it writes the
// queue's roll call (the lock's name and queueSuffix), which every engaged
// Lock watches, and a waiter missing from it joins again. That costs a
// notification per waiter, and happens only after such faults.
//
// Fairness bound: a waiter whose join is confirmed is served in order, so
// each other waiter overtakes it at most once; if the queue is lost and it
// joins again, at most once more. So a Lock call is overtaken at most 2N
// times with N other waiters. Locks that take the lock while it is free
// (TryLock, or a Lock that finds it free) can take it only between a plain
// release and the first waiter's acquisition, one round trip; with FenceKey
// the reservation closes even that.

const (
	// queueSuffix is appended to a lock's name to make its roll-call key.
	queueSuffix = "\x00queue"
	// inboxInfix is put between a lock's name and a HolderID to make that
	// Lock's inbox key.
	inboxInfix = "\x00inbox\x00"
)

// Inbox messages: a kind byte, then its payload.
const (
	msgJoin    = '+' // record: queue the sender, and confirm it
	msgRejoin  = '*' // record: queue the sender; it needs no confirmation
	msgLeave   = '-' // record: the sender gave up
	msgHead    = 'H' // '1' or '2', then ids: watch the key (see toldFirst, toldSecond); the waiters ahead of you
	msgAck     = 'K' // your join is queued
	msgTurn    = 'Q' // reservation ',' releaser '\n' entries: the lock is released to you; the rest of the queue
	msgForward = 'A' // entries: queue these after the ones you have
	msgRoll    = 'E' // entries: the queue as its holder knows it (the roll-call key)
	msgExpired = 'X' // version '\n' ids: the key expired then, and you are the first waiter; if you do not wait, tell the first of ids
	msgLeft    = 'L' // id: a waiter you were told was ahead of you left the queue
)

// Entry states, as entries are encoded.
const (
	toldNothing = 0   // the waiter awaits a confirmation
	toldAck     = 'k' // confirmed
	toldFirst   = '1' // told to watch the key, as the first waiter (or it became the first): takes an expired key at once
	toldSecond  = '2' // told to watch the key behind others: tells the first of them an expiry, takes the key after coverGrace
)

// appendIDs appends ids to b, one a line (a HolderID has no newline).
func appendIDs(b []byte, ids []string) []byte {
	for i, id := range ids {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, id...)
	}
	return b
}

// parseIDs decodes appendIDs.
func parseIDs(b []byte) []string {
	var ids []string
	for f := range bytes.SplitSeq(b, []byte{'\n'}) {
		if len(f) > 0 {
			ids = append(ids, string(f))
		}
	}
	return ids
}

// expiredBody encodes a msgExpired: the version of the key's deletion (the
// store's time of it), and the waiters after the one it goes to.
func expiredBody(v hlc.Timestamp, ids []string) []byte {
	msg, _ := v.AppendText([]byte{msgExpired})
	msg = append(msg, '\n')
	return appendIDs(msg, ids)
}

// parseExpired decodes expiredBody's body (after the kind byte).
func parseExpired(body []byte) (hlc.Timestamp, []string, bool) {
	a, b, ok := bytes.Cut(body, []byte{'\n'})
	if !ok {
		return hlc.Timestamp{}, nil, false
	}
	v, err := hlc.ParseBytes(a)
	if err != nil || v.IsZero() {
		return hlc.Timestamp{}, nil, false
	}
	return v, parseIDs(b), true
}

// keyWatchers is how many waiters of a queue watch the lock's key.
const keyWatchers = 2

// watches reports whether a waiter told told watches the lock's key.
func watches(told byte) bool { return told == toldFirst || told == toldSecond }

// entry is one waiter in a queue.
type entry struct {
	id   string
	rec  []byte
	told byte
}

func appendEntries(b []byte, es []entry) []byte {
	for _, e := range es {
		b = binary.AppendUvarint(b, uint64(len(e.rec)))
		b = append(b, e.rec...)
		b = append(b, e.told)
	}
	return b
}

// parseEntries decodes appendEntries; ok is false if b is malformed.
func parseEntries(b []byte) (es []entry, ok bool) {
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || n >= uint64(len(b)-k) {
			return nil, false
		}
		rec := bytes.Clone(b[k : k+int(n)])
		told := b[k+int(n)]
		b = b[k+int(n)+1:]
		es = append(es, entry{id: ParseHolder(rec, hlc.Timestamp{}).ID, rec: rec, told: told})
	}
	return es, true
}

// linger is how long a Lock keeps its queue after a release or a wait, so
// that a Lock that locks again at once need not set it up again, and so
// that what crosses its handover reaches the next holder.
func (l *Lock) linger() time.Duration { return l.cfg.TTL }

// msgOptions: messages and the roll call are needed only while someone
// waits, so they expire (10 TTLs after, at most a day).
func (l *Lock) msgOptions() sskv.SetOptions {
	return sskv.SetOptions{Expiry: min(mulSat(l.cfg.TTL, 10), 24*time.Hour)}
}

func (l *Lock) inbox(id string) string { return l.cfg.Name + inboxInfix + id }

// queue is a Lock's part in its lock's queue.
type queue struct {
	l      *Lock
	ctx    context.Context
	cancel context.CancelFunc
	iw, ew *sskv.Watcher // its inbox, and the roll call
	exited chan struct{}
	sig    chan struct{} // capacity 1: the state changed
	wake   chan struct{} // capacity 1: lw changed, for run
	take   chan chan waitWatch

	mu      sync.Mutex
	ended   bool
	idle    *time.Timer // ends the queue after linger, while nothing uses it
	waiting bool        // a wait is under way
	// The queue this Lock keeps: while it holds, or while it is handed to it.
	entries []entry
	holds   bool
	forward string // after a handover: whom it handed the queue to
	partial bool   // it holds without the queue handed to it: a roll call is due
	// releasing: it is releasing, and hands its queue over once the key
	// is released; until then it keeps what it is told.
	releasing bool
	handTo    entry // while releasing: the first waiter, whom the release is for
	// heldToken is the token of its latest holding, which the turns it
	// sends carry: a turn from a holding no newer than it is late, and
	// its queue follows the one this Lock is in.
	heldToken hlc.Timestamp
	// relToken is the token of the holding whose release gave it the turn.
	relToken hlc.Timestamp
	// merge: it waits in another's queue while it keeps one (it lost a
	// turn, or a turn came late): it passes what it keeps to the Lock it
	// joined once that confirms it.
	merge   bool
	lastMsg hlc.Timestamp
	// As a waiter.
	joinedTo string // whom its join went to; "" when not joined
	joinedAt time.Time
	acked    bool // the join was confirmed
	head     byte // toldFirst or toldSecond while it is told to watch the key
	// ahead: while it watches the key, the waiters that were ahead of it
	// when it was told to, less those it has seen take the key since (the
	// queue is served in order): the first of them is the first waiter.
	// Once it has seen them all take the key, it is the first (toldFirst).
	ahead []string
	// expiredTold: a watcher of the key saw it expire and told this
	// waiter, the first it knows of, to take it.
	expiredTold bool
	turn        bool // the lock was released to it
	token       hlc.Timestamp
	rejoin      bool // check the lock and join again
	// The lock's key, while watched.
	lw      *sskv.Watcher
	lbox    *waitBox           // lw's events, which a FenceKey holding's guard takes over
	lcancel context.CancelFunc // ends lw
	free    bool
	held    bool // the key was seen held
	value   []byte
	version hlc.Timestamp
	unseen  time.Time // when a Resync found missing the key seen held
	changed bool
	lastSet time.Time // when the key was last seen written (or first watched)
	known   bool      // the watch has told the key's state, or an attempt found it held
	expired bool      // the key was deleted long after its last write: it expired
	keySeq  uint64    // counts what the watches of the key told
	// lookedSeq is keySeq as of the waiter's last look (state).
	lookedSeq uint64
}

// engage returns the Lock's queue, setting up its watches if needed. The
// caller has the turn.
func (l *Lock) engage(ctx context.Context) (*queue, error) {
	if q := l.q; q != nil && !q.over() {
		q.hold()
		return q, nil
	}
	qctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel) // until set up
	defer stop()
	iw, err := l.c.Watch(qctx, l.inbox(l.cfg.HolderID))
	if err != nil {
		cancel()
		return nil, err
	}
	ew, err := l.c.Watch(qctx, l.cfg.Name+queueSuffix)
	if err != nil {
		cancel()
		return nil, err
	}
	if !stop() {
		cancel()
		return nil, ctx.Err()
	}
	q := &queue{l: l, ctx: qctx, cancel: cancel, iw: iw, ew: ew,
		exited: make(chan struct{}), sig: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		take: make(chan chan waitWatch)}
	go q.run()
	l.q = q
	return q, nil
}

// over reports whether the queue's watches have ended.
func (q *queue) over() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ended
}

// hold keeps the queue while a wait or a holding uses it.
func (q *queue) hold() {
	q.mu.Lock()
	if q.idle != nil {
		q.idle.Stop()
		q.idle = nil
	}
	q.mu.Unlock()
}

// release lets the queue end after linger unless a wait takes it again.
func (q *queue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended || q.idle != nil {
		return
	}
	q.idle = time.AfterFunc(q.l.linger(), q.cancel)
}

// close ends the queue's watches and waits for its goroutine.
func (q *queue) close() {
	q.cancel()
	<-q.exited
}

func (q *queue) run() {
	defer close(q.exited)
	defer func() {
		q.mu.Lock()
		q.ended = true
		if !q.holds {
			// What it was told goes on to where it belongs.
			q.waiting = false
			q.settle()
		}
		q.mu.Unlock()
		q.unwatchKey()
		q.notify()
	}()
	// The queue decides by messages and changes: what the inbox and the
	// roll call held before it watched them (their watches' Initial
	// events) is from earlier queues, and the state of the lock's key
	// when its watch starts is read by the join (see Lock.waitQueued).
	iev, eev := q.iw.Events(), q.ew.Events()
	for {
		q.mu.Lock()
		lw, lbox := q.lw, q.lbox
		q.mu.Unlock()
		var lwake <-chan struct{}
		if lw != nil {
			lwake = lbox.wake
		}
		select {
		case ev, ok := <-iev:
			if !ok {
				return
			}
			if !ev.Initial {
				q.onInbox(ev)
			}
		case ev, ok := <-eev:
			if !ok {
				return
			}
			if !ev.Initial {
				q.onRoll(ev)
			}
		case <-lwake:
			evs, ended, _ := lbox.take()
			for _, ev := range evs {
				if !ev.Initial {
					q.onLock(lw, ev, true)
				}
			}
			if ended {
				q.onLock(lw, sskv.Event{}, false)
			}
		case <-q.wake:
		case reply := <-q.take:
			// Nothing reads lw's events from here on but its taker.
			q.mu.Lock()
			kw := waitWatch{w: q.lw, cancel: q.lcancel, box: q.lbox}
			q.lw, q.lcancel, q.lbox = nil, nil, nil
			q.mu.Unlock()
			reply <- kw
		}
	}
}

func (q *queue) notify() {
	select {
	case q.sig <- struct{}{}:
	default:
	}
}

// send writes msg into id's inbox, in the background.
func (q *queue) send(id string, msg []byte) {
	l := q.l
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
		defer cancel()
		if _, err := l.c.Set(ctx, l.inbox(id), msg, l.msgOptions()); err != nil {
			l.log.Debug("could not tell a waiter of the queue; it checks again later", "to", id, "error", err)
		}
	}()
}

// rollCall writes the queue as this holder knows it, so that the waiters
// it does not know join again. q.mu is held.
func (q *queue) rollCall() {
	l := q.l
	msg := appendEntries([]byte{msgRoll}, q.entries)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
		defer cancel()
		if _, err := l.c.Set(ctx, l.cfg.Name+queueSuffix, msg, l.msgOptions()); err != nil {
			l.log.Debug("could not call the queue's roll; its waiters check again later", "error", err)
		}
	}()
}

// onInbox handles a message to this Lock.
func (q *queue) onInbox(ev sskv.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	defer q.notify()
	if ev.Resync {
		// Messages may have been missed. A waiter checks the lock and
		// joins again (a holder keeps one place per waiter). A holder
		// waits: a join it missed was not confirmed, so its waiter watches
		// the key and joins again at the next release; a roll call would
		// send every waiter to the store at once.
		if q.waiting && !q.holds {
			q.rejoin, q.acked = true, false
		}
	}
	if ev.Op != sskv.OpSet || len(ev.Value) == 0 || !ev.Version.After(q.lastMsg) {
		return
	}
	q.lastMsg = ev.Version
	kind, body := ev.Value[0], ev.Value[1:]
	switch kind {
	case msgJoin, msgRejoin:
		id := ParseHolder(body, hlc.Timestamp{}).ID
		if id == "" || id == q.l.cfg.HolderID {
			return
		}
		told := byte(toldNothing)
		if kind == msgRejoin {
			told = toldAck
		}
		q.add([]entry{{id: id, rec: bytes.Clone(body), told: told}})
	case msgForward:
		es, ok := parseEntries(body)
		if !ok {
			return
		}
		q.add(es)
	case msgLeave:
		id := ParseHolder(body, hlc.Timestamp{}).ID
		i := slices.IndexFunc(q.entries, func(e entry) bool { return e.id == id })
		if i >= 0 {
			q.remove(i)
		} else if q.forward != "" && !q.holds {
			q.send(q.forward, ev.Value)
		}
	case msgHead:
		if len(body) >= 1 && q.waiting && !q.holds {
			q.head, q.acked, q.ahead = body[0], true, nil
			if q.head == toldSecond {
				q.ahead = parseIDs(body[1:])
			}
		}
	case msgAck:
		// Queued, and not among the watchers (a merged queue may have
		// others watch): it no longer watches the key.
		q.acked = true
		if q.waiting && !q.holds {
			q.head, q.ahead = 0, nil
		}
	case msgLeft:
		if i := slices.Index(q.ahead, string(body)); i >= 0 && q.head == toldSecond {
			q.ahead = slices.Delete(q.ahead, i, i+1)
			if len(q.ahead) == 0 {
				q.head = toldFirst // it is the first now
			}
		}
	case msgExpired:
		v, ids, ok := parseExpired(body)
		switch {
		case !ok || q.holds || q.releasing || !v.After(q.heldToken):
			// It has held the lock since: the message is late.
		case q.waiting && !q.turn:
			// The holder is gone, and this waiter is the first: it takes
			// the key at once (see Lock.waitQueued).
			q.expiredTold = true
		case !q.waiting && len(ids) > 0:
			// It no longer waits (it gave up): the next one is the
			// first.
			q.send(ids[0], expiredBody(v, ids[1:]))
		}
	case msgTurn:
		token, rel, es, ok := parseTurn(body)
		if !ok {
			return
		}
		switch {
		case q.holds:
			// It took the lock before the turn came (the release's
			// notification came first): the queue it was handed comes
			// before whoever joined it since.
			q.partial = false
		case !rel.IsZero() && !rel.After(q.heldToken):
			// The turn of a holding no newer than its own: it came after
			// this Lock had taken the key (and maybe released it). Its
			// queue goes where this Lock's goes (see settle).
			q.merge = q.waiting
		default:
			q.turn, q.token, q.relToken, q.acked, q.forward = true, token, rel, true, ""
			q.merge = false
		}
		q.entries = mergeEntries(q.l.cfg.HolderID, es, q.entries)
	}
	q.settle()
}

// remove takes the waiter at i out of the queue, which it left: a holder tells the watchers of the key behind it,
// which were told it was ahead of them, so that at an expiry they tell the
// first waiter, not one that has gone. q.mu is held.
func (q *queue) remove(i int) {
	if q.holds || q.releasing {
		for _, e := range q.entries[i+1:] {
			if watches(e.told) {
				q.send(e.id, append([]byte{msgLeft}, q.entries[i].id...))
			}
		}
	}
	q.entries = slices.Delete(q.entries, i, i+1)
}

// add appends the waiters es that are not queued yet, keeping the place of
// those that are. q.mu is held.
func (q *queue) add(es []entry) {
	for _, e := range es {
		if e.id == q.l.cfg.HolderID {
			if q.waiting && !q.holds && !q.turn {
				// Its own place, passed around while it waits (messages
				// crossed): it may have no other, so it joins again
				// rather than wait for its safeguard check.
				q.rejoin, q.acked = true, false
			}
			continue
		}
		if i := slices.IndexFunc(q.entries, func(x entry) bool { return x.id == e.id }); i >= 0 {
			if e.told == toldNothing {
				// It asks again (it may have missed what it was told):
				// tell it again, keeping its place.
				q.entries[i].told = toldNothing
			}
			continue
		}
		q.entries = append(q.entries, e)
	}
}

// mergeEntries is first, then the entries of then not in it, without self
// (a place it kept from an earlier join).
func mergeEntries(self string, first, then []entry) []entry {
	out := make([]entry, 0, len(first)+len(then))
	for _, e := range slices.Concat(first, then) {
		if e.id != self && !slices.ContainsFunc(out, func(x entry) bool { return x.id == e.id }) {
			out = append(out, e)
		}
	}
	return out
}

// parseTurn decodes a turn's body: the reservation's version (zero
// without one), the token of the holding that released, and the queue.
func parseTurn(body []byte) (token, rel hlc.Timestamp, es []entry, ok bool) {
	toks, rest, ok := bytes.Cut(body, []byte{'\n'})
	if !ok {
		return token, rel, nil, false
	}
	if es, ok = parseEntries(rest); !ok {
		return token, rel, nil, false
	}
	a, b, _ := bytes.Cut(toks, []byte{','})
	for _, t := range []struct {
		s   []byte
		out *hlc.Timestamp
	}{{a, &token}, {b, &rel}} {
		if len(t.s) == 0 {
			continue
		}
		v, err := hlc.ParseBytes(t.s)
		if err != nil {
			return token, rel, nil, false
		}
		*t.out = v
	}
	return token, rel, es, true
}

// turnBody encodes what parseTurn decodes.
func turnBody(token, rel hlc.Timestamp, es []entry) []byte {
	msg := []byte{msgTurn}
	if !token.IsZero() {
		msg, _ = token.AppendText(msg)
	}
	msg = append(msg, ',')
	if !rel.IsZero() {
		msg, _ = rel.AppendText(msg)
	}
	msg = append(msg, '\n')
	return appendEntries(msg, es)
}

// settle does what this Lock owes the entries it keeps: a holder keeps
// keyWatchers waiters watching the key and confirms the others; a waiter
// keeps them; a Lock that handed the queue on passes them on; one that
// neither holds, nor waits, nor handed on hands them the lock. q.mu is
// held.
func (q *queue) settle() {
	switch {
	case q.holds || q.releasing:
		// Two waiters watch the key. Those told to stay so until they
		// hold, and new ones are taken from the back of the queue, so that
		// a handover seldom needs a new one.
		watchers := 0
		for _, e := range q.entries {
			if watches(e.told) {
				watchers++
			}
		}
		for i := len(q.entries) - 1; i >= 0 && watchers < keyWatchers; i-- {
			if e := &q.entries[i]; !watches(e.told) {
				// It is told who is ahead of it: if the key expires, it
				// tells the first of them to take it (see onLock).
				e.told = toldSecond
				msg := []byte{msgHead, e.told}
				if i == 0 {
					e.told = toldFirst
					msg[1] = e.told
				}
				for j, a := range q.entries[:i] {
					if j > 0 {
						msg = append(msg, '\n')
					}
					msg = append(msg, a.id...)
				}
				q.send(e.id, msg)
				watchers++
			}
		}
		for i := range q.entries {
			if e := &q.entries[i]; e.told == toldNothing {
				e.told = toldAck
				q.send(e.id, []byte{msgAck})
			}
		}
	case q.waiting:
		// It keeps them: they are its queue once it takes the lock, and
		// it hands them on if it gives up. (A join may overtake the turn
		// it follows.) Once the lock is released to it, it confirms
		// them: a waiter left unconfirmed would take the key at the next
		// release, as if it had joined a holder that keeps no queue.
		if q.merge && !q.turn && q.acked && q.joinedTo != "" && q.joinedTo != "?" && len(q.entries) > 0 {
			// It waits in another's queue (it lost a turn, or a turn came
			// late): what it keeps goes there too, after the waiters
			// there, to be told their place afresh.
			for i := range q.entries {
				q.entries[i].told = toldNothing
			}
			q.send(q.joinedTo, appendEntries([]byte{msgForward}, q.entries))
			q.entries = nil
			break
		}
		if !q.turn {
			// Unconfirmed, they watch the key: if this Lock never gets
			// the lock (it waits on a Lock that waits on it, say), they
			// take it when it is free.
			break
		}
		for i := range q.entries {
			if e := &q.entries[i]; e.told == toldNothing {
				e.told = toldAck
				q.send(e.id, []byte{msgAck})
			}
		}
	case q.forward != "" && !q.turn:
		if len(q.entries) > 0 {
			q.send(q.forward, appendEntries([]byte{msgForward}, q.entries))
			q.entries = nil
		}
	case !q.waiting:
		q.handOn()
	}
}

// handOn gives the lock's turn to the first entry and the queue with it,
// and forgets the queue. q.mu is held.
func (q *queue) handOn() {
	reservation := q.token
	if !q.turn {
		reservation = hlc.Timestamp{}
	}
	q.turn, q.token = false, hlc.Timestamp{}
	var id string
	var msg []byte
	if len(q.entries) > 0 {
		// The turn it passes on came from relToken's release; else the
		// key was last released by this Lock, with the queue that
		// follows it.
		rel := q.heldToken
		if q.relToken.After(rel) {
			rel = q.relToken
		}
		id, msg = q.entries[0].id, turnBody(hlc.Timestamp{}, rel, q.entries[1:])
		q.forward, q.entries = id, nil
	}
	if reservation.IsZero() {
		if msg != nil {
			q.send(id, msg)
		}
		return
	}
	// The key is reserved for this Lock (FenceKey), which no longer
	// waits: only this Lock could take it, so it frees it first, or the
	// next waiter would wait for it to expire.
	l := q.l
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
		defer cancel()
		// With the turn: the turn may have come late, and this Lock may be
		// taking the key itself (see withTurn).
		l.withTurn(ctx, func() {
			if _, err := l.c.VDel(ctx, l.cfg.Name, l.acqRecord(), sskv.DelOptions{FencingToken: reservation}); err != nil {
				l.log.Debug("could not free the key reserved for this Lock; it expires after the TTL", "error", err)
			}
		})
		if msg == nil {
			return
		}
		if _, err := l.c.Set(ctx, l.inbox(id), msg, l.msgOptions()); err != nil {
			l.log.Debug("could not tell a waiter of the queue; it checks again later", "to", id, "error", err)
		}
	}()
}

// onRoll handles a roll call: a waiter it does not list joins again.
func (q *queue) onRoll(ev sskv.Event) {
	if ev.Op != sskv.OpSet || len(ev.Value) == 0 || ev.Value[0] != msgRoll {
		return
	}
	es, ok := parseEntries(ev.Value[1:])
	if !ok {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.waiting || q.holds || q.turn {
		return
	}
	if !slices.ContainsFunc(es, func(e entry) bool { return e.id == q.l.cfg.HolderID }) {
		q.rejoin, q.acked = true, false
		q.notify()
	}
}

// onLock logs a change of the lock's key.
func (q *queue) onLock(lw *sskv.Watcher, ev sskv.Event, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if lw != q.lw {
		return // dropped since
	}
	defer q.notify()
	if !ok {
		q.lw = nil // ended (the service refused it after a reconnect): watch again
		return
	}
	q.changed, q.known = true, true
	q.keySeq++
	if ev.Op == sskv.OpDelete {
		if ev.Resync && q.held {
			// The key may have vanished unseen (a store restart) while
			// its holder still counts on it: see Lock.
			q.unseen = time.Now()
		}
		// A release comes within a renewal interval of the last write; an
		// expiry a TTL after it.
		q.expired = time.Since(q.lastSet) > q.l.cfg.TTL/2
		q.free, q.value = true, nil
		if q.expired && !ev.Resync && !ev.Version.IsZero() && q.watchesKey() && q.head == toldSecond && len(q.ahead) > 0 {
			// The holder is gone, and the first waiter, which does not
			// watch the key, would wait for its safeguard check: tell it
			// (the other watcher tells it too). Not after a Resync: the
			// key may have vanished unseen, and the watchers hold off.
			q.send(q.ahead[0], expiredBody(ev.Version, q.ahead[1:]))
		}
		return
	}
	q.lastSet = time.Now()
	q.free, q.held = false, true
	q.value, q.version = bytes.Clone(ev.Value), ev.Version
	if len(q.ahead) > 0 {
		// A waiter ahead took the key: those before it were served (or
		// left).
		if i := slices.Index(q.ahead, ParseHolder(ev.Value, ev.Version).ID); i >= 0 {
			q.ahead = q.ahead[i+1:]
			if len(q.ahead) == 0 && q.head == toldSecond {
				q.head = toldFirst // it is the first now
			}
		}
	}
}

// watchesKey reports whether this waiter should watch the lock's key.
// q.mu is held.
func (q *queue) watchesKey() bool {
	return q.waiting && !q.holds && (q.head != 0 || !q.acked)
}

// queueState is what a waiter decides by.
type queueState struct {
	ended    bool
	watchKey bool          // it should watch the lock's key
	watching bool          // it does
	join     bool          // it should find the holder and join
	forward  string        // whom it handed the queue to, to join without a GET
	turn     bool          // the lock was released to it
	token    hlc.Timestamp // the reservation's version, with FenceKey
	reserved bool          // the lock's key holds this Lock's record: it may take it
	free     bool          // the lock's key was last seen deleted
	changed  bool          // the lock's key changed since the last look
	head     byte
	acked    bool
	expired  bool // the key expired (rather than being released)
	// expiredTold: a watcher told it the key expired, with it first.
	expiredTold bool
	joinedAt    time.Time
	known       bool // the key's state is known (see queue.known)
	stray       bool // not confirmed, and the key went to another than the one it joined
	unseen      time.Time
}

func (q *queue) state() queueState {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := queueState{
		ended:       q.ended,
		watchKey:    q.watchesKey(),
		watching:    q.lw != nil,
		join:        !q.turn && (q.joinedTo == "" || q.rejoin),
		forward:     q.forward,
		turn:        q.turn,
		token:       q.token,
		reserved:    q.lw != nil && q.value != nil && bytes.Equal(q.value, q.l.acqRecord()),
		free:        q.lw != nil && q.free,
		changed:     q.changed,
		head:        q.head,
		acked:       q.acked,
		expired:     q.expired,
		joinedAt:    q.joinedAt,
		expiredTold: q.expiredTold && q.waiting && !q.holds && !q.turn,
		known:       q.known,
		stray:       q.lw != nil && !q.acked && q.joinedTo != "" && q.value != nil && ParseHolder(q.value, q.version).ID != q.joinedTo,
		unseen:      q.unseen,
	}
	q.lookedSeq = q.keySeq
	if s.reserved {
		s.token = q.version
	}
	if q.rejoin {
		s.forward = ""
	}
	q.changed = false
	return s
}

// watchKey starts watching the lock's key, and reports whether it did.
func (q *queue) watchKey(ctx context.Context) error {
	l := q.l
	// The watch outlives the queue when a FenceKey holding takes it over
	// (see takeKeyWatch); else the queue ends it.
	wctx, cancel := context.WithCancel(context.WithoutCancel(q.ctx))
	stop := context.AfterFunc(ctx, cancel)
	// A lost answer to the KEYNOTIFY must not keep the waiter from checking
	// for the client's RequestTimeout.
	slow := time.AfterFunc(l.cfg.TTL, cancel)
	box := newWaitBox()
	w, err := l.c.Watch(wctx, l.cfg.Name, sskv.WithCallback(box.event, box.done))
	slow.Stop()
	if err == nil && !stop() {
		w.Stop()
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		return err
	}
	q.mu.Lock()
	if q.ended {
		q.mu.Unlock()
		w.Stop()
		cancel()
		return nil
	}
	q.lw, q.lbox, q.lcancel, q.changed = w, box, cancel, true
	q.keySeq++
	q.free, q.value, q.lastSet, q.known = false, nil, time.Now(), false
	q.mu.Unlock()
	q.poke()
	return nil
}

func (q *queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// unwatchKey stops watching the lock's key. It does not wait for the
// store's answer to the KEYNOTIFY STOP: ending the watch's context ends it
// in the background (a new watch of the key waits for it), so that a Lock
// that has just acquired returns without that round trip.
func (q *queue) unwatchKey() {
	q.mu.Lock()
	w, cancel := q.lw, q.lcancel
	q.lw, q.lcancel, q.lbox = nil, nil, nil
	q.mu.Unlock()
	if w != nil {
		cancel()
		q.poke()
	}
}

// takeKeyWatch takes the watch of the lock's key from the queue, for a
// FenceKey holding's guard to go on with; the zero waitWatch if there is
// none.
func (q *queue) takeKeyWatch() waitWatch {
	reply := make(chan waitWatch)
	select {
	case q.take <- reply:
		return <-reply
	case <-q.exited:
		return waitWatch{}
	}
}

// giveKeyWatch gives back a watch takeKeyWatch took, when the attempt it
// was taken for failed.
func (q *queue) giveKeyWatch(kw waitWatch) {
	q.mu.Lock()
	if q.ended || q.lw != nil {
		q.mu.Unlock()
		kw.w.Stop()
		kw.cancel()
		return
	}
	q.lw, q.lcancel, q.lbox = kw.w, kw.cancel, kw.box
	q.mu.Unlock()
	q.poke()
}

// sawHeld records that an attempt found the key held, unless the watch
// told of a change since the waiter's last look at the state (which the
// attempt was decided by): a delete that came while the attempt was under
// way may be newer than what it found, and it would wait for it forever.
func (q *queue) sawHeld() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.lw != nil && q.keySeq == q.lookedSeq {
		q.known, q.free, q.held = true, false, true
	}
}

// triedExpired records that a waiter told the key expired (msgExpired)
// tried to take it and found it held.
func (q *queue) triedExpired() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expiredTold = false
}

// startWait marks a wait under way.
func (q *queue) startWait() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = true
}

// joined records that this Lock's join went to id.
func (q *queue) joined(id string, acked bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.joinedTo, q.acked, q.rejoin, q.head, q.ahead = id, acked, false, 0, nil
	q.joinedAt = time.Now()
}

// lostTurn records that the lock released to this Lock was taken by
// someone else: it waits for the key as the first waiter.
func (q *queue) lostTurn() {
	q.mu.Lock()
	defer q.mu.Unlock()
	// It joins the new holder, and once that confirms it, passes on the
	// queue it was handed (see settle): two queues would each wait for
	// the other's key to be free.
	q.turn, q.head, q.ahead, q.acked, q.rejoin, q.merge = false, 0, nil, false, true, true
}

// acquired makes this Lock the queue's keeper: it holds the lock. partial
// tells that it took a key whose holder went without handing the queue
// over (it expired, or a holder that kept no queue released it): it calls
// the roll unless a turn comes within a grace.
func (q *queue) acquired(partial bool, token hlc.Timestamp) {
	q.mu.Lock()
	q.heldToken, q.relToken, q.merge = token, hlc.Timestamp{}, false
	q.holds, q.waiting = true, false
	q.turn, q.joinedTo, q.acked, q.head, q.rejoin, q.forward = false, "", false, 0, false, ""
	q.ahead, q.expiredTold = nil, false
	q.partial = partial
	q.settle()
	q.mu.Unlock()
	q.unwatchKey()
	if partial {
		time.AfterFunc(q.l.rollGrace(), func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			if q.holds && q.partial && !q.ended {
				q.partial = false
				q.rollCall()
			}
		})
	}
}

// rollGrace is how long a Lock that took the lock without being handed the
// queue waits for the turn to come before it calls the roll.
func (l *Lock) rollGrace() time.Duration {
	return min(max(l.cfg.TTL/5, 50*time.Millisecond), l.cfg.TTL)
}

// handOver ends this Lock's keeping of the queue, at a release: it returns
// the first waiter and the message that hands it the rest, if there is one.
func (q *queue) handOver() (first entry, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.partial {
		// Released before its roll call: call it now, or the waiters it
		// does not know would wait for their safeguard check.
		q.rollCall()
	}
	q.holds, q.partial = false, false
	// Even if its watches ended: the turn is a plain SET.
	if len(q.entries) == 0 {
		q.forward = ""
		return entry{}, false
	}
	q.releasing, q.handTo = true, q.entries[0]
	return q.entries[0], true
}

// handOnKept hands on the queue this Lock still keeps from a holding that
// ended without a release that handed it over: the holding was lost, and
// Unlock was not called, or could not reach the store. Its first waiter is
// sent the turn, as after a release, and takes the key when it is free (or
// merges the queue into its own, if it took the key meanwhile). A Lock that
// waited again while counting itself the keeper would take the turns it is
// sent for its own queue's business, and never the lock. The caller has the
// turn, and the Lock does not hold.
func (q *queue) handOnKept() {
	q.mu.Lock()
	holds := q.holds
	q.mu.Unlock()
	if !holds {
		return
	}
	if _, ok := q.handOver(); ok {
		q.sendTurn(hlc.Timestamp{})
	}
}

// sendTurn hands the queue to its first waiter, after the release, with
// the reservation's version (zero without one).
func (q *queue) sendTurn(token hlc.Timestamp) {
	if id, msg := q.turnMsg(token); msg != nil {
		q.send(id, msg)
	}
}

// turnMsg returns the first waiter and the message that hands it the
// lock and the rest of the queue, and forgets the queue; nil if there is
// nobody to hand it to.
func (q *queue) turnMsg(token hlc.Timestamp) (string, []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.releasing && !token.IsZero() {
		// The turn goes to the waiter the reservation names, whatever
		// came in meanwhile (a late turn's queue, which goes first).
		q.entries = mergeEntries(q.l.cfg.HolderID, []entry{q.handTo}, q.entries)
	}
	q.releasing, q.handTo = false, entry{}
	if len(q.entries) == 0 {
		return "", nil
	}
	first := q.entries[0]
	msg := turnBody(token, q.heldToken, q.entries[1:])
	q.forward, q.entries = first.id, nil
	q.acked = true // it may join first.id again without watching the key
	return first.id, msg
}

// leave ends this Lock's wait without the lock: it tells the Lock it
// joined, or hands on the queue it was handed.
func (q *queue) leave() {
	q.mu.Lock()
	waiting := q.waiting
	q.waiting = false
	if waiting && !q.holds {
		switch {
		case q.turn || len(q.entries) > 0:
			q.handOn() // nothing to hand on with the turn alone: the key is free
		case q.joinedTo != "" && q.joinedTo != "?":
			q.send(q.joinedTo, append([]byte{msgLeave}, q.l.acqRecord()...))
		}
		q.turn, q.joinedTo, q.acked, q.head, q.rejoin, q.merge = false, "", false, 0, false, false
		q.ahead, q.expiredTold = nil, false
	}
	q.mu.Unlock()
	q.unwatchKey()
}
