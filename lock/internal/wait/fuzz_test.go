package wait

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// The queue's messages, its roll call and the records in lock keys come
// from the store, where any client may have written them: their parsers
// must take any bytes without panicking, and read back what the encoders
// write.

// FuzzQueueMessages feeds arbitrary bytes to every parser of what Locks
// and Semaphores read from the store.
func FuzzQueueMessages(f *testing.F) {
	ts := hlc.Timestamp{Wall: 1795695934356, Counter: 1, Node: "statestore"}
	es := []entry{{rec: []byte("a\n~0123456789abcdef\n"), told: toldFirst}, {rec: []byte("b"), told: toldAck}}
	f.Add(turnBody(ts, ts, es)[1:])
	f.Add(appendEntries(nil, es))
	f.Add(expiredBody(ts, []string{"a", "b"})[1:])
	f.Add([]byte("holder\n001795695934356:00001:statestore\nvalue"))
	f.Add([]byte(",\n"))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, ok := parseEntries(b); ok {
			if again, ok := parseEntries(appendEntries(nil, got)); !ok || len(again) != len(got) {
				t.Fatalf("entries %q do not read back", b)
			}
		}
		if token, rel, got, ok := parseTurn(b); ok {
			t2, r2, again, ok := parseTurn(turnBody(token, rel, got)[1:])
			if !ok || t2 != token || r2 != rel || len(again) != len(got) {
				t.Fatalf("turn %q does not read back", b)
			}
		}
		if v, ids, ok := parseExpired(b); ok {
			v2, again, ok := parseExpired(expiredBody(v, ids)[1:])
			if !ok || v2 != v || !slices.Equal(again, ids) {
				t.Fatalf("expiry %q does not read back", b)
			}
		}
		if v, rec, ok := parseRelay(b); ok {
			v2, again, ok := parseRelay(relayBody(v, rec)[1:])
			if !ok || v2 != v || !bytes.Equal(again, rec) {
				t.Fatalf("relayed leave %q does not read back", b)
			}
		}
	})
}

// FuzzQueueStep feeds arbitrary inbox messages and roll calls to the
// queue's state machine in each of its roles: it never panics, and keeps
// its invariants (a forged message can cost time, never two holders: that
// rests on the store, see docs/design/queue.md 6a).
func FuzzQueueStep(f *testing.F) {
	ts := hlc.Timestamp{Wall: 1795695934356, Counter: 1, Node: "statestore"}
	es := []entry{{id: "a", rec: []byte("a"), told: toldFirst}, {id: "me", rec: []byte("me"), told: toldAck}}
	f.Add(uint8(0), uint8(0), turnBody(ts, ts, es))
	f.Add(uint8(1), uint8(5), []byte("+a"))
	f.Add(uint8(2), uint8(6), []byte("H2a\nb"))
	f.Add(uint8(0), uint8(9), expiredBody(ts, []string{"a"}))
	f.Add(uint8(3), uint8(7), relayBody(ts, []byte("a")))
	f.Add(uint8(0), uint8(4), appendEntries([]byte{msgRoll}, es))
	f.Fuzz(func(t *testing.T, keeper, waiter uint8, msg []byte) {
		c := &qcore{self: "me", rec: []byte("me"), ttl: time.Second, fenceKey: keeper%2 == 0}
		c.keeper = keeperRole(keeper % 4)
		c.w.role = waiterRole(waiter % 10)
		if c.holds() {
			c.w.role = waitNone
		}
		if c.w.role == waitSecond {
			c.w.ahead = []string{"a"}
		}
		c.entries = slices.Clone(es[:1])
		now := time.Unix(1795695934, 0)
		for i, kind := range []qevKind{evInbox, evRoll, evInbox} {
			_ = c.step(now, qevent{kind: kind, value: msg, version: hlc.Timestamp{Wall: ts.Wall + int64(i), Node: "statestore"}})
			_ = c.next(now)
			if c.holds() && c.waiting() {
				t.Fatalf("holds and waits after %q", msg)
			}
			if c.w.role == waitSecond && len(c.w.ahead) == 0 {
				t.Fatalf("second with nobody ahead after %q", msg)
			}
		}
	})
}
