package localstore

import (
	"bytes"
	"crypto/sha256"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// How the store keeps persisted keys (see Config.Persist):
//
//   - A SET that persists its key (every SET in PersistAll; in
//     PersistDynamic one with aio-persistence: true) queues the key's
//     record for disk; a SET that does not, of a key on disk, and a DEL,
//     VDEL or expiry of one, queue its deletion from disk. A persisted
//     key's record holds its value, version, fencing token, owner and PX
//     deadline as a wall-clock time.
//   - The answer to a request, and its PUBACK, go out only once every write
//     queued when it was executed is durable: its own, and those it may
//     have seen (a GET of a value not yet on disk waits for it too); so do
//     the notifications of a change (see drain).
//     Requests are executed, and their changes queued, under the store's
//     lock; one goroutine commits all that is queued in one synced
//     transaction (group commit), so answers wait about one commit and the
//     store does not.
//   - A failed commit (a full disk) undoes its writes, and those queued
//     after it, in memory, latest first, and their requests get
//     MsgPersistFailed. Watchers get the write's notification, then one of
//     the key as it is again.
//   - No version the store issued, persisted or not, is at or below one
//     it issued before a restart: the disk holds a high-water mark of
//     versions that is always ahead of the clock (see persister.nextHWM),
//     and the clock restarts above it (hlc.WithFloor).

// persists reports whether a SET, with aio-persistence: true or not
// (asked), puts its key on disk.
func (s *Server) persists(asked bool) bool {
	switch s.cfg.Persist {
	case PersistAll:
		return s.persist != nil
	case PersistDynamic:
		return s.persist != nil && asked
	}
	return false
}

// snapshot returns key, in slot i (-1: absent), as it is now. The caller
// holds s.mu.
func (s *Server) snapshot(key []byte, i int) keyState {
	st := keyState{key: bytes.Clone(key)}
	if i < 0 {
		return st
	}
	st.present = true
	st.value = bytes.Clone(s.tab.value(i))
	st.version = s.tab.version(i)
	st.owner = s.tab.owner(i)
	st.fence = s.tab.fence(i)
	st.deadline = s.tab.deadline(i)
	st.persisted = s.tab.persisted(i)
	return st
}

// logPut queues the record of slot i for disk. The caller holds s.mu.
func (s *Server) logPut(i int, undo keyState) *batch {
	r := diskRecord{
		key:     s.tab.key(i),
		value:   s.tab.value(i),
		version: s.tab.version(i),
		fence:   s.tab.fence(i),
		owner:   s.tab.owner(i),
	}
	if d := s.tab.deadline(i); d != 0 {
		r.deadline = time.Now().Add(s.tab.untilDeadline(d)).UnixNano()
	}
	return s.persist.add(diskOp{id: sha256.Sum256(r.key), record: encodeRecord(r), undo: undo})
}

// logDelete queues the deletion of key from disk. The caller holds s.mu.
func (s *Server) logDelete(key []byte, undo keyState) *batch {
	return s.persist.add(diskOp{id: sha256.Sum256(key), undo: undo})
}

// loadRecord puts a key read from disk in the table (before Start serves).
func (s *Server) loadRecord(r diskRecord) error {
	var deadline int64
	if r.deadline != 0 {
		deadline = s.tab.deadlineAfter(time.Until(time.Unix(0, r.deadline)))
	}
	r.version.Node = s.cfg.NodeID
	i := s.tab.insert(bytes.Clone(r.key), r.value, r.owner, r.version, deadline)
	if !r.fence.IsZero() {
		s.tab.raiseFence(i, r.fence)
	}
	s.tab.setPersisted(i, true)
	return nil
}

// restoreKey puts a key back as it was before a write whose commit failed,
// and tells its watchers. The caller holds s.mu.
func (s *Server) restoreKey(st *keyState) {
	i := s.tab.find(st.key)
	if i >= 0 {
		s.tab.remove(i)
	}
	if !st.present {
		if i >= 0 {
			s.notifyDelete(string(st.key))
		}
		return
	}
	i = s.tab.insert(st.key, st.value, st.owner, st.version, st.deadline)
	if !st.fence.IsZero() {
		s.tab.raiseFence(i, st.fence)
	}
	s.tab.setPersisted(i, st.persisted)
	if st.deadline != 0 && st.deadline < s.expiryAt {
		s.expiryAt = st.deadline
		s.kickExpiry()
	}
	s.notifySet(i)
}

// removeSlot deletes slot i, from disk too if it is there, and returns the
// batch that does (nil: none). The caller holds s.mu.
func (s *Server) removeSlot(i int) *batch {
	if s.persist == nil || !s.tab.persisted(i) {
		s.tab.remove(i)
		return nil
	}
	key := bytes.Clone(s.tab.key(i))
	undo := s.snapshot(key, i)
	s.tab.remove(i)
	return s.logDelete(key, undo)
}

// durableAfter returns the batch a request's answer must wait for: the
// newest not yet durable, which holds the request's own write, if it made
// one, or writes it may have seen; nil when nothing is pending. The caller
// holds s.mu.
func (s *Server) durableAfter() *batch {
	if s.persist == nil {
		return nil
	}
	return s.persist.pending()
}

// answerDurable answers a request once res.wait is durable, from a
// goroutine of its own: the connection's next requests are read and
// executed meanwhile, so that requests in flight share commits. The
// request's PUBACK waits too (see deadlineConn.Write), and so do the
// PUBACKs after it, which go out in order.
func (s *Server) answerDurable(cl *mqtt.Client, topic string, corr []byte, res result) {
	b := res.wait
	dc, _ := cl.Net.Conn.(*deadlineConn)
	if dc != nil {
		dc.ackWait.Store(b)
	}
	corr = bytes.Clone(corr)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		<-b.done
		if b.failedFor(res.key) {
			res = errResult(MsgPersistFailed)
		}
		if !s.closed.Load() {
			s.answer(cl, topic, corr, res)
		}
		if dc != nil {
			dc.releaseDurable()
		}
	}()
}
