package localstore

import (
	"bytes"
	"strings"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// request is one parsed state store request.
type request struct {
	args     [][]byte
	ts       string // raw __ts
	hasTS    bool
	ft       string // raw __ft
	hasFT    bool
	persist  bool // aio-persistence: true
	clientID string
	user     string
}

// result is what a request produced: the response payload and the version to
// send as __ts (zero: no __ts), and the writes to disk it is answered after
// (nil: none; see persistkeys.go).
type result struct {
	payload []byte
	version hlc.Timestamp
	wait    *batch
	key     string // the request's key, set with wait: should wait fail, whether the request saw an undone write
}

func errResult(msg string) result {
	return result{payload: resp.AppendError(nil, msg)}
}

var (
	okPayload         = resp.AppendSimple(nil, "OK")
	notAppliedPayload = resp.AppendInt(nil, -1)
	zeroPayload       = resp.AppendInt(nil, 0)
	onePayload        = resp.AppendInt(nil, 1)
	nullPayload       = resp.AppendNull(nil)
)

// setOptions are the parsed options of a SET.
type setOptions struct {
	nx, nex bool
	px      time.Duration
}

// parseSetOptions parses the options after SET key value.
func parseSetOptions(opts [][]byte) (setOptions, bool) {
	var o setOptions
	for i := 0; i < len(opts); i++ {
		switch string(opts[i]) {
		case "NX":
			if o.nx || o.nex {
				return o, false
			}
			o.nx = true
		case "NEX":
			if o.nx || o.nex {
				return o, false
			}
			o.nex = true
		case "PX":
			if o.px != 0 || i+1 >= len(opts) {
				return o, false
			}
			i++
			ms, ok := parseMillis(opts[i])
			if !ok {
				return o, false
			}
			o.px = time.Duration(ms) * time.Millisecond
		default:
			return o, false
		}
	}
	return o, true
}

// maxMillis keeps PX within what a time.Duration can hold.
const maxMillis = int64(1<<63-1) / int64(time.Millisecond)

// parseMillis parses a positive whole number of milliseconds.
func parseMillis(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
		if n > maxMillis {
			return 0, false
		}
	}
	return n, n > 0
}

// arity checks the number of arguments of a known verb. It returns false for
// an unknown verb.
func arity(verb string, n int) (known, ok bool) {
	switch verb {
	case "SET":
		return true, n >= 3 && n <= 6
	case "GET", "DEL":
		return true, n == 2
	case "VDEL":
		return true, n == 3
	case "KEYNOTIFY":
		return true, n == 2 || n == 3
	}
	return false, false
}

// execute runs one request. The caller holds s.mu; notifications produced by
// the request are published before execute returns, so every watcher sees the
// changes of a key in version order.
func (s *Server) execute(cl clientRef, req *request) result {
	verb := string(req.args[0])
	known, ok := arity(verb, len(req.args))
	if !known {
		return errResult(wire.MsgUnknownCommand)
	}
	if !ok {
		return errResult(wire.MsgWrongArgs)
	}
	key := req.args[1]

	var setOpts setOptions
	switch verb {
	case "SET":
		if setOpts, ok = parseSetOptions(req.args[3:]); !ok {
			return errResult(wire.MsgSyntaxError)
		}
	case "KEYNOTIFY":
		if len(req.args) == 3 && string(req.args[2]) != "STOP" {
			return errResult(wire.MsgSyntaxError)
		}
	}

	// Timestamps: __ts is required on SET; any __ts or __ft that is present
	// must parse and must not be too far ahead of the store's clock.
	var ts hlc.Timestamp
	if !req.hasTS {
		if verb == "SET" {
			return errResult(wire.MsgMissingTimestamp)
		}
	} else {
		var err error
		if ts, err = hlc.Parse(req.ts); err != nil {
			return errResult(wire.MsgMalformedTS)
		}
		if s.clock.CheckDrift(ts) != nil {
			return errResult(wire.MsgTimestampSkew)
		}
	}
	var ft hlc.Timestamp
	if req.hasFT {
		var err error
		if ft, err = hlc.Parse(req.ft); err != nil {
			return errResult(wire.MsgMalformedTS)
		}
		if s.clock.CheckDrift(ft) != nil {
			return errResult(wire.MsgFencingSkew)
		}
	}

	if len(key) == 0 {
		return errResult(wire.MsgKeyLengthZero)
	}
	if !s.keyAllowed(req.user, key) {
		return errResult(wire.MsgNotAuthorized)
	}

	// A key past its deadline is expired before the request takes its
	// version, so that the DELETE notification of the expiry carries an
	// earlier time than whatever the request does to the key. Liveness is
	// decided here once: the verbs below work on slot i.
	i := s.live(key)

	// The request is valid: it is an event for the store's clock.
	now, err := s.tick(req.hasTS, ts)
	if err != nil {
		return s.clockError(err)
	}

	switch verb {
	case "SET":
		return s.set(i, req.user, key, req.args[2], setOpts, req.hasFT, ft, now, s.persists(req.persist))
	case "GET":
		if i < 0 {
			return result{payload: nullPayload}
		}
		v := s.tab.value(i)
		return result{payload: resp.AppendBulk(make([]byte, 0, len(v)+16), v), version: s.tab.version(i)}
	case "DEL":
		return s.del(i, nil, req.hasFT, ft)
	case "VDEL":
		return s.del(i, req.args[2], req.hasFT, ft)
	default: // KEYNOTIFY
		if len(req.args) == 3 {
			if s.unwatch(cl.id, string(key)) {
				return result{payload: okPayload}
			}
			return result{payload: zeroPayload}
		}
		if len(key) > wire.MaxNotifyKey(cl.id) {
			// Its notifications could not be sent: their topic would be
			// longer than MQTT allows. A key size quota.
			s.log.Warn("refused KEYNOTIFY: key too long to notify of", "client", cl.id, "bytes", len(key), "limit", wire.MaxNotifyKey(cl.id))
			return errResult(wire.MsgQuotaExceeded)
		}
		if !s.watch(cl, key) {
			return errResult(wire.MsgQuotaExceeded)
		}
		return result{payload: okPayload}
	}
}

// tick advances the store's clock for a request: Update with the request's
// __ts when it has one, Now otherwise.
func (s *Server) tick(hasTS bool, ts hlc.Timestamp) (hlc.Timestamp, error) {
	if hasTS {
		return s.clock.Update(ts)
	}
	return s.clock.Now(), nil
}

// clockError reports a failed clock update. The request's own __ts passed
// CheckDrift above, so the update fails only when the store's clock is itself
// more than MaxDrift ahead of its wall clock, after the wall clock stepped
// back: that is the store's problem, not the request's, and the message says
// so. (A __ts right at the drift limit whose counter overflows moves the
// wall 1 ms further and fails too; then the request is to blame.)
func (s *Server) clockError(err error) result {
	if s.clock.CheckDrift(s.clock.Peek()) == nil {
		return errResult(wire.MsgTimestampSkew)
	}
	s.log.Warn("refused request: the store's clock is ahead of its wall clock", "error", err)
	return errResult(MsgClockAhead)
}

// fenceCheck applies the fencing rules of the key in slot i (-1: none) to a write.
func fenceCheck(t *table, i int, hasFT bool, ft hlc.Timestamp) (string, bool) {
	if i < 0 {
		return "", true
	}
	fence := t.fence(i)
	if fence.IsZero() {
		return "", true
	}
	if !hasFT {
		return wire.MsgFencingRequired, false
	}
	if ft.Compare(fence) < 0 {
		return wire.MsgFencingLower, false
	}
	return "", true
}

// set runs SET for user on key, whose live slot is i (-1 when absent).
// persist: the SET puts the key on disk (see Server.persists).
func (s *Server) set(i int, user string, key, value []byte, o setOptions, hasFT bool, ft, version hlc.Timestamp, persist bool) result {
	if s.cfg.MaxKeySize > 0 && len(key) > s.cfg.MaxKeySize ||
		s.cfg.MaxValueSize > 0 && len(value) > s.cfg.MaxValueSize {
		return errResult(wire.MsgQuotaExceeded)
	}
	if msg, ok := fenceCheck(s.tab, i, hasFT, ft); !ok {
		return errResult(msg)
	}
	if i >= 0 && (o.nx || o.nex && !bytes.Equal(s.tab.value(i), value)) {
		return result{payload: notAppliedPayload, version: s.tab.version(i)}
	}
	if !s.withinQuota(i, user, key, value) {
		return errResult(wire.MsgQuotaExceeded)
	}
	// The version is issued: the high-water mark on disk must cover it
	// first (see persistkeys.go).
	if s.persist != nil {
		if err := s.persist.raiseHWM(version.Wall); err != nil {
			s.log.Error("refused SET: could not persist the high-water mark of versions", "error", err)
			return errResult(MsgPersistFailed)
		}
	}
	logged := persist || i >= 0 && s.persist != nil && s.tab.persisted(i)
	var undo keyState
	if logged {
		undo = s.snapshot(key, i)
	}
	var deadline int64
	if o.px > 0 {
		deadline = s.tab.deadlineAfter(o.px)
	}
	if i < 0 {
		i = s.tab.insert(key, value, user, version, deadline)
	} else {
		s.tab.update(i, value, version, deadline)
	}
	if hasFT {
		s.tab.raiseFence(i, ft)
	}
	if logged {
		// A SET that does not persist its key takes it off disk: the key
		// must not come back with an older value after a restart.
		s.tab.setPersisted(i, persist)
		if persist {
			s.logPut(i, undo)
		} else {
			s.logDelete(key, undo)
		}
	}
	if deadline != 0 && deadline < s.expiryAt {
		// Only a deadline before the one the expiry loop sleeps until
		// wakes it: a renewal moves a deadline later, and the loop finds
		// the next one when it wakes.
		s.expiryAt = deadline
		s.kickExpiry()
	}
	s.notifySet(i)
	return result{payload: okPayload, version: version}
}

// withinQuota reports whether a SET of value on key by user, whose live
// slot is i (-1: the SET creates it, for user), keeps within MaxKeys and
// the quotas of the key's owner. A SET that does not grow what its owner
// uses is always allowed, so that an owner over a quota lowered since can
// still update, and shrink, its keys.
func (s *Server) withinQuota(i int, user string, key, value []byte) bool {
	owner, keys, grow := user, 1, int64(len(key)+len(value))
	if i >= 0 {
		owner, keys, grow = s.tab.owner(i), 0, grow-s.tab.size(i)
	}
	u := s.tab.usage(owner)
	switch {
	case keys > 0 && s.cfg.MaxKeys > 0 && s.tab.len() >= s.cfg.MaxKeys,
		keys > 0 && s.cfg.MaxKeysPerUser > 0 && u.keys >= s.cfg.MaxKeysPerUser,
		grow > 0 && s.cfg.MaxBytesPerUser > 0 && u.bytes+grow > s.cfg.MaxBytesPerUser:
		return false
	}
	return true
}

// del runs DEL (value == nil) and VDEL on the live slot i (-1 when absent).
func (s *Server) del(i int, value []byte, hasFT bool, ft hlc.Timestamp) result {
	if i < 0 {
		return result{payload: zeroPayload}
	}
	if msg, ok := fenceCheck(s.tab, i, hasFT, ft); !ok {
		return errResult(msg)
	}
	version := s.tab.version(i)
	if value != nil && !bytes.Equal(s.tab.value(i), value) {
		return result{payload: notAppliedPayload, version: version}
	}
	key := string(s.tab.key(i))
	s.removeSlot(i)
	s.notifyDelete(key)
	return result{payload: onePayload, version: version}
}

// live returns the slot of key unless it is missing or past its deadline
// (then -1); a key found past its deadline is expired now, so that no read
// sees a value whose lease has run out even if the expiry timer has not
// fired yet.
func (s *Server) live(key []byte) int {
	i := s.tab.find(key)
	if i < 0 {
		return -1
	}
	if d := s.tab.deadline(i); d != 0 && s.tab.now() >= d {
		k := string(s.tab.key(i))
		s.removeSlot(i)
		s.notifyDelete(k)
		return -1
	}
	return i
}

// keyAllowed applies the per-user key-prefix ACL.
func (s *Server) keyAllowed(user string, key []byte) bool {
	if s.cfg.KeyPrefixes == nil {
		return true
	}
	for _, p := range s.cfg.KeyPrefixes[user] {
		if strings.HasPrefix(string(key), p) {
			return true
		}
	}
	return false
}
