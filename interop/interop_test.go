package interop

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/protocol/hlc"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
	sserrors "github.com/Azure/iot-operations-sdks/go/services/statestore/errors"
)

// Error messages as the real service sends them after "-ERR ", copied byte
// for byte from docs/protocol.md (not from the SDK, so that a
// mismatch between the two would show).
const (
	wireFencingRequired = "a fencing token is required for this request"
	wireFencingLower    = "the request fencing token is a lower version than the fencing token protecting the resource"
)

// wantServiceError checks err the way an SDK user would: errors.Is against
// statestore.ErrService, errors.As to statestore.ServiceError, and the text.
func wantServiceError(t *testing.T, op string, err error, want string, sdkConst sserrors.Service) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: succeeded, want service error %q", op, want)
		return
	}
	if !errors.Is(err, statestore.ErrService) {
		t.Errorf("%s: error %v (%T) is not a statestore.ErrService; want service error %q", op, err, err, want)
	}
	var se statestore.ServiceError
	if !errors.As(err, &se) {
		t.Errorf("%s: error %v (%T) is not a statestore.ServiceError", op, err, err)
		return
	}
	if string(se) != want {
		t.Errorf("%s: service error message\n got %q\nwant %q (docs/protocol.md, byte for byte)", op, string(se), want)
	}
	if se != sdkConst {
		t.Errorf("%s: service error %q != SDK constant %q", op, string(se), string(sdkConst))
	}
}

func mustVersion(t *testing.T, what string, v hlc.HybridLogicalClock) {
	t.Helper()
	if v.IsZero() {
		t.Errorf("%s: no version (response without __ts)", what)
	}
}

// newer reports a.Compare(b) > 0 with a readable failure.
func wantNewer(t *testing.T, what string, a, b hlc.HybridLogicalClock) {
	t.Helper()
	if a.Compare(b) <= 0 {
		t.Errorf("%s: version %v is not strictly newer than %v", what, a, b)
	}
}

func wantSame(t *testing.T, what string, a, b hlc.HybridLogicalClock) {
	t.Helper()
	if a.Compare(b) != 0 {
		t.Errorf("%s: version %v, want %v", what, a, b)
	}
}

func TestCRUD(t *testing.T) {
	e := newEnv(t)
	c := e.newClient("crud")
	ctx := e.ctx
	key := e.key("k")

	t.Run("GetMissing", func(t *testing.T) {
		r, err := c.ss.Get(ctx, e.key("missing"))
		if err != nil {
			t.Fatalf("Get of a missing key: %v", err)
		}
		if r.Value != "" || !r.Version.IsZero() {
			t.Errorf("Get of a missing key = {Value:%q Version:%v}, want zero (no __ts on a miss)", r.Value, r.Version)
		}
	})

	before, err := c.app.GetHLC()
	if err != nil {
		t.Fatal(err)
	}
	s1, err := c.ss.Set(ctx, key, "v1")
	if err != nil {
		t.Fatalf("Set v1: %v", err)
	}
	if !s1.Value {
		t.Fatalf("Set v1: not applied")
	}
	mustVersion(t, "Set v1", s1.Version)
	// The request's __ts came from this client's HLC after `before`; the
	// version must be strictly greater than the request's __ts.
	wantNewer(t, "Set v1 version vs client clock before the request", s1.Version, before)

	g1, err := c.ss.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get after Set v1: %v", err)
	}
	if g1.Value != "v1" {
		t.Errorf("Get after Set v1 = %q, want %q", g1.Value, "v1")
	}
	wantSame(t, "Get after Set v1 (stored version)", g1.Version, s1.Version)

	s2, err := c.ss.Set(ctx, key, "v2")
	if err != nil || !s2.Value {
		t.Fatalf("Set v2 = %+v, %v; want applied", s2, err)
	}
	wantNewer(t, "second Set of the same key", s2.Version, s1.Version)

	g2, err := c.ss.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get after Set v2: %v", err)
	}
	if g2.Value != "v2" {
		t.Errorf("Get after Set v2 = %q, want %q", g2.Value, "v2")
	}
	wantSame(t, "Get after Set v2", g2.Version, s2.Version)

	d, err := c.ss.Del(ctx, key)
	if err != nil {
		t.Fatalf("Del: %v", err)
	}
	if d.Value != 1 {
		t.Errorf("Del of an existing key = %d, want 1", d.Value)
	}
	g3, err := c.ss.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get after Del: %v", err)
	}
	if g3.Value != "" || !g3.Version.IsZero() {
		t.Errorf("Get after Del = {Value:%q Version:%v}, want a miss", g3.Value, g3.Version)
	}

	t.Run("EmptyValue", func(t *testing.T) {
		k := e.key("empty")
		s, err := c.ss.Set(ctx, k, "")
		if err != nil || !s.Value {
			t.Fatalf("Set of an empty value = %+v, %v; want applied", s, err)
		}
		g, err := c.ss.Get(ctx, k)
		if err != nil {
			t.Fatalf("Get of an empty value: %v", err)
		}
		if g.Value != "" {
			t.Errorf("Get of an empty value = %q", g.Value)
		}
		// Present-but-empty is told apart from missing by the version.
		if g.Version.IsZero() {
			t.Errorf("Get of an empty value has no version: the SDK cannot tell it from a missing key")
		}
		wantSame(t, "Get of an empty value", g.Version, s.Version)
	})

	t.Run("BinaryValueAndPersist", func(t *testing.T) {
		k := e.key("bin")
		val := "a\r\nb\x00c$3\r\n\xff"
		s, err := c.ss.Set(ctx, k, val, statestore.WithPersist(true), statestore.WithTimeout(5*time.Second))
		if err != nil || !s.Value {
			t.Fatalf("Set with aio-persistence = %+v, %v; want applied", s, err)
		}
		g, err := c.ss.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if g.Value != val {
			t.Errorf("Get = %q, want %q", g.Value, val)
		}
	})
}

func TestConditionalSet(t *testing.T) {
	e := newEnv(t)
	c := e.newClient("cond")
	ctx := e.ctx

	t.Run("NX", func(t *testing.T) {
		k := e.key("nx")
		s1, err := c.ss.Set(ctx, k, "first", statestore.NotExists)
		if err != nil || !s1.Value {
			t.Fatalf("Set NX on a missing key = %+v, %v; want applied", s1, err)
		}
		s2, err := c.ss.Set(ctx, k, "second", statestore.WithCondition(statestore.NotExists))
		if err != nil {
			t.Fatalf("Set NX on an existing key: %v (want not applied, no error)", err)
		}
		if s2.Value {
			t.Errorf("Set NX on an existing key was applied")
		}
		wantSame(t, "Set NX not applied returns the stored version", s2.Version, s1.Version)
		g, err := c.ss.Get(ctx, k)
		if err != nil || g.Value != "first" {
			t.Errorf("Get after refused NX = %+v, %v; want %q", g, err, "first")
		}
	})

	t.Run("NEX", func(t *testing.T) {
		k := e.key("nex")
		s1, err := c.ss.Set(ctx, k, "same", statestore.NotExistsOrEqual)
		if err != nil || !s1.Value {
			t.Fatalf("Set NEX on a missing key = %+v, %v; want applied", s1, err)
		}
		s2, err := c.ss.Set(ctx, k, "same", statestore.NotExistsOrEqual)
		if err != nil || !s2.Value {
			t.Fatalf("Set NEX with the equal value = %+v, %v; want applied", s2, err)
		}
		wantNewer(t, "NEX re-set of the same value (renewal)", s2.Version, s1.Version)
		s3, err := c.ss.Set(ctx, k, "other", statestore.NotExistsOrEqual)
		if err != nil {
			t.Fatalf("Set NEX with a different value: %v (want not applied, no error)", err)
		}
		if s3.Value {
			t.Errorf("Set NEX with a different value was applied")
		}
		wantSame(t, "Set NEX not applied returns the stored version", s3.Version, s2.Version)
		g, err := c.ss.Get(ctx, k)
		if err != nil || g.Value != "same" {
			t.Errorf("Get after refused NEX = %+v, %v; want %q", g, err, "same")
		}
	})

	t.Run("VDel", func(t *testing.T) {
		k := e.key("vdel")
		if _, err := c.ss.Set(ctx, k, "mine"); err != nil {
			t.Fatal(err)
		}
		r, err := c.ss.VDel(ctx, k, "theirs")
		if err != nil {
			t.Fatalf("VDel with a different value: %v", err)
		}
		if r.Value != -1 {
			t.Errorf("VDel with a different value = %d, want -1", r.Value)
		}
		if g, err := c.ss.Get(ctx, k); err != nil || g.Value != "mine" {
			t.Errorf("Get after refused VDel = %+v, %v; want %q", g, err, "mine")
		}
		r, err = c.ss.VDel(ctx, k, "mine")
		if err != nil || r.Value != 1 {
			t.Errorf("VDel with the matching value = %+v, %v; want 1", r, err)
		}
		if g, err := c.ss.Get(ctx, k); err != nil || !g.Version.IsZero() {
			t.Errorf("Get after VDel = %+v, %v; want a miss", g, err)
		}
		r, err = c.ss.VDel(ctx, k, "mine")
		if err != nil || r.Value != 0 {
			t.Errorf("VDel of a missing key = %+v, %v; want 0", r, err)
		}
	})

	t.Run("DelMissing", func(t *testing.T) {
		r, err := c.ss.Del(ctx, e.key("never"))
		if err != nil || r.Value != 0 {
			t.Errorf("Del of a missing key = %+v, %v; want 0", r, err)
		}
	})
}

func TestExpiry(t *testing.T) {
	e := newEnv(t)
	c := e.newClient("px")
	w := e.newClient("pxw")
	ctx := e.ctx
	k := e.key("px")

	q := e.watch(w, k)
	if err := w.ss.KeyNotify(ctx, k); err != nil {
		t.Fatalf("KeyNotify: %v", err)
	}

	const px = 300 * time.Millisecond
	start := time.Now()
	s, err := c.ss.Set(ctx, k, "ephemeral", statestore.WithExpiry(px))
	if err != nil || !s.Value {
		t.Fatalf("Set PX 300 = %+v, %v; want applied", s, err)
	}
	q.expectSet("ephemeral")
	if g, err := c.ss.Get(ctx, k); err != nil {
		t.Fatal(err)
	} else if time.Since(start) < px && g.Value != "ephemeral" {
		t.Errorf("Get right after Set PX = %q, want %q", g.Value, "ephemeral")
	}

	// The expiry is the signal: wait for its DELETE notification.
	q.expectDelete("PX expiry")
	if el := time.Since(start); el < px-20*time.Millisecond {
		t.Errorf("key expired %v after the Set was sent, before its PX of %v", el, px)
	}
	g, err := c.ss.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if g.Value != "" || !g.Version.IsZero() {
		t.Errorf("Get after expiry = {Value:%q Version:%v}, want a miss", g.Value, g.Version)
	}

	// Expiry must also clear a fencing token with the key.
	t.Run("ClearsFencingToken", func(t *testing.T) {
		k := e.key("pxft")
		q := e.watch(w, k)
		if err := w.ss.KeyNotify(ctx, k); err != nil {
			t.Fatal(err)
		}
		tok, err := c.app.GetHLC()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ss.Set(ctx, k, "fenced", statestore.WithExpiry(px), statestore.WithFencingToken(tok)); err != nil {
			t.Fatalf("Set PX with fencing token: %v", err)
		}
		q.expectSet("fenced")
		q.expectDelete("PX expiry of a fenced key")
		if s, err := c.ss.Set(ctx, k, "free"); err != nil || !s.Value {
			t.Errorf("Set without token after the fenced key expired = %+v, %v; want applied", s, err)
		}
	})
}

func TestFencing(t *testing.T) {
	e := newEnv(t)
	c := e.newClient("fence")
	ctx := e.ctx
	lock := e.key("lock")
	key := e.key("protected")

	// A token taken before the lock write compares lower than its version.
	older, err := c.app.GetHLC()
	if err != nil {
		t.Fatal(err)
	}
	l1, err := c.ss.Set(ctx, lock, c.id, statestore.NotExistsOrEqual, statestore.WithExpiry(30*time.Second))
	if err != nil || !l1.Value {
		t.Fatalf("acquire lock key = %+v, %v", l1, err)
	}
	tok1 := l1.Version
	wantNewer(t, "lock version vs a token taken before it", tok1, older)

	s, err := c.ss.Set(ctx, key, "v1", statestore.WithFencingToken(tok1))
	if err != nil || !s.Value {
		t.Fatalf("Set with a fencing token on an unfenced key = %+v, %v; want applied", s, err)
	}

	_, err = c.ss.Set(ctx, key, "nofence")
	wantServiceError(t, "Set without token on a fenced key", err, wireFencingRequired, sserrors.MissingFencingToken)

	_, err = c.ss.Set(ctx, key, "old", statestore.WithFencingToken(older))
	wantServiceError(t, "Set with an older token", err, wireFencingLower, sserrors.FencingTokenLowerVersion)

	if s, err := c.ss.Set(ctx, key, "equal", statestore.WithFencingToken(tok1)); err != nil || !s.Value {
		t.Errorf("Set with the equal token = %+v, %v; want applied", s, err)
	}

	// Renew the lock: NEX of the same value gives a strictly newer version.
	l2, err := c.ss.Set(ctx, lock, c.id, statestore.NotExistsOrEqual, statestore.WithExpiry(30*time.Second))
	if err != nil || !l2.Value {
		t.Fatalf("renew lock key = %+v, %v", l2, err)
	}
	tok2 := l2.Version
	wantNewer(t, "renewed lock version", tok2, tok1)

	if s, err := c.ss.Set(ctx, key, "v2", statestore.WithFencingToken(tok2)); err != nil || !s.Value {
		t.Fatalf("Set with a newer token = %+v, %v; want applied", s, err)
	}
	// The newer token replaced the stored one: tok1 is now too old.
	_, err = c.ss.Set(ctx, key, "stale", statestore.WithFencingToken(tok1))
	wantServiceError(t, "Set with the token the newer one replaced", err, wireFencingLower, sserrors.FencingTokenLowerVersion)

	// GET ignores fencing.
	if g, err := c.ss.Get(ctx, key); err != nil || g.Value != "v2" {
		t.Errorf("Get of a fenced key = %+v, %v; want %q", g, err, "v2")
	}

	_, err = c.ss.Del(ctx, key)
	wantServiceError(t, "Del without token", err, wireFencingRequired, sserrors.MissingFencingToken)
	_, err = c.ss.Del(ctx, key, statestore.WithFencingToken(tok1))
	wantServiceError(t, "Del with an older token", err, wireFencingLower, sserrors.FencingTokenLowerVersion)
	_, err = c.ss.VDel(ctx, key, "v2")
	wantServiceError(t, "VDel without token", err, wireFencingRequired, sserrors.MissingFencingToken)
	_, err = c.ss.VDel(ctx, key, "v2", statestore.WithFencingToken(older))
	wantServiceError(t, "VDel with an older token", err, wireFencingLower, sserrors.FencingTokenLowerVersion)

	if g, err := c.ss.Get(ctx, key); err != nil || g.Value != "v2" {
		t.Errorf("Get after refused deletes = %+v, %v; want %q", g, err, "v2")
	}

	if r, err := c.ss.VDel(ctx, key, "v2", statestore.WithFencingToken(tok2)); err != nil || r.Value != 1 {
		t.Errorf("VDel with the current token = %+v, %v; want 1", r, err)
	}

	// The token went away with the key.
	if s, err := c.ss.Set(ctx, key, "fresh"); err != nil || !s.Value {
		t.Errorf("Set without token after the fenced key was deleted = %+v, %v; want applied", s, err)
	}

	t.Run("DelWithToken", func(t *testing.T) {
		k := e.key("delft")
		if _, err := c.ss.Set(ctx, k, "x", statestore.WithFencingToken(tok1)); err != nil {
			t.Fatal(err)
		}
		if r, err := c.ss.Del(ctx, k, statestore.WithFencingToken(tok2)); err != nil || r.Value != 1 {
			t.Errorf("Del with a newer token = %+v, %v; want 1", r, err)
		}
	})

	if r, err := c.ss.VDel(ctx, lock, c.id); err != nil || r.Value != 1 {
		t.Errorf("release lock key = %+v, %v", r, err)
	}
}

func TestKeyNotify(t *testing.T) {
	e := newEnv(t)
	w := e.newClient("watch")  // watcher: plain SDK, never subscribes to the notify topic
	s := e.newClient("writer") // another client that writes
	ctx := e.ctx
	key := e.key("watched")
	other := e.key("signal")

	q := e.watch(w, key)
	qo := e.watch(w, other)
	if err := w.ss.KeyNotify(ctx, key); err != nil {
		t.Fatalf("KeyNotify: %v", err)
	}
	if err := w.ss.KeyNotify(ctx, other); err != nil {
		t.Fatalf("KeyNotify (signal key): %v", err)
	}

	t.Run("Set", func(t *testing.T) {
		r, err := s.ss.Set(ctx, key, "v1")
		if err != nil {
			t.Fatal(err)
		}
		n := q.expectSet("v1")
		wantSame(t, "SET notification version (__ts) vs the Set response", n.Version, r.Version)

		// Exactly once: the next notification must be the next write's.
		r2, err := s.ss.Set(ctx, key, "v2")
		if err != nil {
			t.Fatal(err)
		}
		n2 := q.expectSet("v2")
		wantSame(t, "second SET notification version", n2.Version, r2.Version)

		// An empty value is still a SET with VALUE.
		if _, err := s.ss.Set(ctx, key, ""); err != nil {
			t.Fatal(err)
		}
		q.expectSet("")
	})

	t.Run("Del", func(t *testing.T) {
		if _, err := s.ss.Del(ctx, key); err != nil {
			t.Fatal(err)
		}
		q.expectDelete("DEL")
		// A Del of the now missing key changes nothing: no notification.
		// (Checked below, after the next positive signal.)
		if _, err := s.ss.Del(ctx, key); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("VDel", func(t *testing.T) {
		if _, err := s.ss.Set(ctx, key, "v3"); err != nil {
			t.Fatal(err)
		}
		q.expectSet("v3") // also proves the DEL of a missing key sent nothing
		if r, err := s.ss.VDel(ctx, key, "nope"); err != nil || r.Value != -1 {
			t.Fatalf("VDel mismatch = %+v, %v", r, err)
		}
		if _, err := s.ss.VDel(ctx, key, "v3"); err != nil {
			t.Fatal(err)
		}
		q.expectDelete("VDEL") // also proves the refused VDEL sent nothing
	})

	t.Run("Expiry", func(t *testing.T) {
		if _, err := s.ss.Set(ctx, key, "v4", statestore.WithExpiry(300*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		q.expectSet("v4")
		q.expectDelete("PX expiry")
	})

	t.Run("RefusedSetsSendNothing", func(t *testing.T) {
		if _, err := s.ss.Set(ctx, key, "held"); err != nil {
			t.Fatal(err)
		}
		q.expectSet("held")
		if r, err := s.ss.Set(ctx, key, "nx", statestore.NotExists); err != nil || r.Value {
			t.Fatalf("Set NX = %+v, %v; want not applied", r, err)
		}
		if r, err := s.ss.Set(ctx, key, "nex", statestore.NotExistsOrEqual); err != nil || r.Value {
			t.Fatalf("Set NEX = %+v, %v; want not applied", r, err)
		}
		if _, err := s.ss.Set(ctx, key, "after"); err != nil {
			t.Fatal(err)
		}
		q.expectSet("after") // not "nx" or "nex"
	})

	t.Run("Stop", func(t *testing.T) {
		if err := w.ss.KeyNotifyStop(ctx, key); err != nil {
			t.Fatalf("KeyNotifyStop: %v", err)
		}
		if _, err := s.ss.Set(ctx, key, "unwatched"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ss.Del(ctx, key); err != nil {
			t.Fatal(err)
		}
		// Positive signals on the other, still watched key: anything the
		// store sent for `key` before them has had its chance to arrive.
		// (Two rounds, since the SDK hands each message to its own goroutine.)
		for _, v := range []string{"signal-1", "signal-2"} {
			if _, err := s.ss.Set(ctx, other, v); err != nil {
				t.Fatal(err)
			}
			qo.expectSet(v)
		}
		q.expectEmpty("after KeyNotifyStop")
	})

	t.Run("KeyNotifyTwice", func(t *testing.T) {
		// The SDK sends KEYNOTIFY on every call and refcounts locally; the
		// store must answer +OK when already watching, and still deliver
		// each change once.
		k := e.key("twice")
		qk := e.watch(w, k)
		for i := range 2 {
			if err := w.ss.KeyNotify(ctx, k); err != nil {
				t.Fatalf("KeyNotify #%d: %v", i+1, err)
			}
		}
		for _, v := range []string{"x", "y"} {
			if _, err := s.ss.Set(ctx, k, v); err != nil {
				t.Fatal(err)
			}
			qk.expectSet(v) // "y" right after "x": no duplicate "x"
		}
		// First stop only decrements the SDK's refcount; the second sends
		// KEYNOTIFY STOP.
		for i := range 2 {
			if err := w.ss.KeyNotifyStop(ctx, k); err != nil {
				t.Fatalf("KeyNotifyStop #%d: %v", i+1, err)
			}
		}
		if _, err := s.ss.Set(ctx, k, "z"); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"signal-3", "signal-4"} {
			if _, err := s.ss.Set(ctx, other, v); err != nil {
				t.Fatal(err)
			}
			qo.expectSet(v)
		}
		qk.expectEmpty("after the registration was stopped")
	})

	qo.expectEmpty("signal key: only the signals")
	q.expectEmpty("end of test")
}

// TestKeyNotifySubscribedClient: a client that does subscribe to its notify
// topic (as the Rust and .NET SDKs do) must still get each notification once.
func TestKeyNotifySubscribedClient(t *testing.T) {
	e := newEnv(t)
	w := e.newClient("subw")
	s := e.newClient("subs")
	ctx := e.ctx
	key := e.key("k")

	filter := w.notifyTopicFor(key)
	filter = filter[:strings.LastIndex(filter, "/")+1] + "+"
	ack, err := w.mqtt.Subscribe(ctx, filter, mqtt.WithQoS(1))
	if err != nil {
		t.Fatalf("Subscribe %s: %v", filter, err)
	}
	if ack.ReasonCode >= 0x80 {
		t.Fatalf("Subscribe %s: SUBACK reason code 0x%x (%s)", filter, ack.ReasonCode, ack.ReasonString)
	}

	var raw atomic.Int32
	wantTopic := w.notifyTopicFor(key)
	e.rawWatch(w, func(m *mqtt.Message) {
		if m.Topic == wantTopic {
			raw.Add(1)
		}
	})

	q := e.watch(w, key)
	if err := w.ss.KeyNotify(ctx, key); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b", "c"} {
		if _, err := s.ss.Set(ctx, key, v); err != nil {
			t.Fatal(err)
		}
		q.expectSet(v)
	}
	if _, err := s.ss.Del(ctx, key); err != nil {
		t.Fatal(err)
	}
	q.expectDelete("DEL")
	if err := w.ss.KeyNotifyStop(ctx, key); err != nil {
		t.Fatal(err)
	}
	// Positive signal: a request/response round trip on the same session
	// after the last notification.
	if _, err := w.ss.Get(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ss.Get(ctx, key); err != nil {
		t.Fatal(err)
	}
	q.expectEmpty("duplicate delivery to a client subscribed to its notify topic")
	if got := raw.Load(); got != 4 {
		t.Errorf("PUBLISHes on %s = %d, want 4 (each notification exactly once)", wantTopic, got)
	}
}
