package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// The semaphore's record: its limit, read or watched.

// readLimit returns the record's limit, writing the record first if it is
// missing and Config.Limit is set, and whether the record's watch told it
// (then nothing was sent). An active participant watches the record (see
// recordWatch); the others, and one whose watch tells no valid record,
// read it.
//
// Each request waits at most RenewDeadline for its answer, as an
// acquisition does: a lost answer must not hold the caller up for the
// client's RequestTimeout.
func (s *Semaphore) readLimit(ctx context.Context) (int, bool, error) {
	if r := s.watchRecord(ctx); r != nil {
		if n := r.told(); n > 0 {
			n, err := s.agree(n)
			return n, true, err
		}
	}
	n, err := s.getLimit(ctx)
	return n, false, err
}

// getLimit is readLimit by GET (and SET NX).
func (s *Semaphore) getLimit(ctx context.Context) (int, error) {
	for range 3 {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RenewDeadline)
		res, err := s.c.Get(rctx, s.cfg.Name)
		cancel()
		if err != nil {
			return 0, s.wrap("read the limit", err)
		}
		if res.Found {
			n, ok := parseSemaphoreRecord(res.Value)
			if !ok {
				return 0, s.wrap("read the limit", fmt.Errorf("%w: the key %q holds %q, not a semaphore's record", ErrLimitMismatch, s.cfg.Name, res.Value))
			}
			return s.agree(n)
		}
		if s.cfg.Limit == 0 {
			return 0, s.wrap("", ErrNoLimit)
		}
		rctx, cancel = context.WithTimeout(ctx, s.cfg.RenewDeadline)
		_, err = s.c.Set(rctx, s.cfg.Name, SemaphoreRecord(s.cfg.Limit), sskv.SetOptions{Condition: sskv.IfNotExists})
		cancel()
		if err != nil {
			return 0, s.wrap("write the limit", err)
		}
		// Applied or not, read it back: another participant may have
		// written another limit first.
	}
	return 0, s.wrap("read the limit", errors.New("the record keeps vanishing"))
}

// agree notes n, the record's limit, and checks that this participant's
// Limit is the same (or zero).
func (s *Semaphore) agree(n int) (int, error) {
	s.mu.Lock()
	s.limit = n
	s.mu.Unlock()
	if s.cfg.Limit != 0 && s.cfg.Limit != n {
		return 0, s.wrap("", &limitError{want: s.cfg.Limit, record: n})
	}
	return n, nil
}

// errRecordChanged: the record's watch told another record while a slot
// was taken under the limit it told before; the slot was released (keep).
var errRecordChanged = errors.New("lock: the semaphore's record changed")

// keep records the holding of slot i, just taken under the limit n. If the
// record's watch told n (told) and tells another state now (the record
// changed, or vanished, or the watch ended), the limit may be stale: keep
// releases the slot and returns errRecordChanged, and the caller reads the
// record again. The client calls the watch with each notification before
// it reads further answers, so this sees a change notified before the
// slot's answer (one made while the participant was paused, say). A change
// in the moment before the slot was taken can go unseen, as it could
// between a read of the record and the slot's SET. The caller has the
// turn.
func (s *Semaphore) keep(ctx context.Context, i, n int, told bool) error {
	if told && (s.rec == nil || s.rec.told() != n) {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RenewDeadline/4)
		defer cancel()
		if err := s.slots[i].Unlock(uctx); err != nil {
			s.log.Debug("could not release a slot taken under a stale limit; it expires after the TTL", "slot", i, "error", err)
		}
		return errRecordChanged
	}
	s.setHolding(i)
	return nil
}

// recordWatch is an active participant's watch of the semaphore's record:
// its limit, as the watch last told it, stands for a read of the record.
// A participant comes back within a TTL of its last holding or wait when
// it acquires in a loop: the watch saves it a GET of the record at each
// acquisition. It starts with such an acquisition, whose read of the
// record it makes (a KEYNOTIFY and a GET in place of the GET), and ends a
// TTL after the participant's turn was last taken while it holds nothing
// (a KEYNOTIFY STOP), or at Close. The record never changes by itself, so
// the watch is told nothing, and sends nothing, while it lasts, but a
// change of the record (its deletion to change the limit, or its loss
// with a store restart, which the client's resync tells) is known at once.
type recordWatch struct {
	w *sskv.Watcher // set once Watch has returned; read with the turn
	// conn is the connection the watch was synced on: after a reconnect,
	// it may tell a stale record until the client's resync of it is over,
	// and it is not used (see watchRecord).
	conn *sskv.Conn

	mu    sync.Mutex
	limit int  // the record's limit, as told last; 0: missing, not a record, or not told yet
	ended bool // the watch has ended: it tells nothing any more
}

// event is the watch's callback.
func (r *recordWatch) event(ev sskv.Event) {
	n := 0
	if ev.Op == sskv.OpSet {
		n, _ = parseSemaphoreRecord(ev.Value)
	}
	r.mu.Lock()
	r.limit = n
	r.mu.Unlock()
}

// end is the watch's done callback.
func (r *recordWatch) end(error) {
	r.mu.Lock()
	r.limit, r.ended = 0, true
	r.mu.Unlock()
}

// told returns the record's limit as the watch tells it now: 0 if it tells
// none.
func (r *recordWatch) told() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limit
}

func (r *recordWatch) isEnded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// watchRecord returns the watch of the record, started now if the
// participant is active and has none; nil if it is not, or if the watch
// could not start. The caller has the turn.
func (s *Semaphore) watchRecord(ctx context.Context) *recordWatch {
	if s.rec != nil && !s.rec.isEnded() {
		if s.rec.conn == s.connNow() {
			return s.rec
		}
		// A reconnect since the watch was synced: until the client's
		// resync of it is over, it may still tell what the record was
		// before. A new watch starts synced on the current connection.
		s.stopRecordWatch()
	}
	s.rec = nil
	if s.recOff || !s.active() {
		return nil
	}
	r := &recordWatch{conn: s.connNow()}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RenewDeadline)
	defer cancel()
	w, err := s.c.Watch(rctx, s.cfg.Name, sskv.WithCallback(r.event, r.end), sskv.Detached())
	if err != nil {
		s.recOff = lease.Refused(err)
		s.log.Debug("cannot watch the semaphore's record; reading it", "error", err)
		return nil
	}
	r.w, s.rec = w, r
	if r.conn == nil || r.conn != s.connNow() {
		// Synced on another connection than the one it started on, or
		// on none known: not to be trusted (see above).
		s.stopRecordWatch()
		return nil
	}
	return r
}

// connNow returns the client's current connection, or nil if there is
// none.
func (s *Semaphore) connNow() *sskv.Conn {
	cn, _ := lease.ConnNow(s.c)
	return cn
}

// stopRecordWatch ends the watch of the record, if any. The caller has the
// turn.
func (s *Semaphore) stopRecordWatch() {
	if s.rec != nil {
		s.rec.w.Stop()
		s.rec = nil
	}
}

// idleEnd is the idle timer's: it ends the watch of the record a TTL after
// the turn was last taken, unless the participant holds a slot (then it
// looks again a TTL later) or has the turn (whose end sets the timer again).
func (s *Semaphore) idleEnd() {
	done := make(chan struct{})
	s.mu.Lock()
	s.idling = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.idling = nil
		s.mu.Unlock()
		close(done)
	}()
	select {
	case s.turn <- struct{}{}:
	default:
		return
	}
	defer func() { <-s.turn }()
	if cur := s.current(); cur != nil && cur.held() {
		s.idle.Reset(s.cfg.TTL)
		return
	}
	s.stopRecordWatch()
}
