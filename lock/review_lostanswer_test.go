package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// dropAnswers has the store drop the answers to id's requests until it has
// executed n more of them, then answer again, from a goroutine: the answers
// of exactly those requests are lost. It returns a channel closed once the
// answers flow again.
func dropAnswers(srv *localstore.Server, id string, n int64) <-chan struct{} {
	before := srv.Requests(id)
	srv.SetResponseFault(id, localstore.ResponseFault{Drop: true})
	lifted := make(chan struct{})
	go func() {
		defer close(lifted)
		deadline := time.Now().Add(storetest.WaitTimeout)
		for srv.Requests(id) < before+n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // no event tells of a request executed
		}
		srv.SetResponseFault(id, localstore.ResponseFault{})
	}()
	return lifted
}

// patientCtx is a context with no deadline, as a service's Acquire has:
// the client's RequestTimeout (10 s) then bounds a request whose answer is
// lost. It ends after 30 s, or with the test.
func patientCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(30*time.Second, cancel)
	t.Cleanup(func() { stop.Stop(); cancel() })
	return ctx
}

// A participant that held within a TTL reads the gate (gateFree) beside
// the record; the record's read waits RenewDeadline for its answer and is
// retried (e4c6e39), but the gate's read is bounded by nothing but ctx
// (or the client's RequestTimeout): with its answer lost, Acquire waits
// 10 s with the slot free (with a deadline on ctx: until the deadline,
// then fails).
func TestReviewSemaphoreGateReadWaitsOutLostAnswer(t *testing.T) {
	srv := startStore(t)
	notified, stopped := make(chan struct{}, 8), make(chan struct{}, 8)
	c, err := sskv.Dial(testCtx(t), sskv.Config{
		Addr: srv.Addr(), ClientID: storetest.ID(t),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond,
		Metrics: sskv.Metrics{Request: func(verb string, _ time.Duration, _ string) {
			ch := map[string]chan struct{}{"KEYNOTIFY": notified, "KEYNOTIFY STOP": stopped}[verb]
			select {
			case ch <- struct{}{}:
			default: // nil for other verbs
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := newSemaphore(t, c, lock.SemaphoreConfig{Name: "s", Limit: 1, TTL: time.Second})
	ctx := patientCtx(t)
	if err := s.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	// The holding's watch of its slot starts in the background, and ends
	// in the background after the release: its STOP must not be one of the
	// requests whose answers are lost (a watch of the slot then waits for
	// that STOP, up to the RequestTimeout). A watch released before its
	// KEYNOTIFY went out sends no STOP: hold until it has gone out.
	await := func(ch chan struct{}, what string) {
		select {
		case <-ch:
		case <-time.After(waitTimeout):
			t.Fatalf("the slot's watch did not %s", what)
		}
	}
	await(notified, "start")
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	await(stopped, "end")
	// The record's read (the KEYNOTIFY of its watch, as the participant
	// acquires again within a TTL) and the gate's GET lose their answers.
	lifted := dropAnswers(srv, c.ID(), 2)
	start := time.Now()
	got := make(chan error, 1)
	go func() { got <- s.Acquire(ctx) }()
	<-lifted
	if err := <-got; err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// A renew deadline for the record's read, its backoff, and much room
	// for a loaded machine.
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Acquire took %v with the only slot free: two lost answers", took.Round(time.Millisecond))
	}
}

// A writer that took the gate reads every slot (drain) with unbounded
// GETs: a lost answer keeps it, holding the gate, from its write and every
// reader queued behind it for the client's RequestTimeout (10 s), or until
// ctx's deadline, though no slot is held.
func TestReviewRWMutexDrainWaitsOutLostAnswer(t *testing.T) {
	srv := startStore(t)
	ctx := patientCtx(t)
	wc := dial(t, srv.Addr())
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: time.Second}
	var lifted <-chan struct{}
	wcfg := cfg
	// Once the gate's SETs were answered: the guard's KEYNOTIFY and the
	// two GETs lose their answers.
	wcfg.Logger = newHook("acquired", lock.RWMutexGate("m"), func() { lifted = dropAnswers(srv, wc.ID(), 3) })
	w := newRW(t, wc, wcfg)
	start := time.Now()
	got := make(chan error, 1)
	go func() { got <- w.Lock(ctx) }()
	err := <-got
	took := time.Since(start)
	if lifted != nil {
		<-lifted
	}
	if err == nil {
		t.Logf("writer in after %v", took.Round(time.Millisecond))
	}
	if took > 5*time.Second {
		t.Errorf("Lock took %v (%v): lost answers to the drain's reads", took.Round(time.Millisecond), err)
	}
}

// The first acquisition of an RWMutex participant checks the record with a
// SET NX (and a GET), bounded by nothing but ctx and the client's
// RequestTimeout, and not retried: a lost answer holds RLock for 10 s and
// then fails it, where Lock.Lock retries a lost answer within RenewDeadline.
func TestReviewRWMutexRecordCheckLostAnswer(t *testing.T) {
	srv := startStore(t)
	ctx := patientCtx(t)
	c := dial(t, srv.Addr())
	r := newRW(t, c, lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: time.Second})
	lifted := dropAnswers(srv, c.ID(), 1)
	start := time.Now()
	err := r.RLock(ctx)
	took := time.Since(start)
	<-lifted
	if err != nil || took > 5*time.Second {
		t.Errorf("RLock = %v after %v, one lost answer; want nil within a few renew deadlines", err, took.Round(time.Millisecond))
	}
}
