package lock_test

// Stress tests from an adversarial review: many holdings of different
// kinds (Locks with and without FenceKey, a Semaphore) sharing one
// sskv.Client, whose single writer goroutine is stuck on a frozen socket,
// against waiters on other clients. Each checks that every holding's Done
// closes by its renew deadline, and that no waiter acquires while a
// holding of the same key (or slot) still has its Done open.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// sharedHolding is one holding on the shared client, with its waiter.
type sharedHolding struct {
	name string
	done func() <-chan struct{}
	err  func() error
	rd   time.Duration

	mu       sync.Mutex
	lastSent time.Time // of the last successful renewal (or acquisition)
	renewals int
	doneAt   time.Time

	gotAt   time.Time // when the waiter acquired (zero if never)
	openAt  bool      // the holding's Done was still open when the waiter acquired
	gotInfo string
}

func (h *sharedHolding) hook(latency time.Duration, err error) {
	if err != nil {
		return
	}
	h.mu.Lock()
	h.lastSent = time.Now().Add(-latency)
	h.renewals++
	h.mu.Unlock()
}

type sharedRig struct {
	t     *testing.T
	srv   *localstore.Server
	proxy *faultproxy.Proxy
	ca    *sskv.Client // shared, proxied
	cb    *sskv.Client // waiters, direct
	cfg   lock.Config
	hs    []*sharedHolding
	wg    sync.WaitGroup
	wctx  context.Context
}

func newSharedRig(t *testing.T, cfg lock.Config, patient bool) *sharedRig {
	srv := startStore(t)
	p, err := faultproxy.Start(srv.Addr(), faultproxy.Options{BufferSize: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	var ca *sskv.Client
	if patient {
		ca = storetest.DialPatient(t, p.Addr(), "")
	} else {
		ca = dial(t, p.Addr())
	}
	cb := dial(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r := &sharedRig{t: t, srv: srv, proxy: p, ca: ca, cb: cb, cfg: cfg, wctx: ctx}
	t.Cleanup(func() { cancel(); r.wg.Wait() })
	return r
}

// waitFor starts the waiter of h: acquire runs on cb and returns a
// description once it holds.
func (r *sharedRig) waiter(h *sharedHolding, acquire func(ctx context.Context) (string, error)) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		info, err := acquire(r.wctx)
		if err != nil {
			return
		}
		now := time.Now()
		open := false
		select {
		case <-h.done():
		default:
			open = true
		}
		h.mu.Lock()
		h.gotAt, h.openAt, h.gotInfo = now, open, info
		h.mu.Unlock()
	}()
}

func (r *sharedRig) addLock(name string, fence bool) {
	t := r.t
	cfg := r.cfg
	cfg.Name, cfg.FenceKey = name, fence
	h := &sharedHolding{name: name, rd: cfg.RenewDeadline}
	cfg.OnRenewal = h.hook
	a := newLock(t, r.ca, cfg)
	start := time.Now()
	mustLock(t, a)
	h.lastSent = start
	h.done, h.err = a.Done, a.Err
	go func() {
		<-a.Done()
		h.mu.Lock()
		h.doneAt = time.Now()
		h.mu.Unlock()
	}()
	bcfg := cfg
	bcfg.OnRenewal = nil
	b := newLock(t, r.cb, bcfg)
	r.waiter(h, func(ctx context.Context) (string, error) {
		if err := b.Lock(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("token %v", b.Token()), nil
	})
	r.hs = append(r.hs, h)
}

// addSemaphore: limit participants on ca, each holding a slot, and one on
// cb waiting.
func (r *sharedRig) addSemaphore(name string, limit int) {
	t := r.t
	scfg := lock.SemaphoreConfig{Name: name, Limit: limit, TTL: r.cfg.TTL, RenewInterval: r.cfg.RenewInterval, RenewDeadline: r.cfg.RenewDeadline}
	bySlot := make([]*sharedHolding, limit)
	for i := 0; i < limit; i++ {
		h := &sharedHolding{name: fmt.Sprintf("%s#%d", name, i), rd: r.cfg.RenewDeadline}
		c := scfg
		c.OnRenewal = h.hook
		s := newSemaphore(t, r.ca, c)
		start := time.Now()
		if err := s.Acquire(testCtx(t)); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		h.lastSent = start
		h.done, h.err = s.Done, s.Err
		h.name = fmt.Sprintf("%s/slot%d", name, s.Slot())
		go func() {
			<-s.Done()
			h.mu.Lock()
			h.doneAt = time.Now()
			h.mu.Unlock()
		}()
		bySlot[s.Slot()] = h
		r.hs = append(r.hs, h)
	}
	sb := newSemaphore(t, r.cb, scfg)
	// One waiter for the semaphore: check the slot it gets.
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := sb.Acquire(r.wctx); err != nil {
			return
		}
		now := time.Now()
		h := bySlot[sb.Slot()]
		open := false
		select {
		case <-h.done():
		default:
			open = true
		}
		h.mu.Lock()
		h.gotAt, h.openAt, h.gotInfo = now, open, fmt.Sprintf("slot %d token %v", sb.Slot(), sb.Token())
		h.mu.Unlock()
	}()
}

// stickWriter sends a large SET from ca, on a frozen path, so that the
// client's writer blocks in the socket write.
func (r *sharedRig) stickWriter(size int) {
	big := []byte(strings.Repeat("x", size))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = r.ca.Set(ctx, "big", big, sskv.SetOptions{})
	}()
}

// check reports every holding whose waiter acquired while its Done was
// open, and every Done that closed past its renew deadline by more than
// slack.
func (r *sharedRig) check(slack time.Duration) {
	t := r.t
	var lates []string
	for _, h := range r.hs {
		h.mu.Lock()
		dl := h.lastSent.Add(h.rd)
		doneAt, gotAt, open, info, n := h.doneAt, h.gotAt, h.openAt, h.gotInfo, h.renewals
		hasHook := !h.lastSent.IsZero()
		h.mu.Unlock()
		if open || (!gotAt.IsZero() && (doneAt.IsZero() || gotAt.Before(doneAt))) {
			t.Errorf("%s: the waiter acquired (%s) while the holding's Done was open (Done at %v after it; renew deadline %v before the waiter; Err now %v): two holders at once",
				h.name, info, doneAt.Sub(gotAt).Round(time.Millisecond), gotAt.Sub(dl).Round(time.Millisecond), h.err())
		}
		if gotAt.IsZero() {
			t.Logf("%s: waiter never acquired; Done at %v, Err %v", h.name, doneAt.Format("15:04:05.000"), h.err())
		}
		if hasHook && !doneAt.IsZero() {
			late := doneAt.Sub(dl)
			lates = append(lates, fmt.Sprintf("%s:%v(r%d)", h.name, late.Round(time.Millisecond), n))
			if late > slack {
				t.Errorf("%s: Done closed %v past its renew deadline (renewals %d, Err %v)", h.name, late.Round(time.Millisecond), n, h.err())
			}
		}
		if hasHook && doneAt.IsZero() && time.Now().After(dl.Add(slack)) {
			t.Errorf("%s: Done still open %v past its renew deadline", h.name, time.Since(dl).Round(time.Millisecond))
		}
	}
	slices.Sort(lates)
	t.Logf("lateness of Done past renew deadline: %v", lates)
}

func sharedConfig() lock.Config {
	return lock.Config{TTL: 3 * time.Second, RenewInterval: 2400 * time.Millisecond, RenewDeadline: 2900 * time.Millisecond}
}

func (r *sharedRig) populate(nLocks int) {
	for i := 0; i < nLocks; i++ {
		r.addLock(fmt.Sprintf("l%02d", i), i%2 == 1)
	}
	r.addSemaphore("sem", 2)
}

// TestStressSharedClientStuckWriterFrozenPath: the shared client's path freezes and its
// writer is stuck on a large SET; nothing heals until every waiter holds.
func TestStressSharedClientStuckWriterFrozenPath(t *testing.T) {
	stressOnly(t)
	r := newSharedRig(t, sharedConfig(), true)
	r.populate(12)
	time.Sleep(time.Duration(2500+rand.N(1500)) * time.Millisecond)
	r.proxy.Blackhole()
	r.stickWriter(1 << 20)
	waitDone := make(chan struct{})
	go func() { r.wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(15 * time.Second):
		t.Log("not every waiter acquired within 15 s")
	}
	r.proxy.Heal()
	time.Sleep(500 * time.Millisecond)
	r.check(50 * time.Millisecond)
}

// TestStressSharedClientStuckWriterReconnect: as above with a client that gives up on
// the silent connection and reconnects on a new path: the holdings should
// confirm and keep their keys, and no waiter may take one while its
// holding's Done is open. Then heal the old path, delivering what it held.
func TestStressSharedClientStuckWriterReconnect(t *testing.T) {
	stressOnly(t)
	cfg := lock.Config{TTL: 3 * time.Second, RenewInterval: time.Second, RenewDeadline: 2 * time.Second}
	r := newSharedRig(t, cfg, false)
	r.populate(12)
	time.Sleep(time.Duration(1500+rand.N(1500)) * time.Millisecond)
	r.proxy.Blackhole()
	r.stickWriter(1 << 20)
	time.Sleep(time.Duration(2000+rand.N(3000)) * time.Millisecond)
	r.proxy.Heal()
	time.Sleep(4 * time.Second)
	r.check(50 * time.Millisecond)
	// Waiters still waiting end with the test.
}

// TestStressSharedClientStuckWriterRestart: the store restarts while the shared client's
// writer is stuck on the frozen path; heal at a random moment.
func TestStressSharedClientStuckWriterRestart(t *testing.T) {
	stressOnly(t)
	cfg := lock.Config{TTL: 3 * time.Second, RenewInterval: time.Second, RenewDeadline: 2 * time.Second}
	r := newSharedRig(t, cfg, rand.N(2) == 0)
	r.populate(12)
	time.Sleep(time.Duration(1500+rand.N(1500)) * time.Millisecond)
	r.proxy.Blackhole()
	r.stickWriter(1 << 20)
	time.Sleep(time.Duration(rand.N(1500)) * time.Millisecond)
	r.srv = storetest.Restart(t, r.srv, time.Duration(rand.N(300))*time.Millisecond)
	time.Sleep(time.Duration(rand.N(2500)) * time.Millisecond)
	r.proxy.Heal()
	time.Sleep(6 * time.Second)
	r.check(50 * time.Millisecond)
}

// TestStressSharedClientStuckWriterManyTight: many holdings on the shared client, with
// TTL - RenewDeadline = 100 ms, the writer stuck, healed at a random moment
// around the renew deadlines.
func TestStressSharedClientStuckWriterManyTight(t *testing.T) {
	stressOnly(t)
	r := newSharedRig(t, sharedConfig(), true)
	r.populate(80)
	time.Sleep(time.Duration(2500+rand.N(1500)) * time.Millisecond)
	r.proxy.Blackhole()
	r.stickWriter(1 << 20)
	time.Sleep(time.Duration(2000+rand.N(1500)) * time.Millisecond)
	r.proxy.Heal()
	time.Sleep(5 * time.Second)
	r.check(50 * time.Millisecond)
}
