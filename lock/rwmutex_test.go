package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// An RWMutex serves as a fenced.Writer's source.
var _ fenced.ConnSource = (*lock.RWMutex)(nil)

func newRW(t testing.TB, c *sskv.Client, cfg lock.RWMutexConfig) *lock.RWMutex {
	t.Helper()
	m, err := lock.NewRWMutex(c, cfg)
	if err != nil {
		t.Fatalf("NewRWMutex: %v", err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func TestRWMutexConfig(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for _, cfg := range []lock.RWMutexConfig{{}, {Name: "m", MaxReaders: -1}, {Name: "m", MaxReaders: 1001}, {Name: "m", TTL: time.Second, RenewDeadline: time.Second}} {
		if _, err := lock.NewRWMutex(c, cfg); !errors.Is(err, lock.ErrConfig) {
			t.Errorf("NewRWMutex(%+v) = %v; want ErrConfig", cfg, err)
		}
	}
	m := newRW(t, c, lock.RWMutexConfig{Name: "m"})
	if m.Config().MaxReaders != lock.DefaultMaxReaders || !errors.Is(m.Err(), lock.ErrNotHeld) || m.Context().Err() == nil {
		t.Errorf("before acquisition: %+v, Err %v", m.Config(), m.Err())
	}
	if _, err := m.FencingToken(); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("FencingToken before acquisition = %v; want ErrNotHeld", err)
	}
	ctx := testCtx(t)
	if err := m.RUnlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("RUnlock before acquisition = %v; want ErrNotHeld", err)
	}
	if err := m.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); !errors.Is(err, lock.ErrAlreadyHeld) {
		t.Errorf("Lock while reading = %v; want ErrAlreadyHeld", err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Unlock of a read holding = %v; want ErrNotHeld", err)
	}
	if err := m.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Participants must agree on MaxReaders: the record says 16.
	other := newRW(t, c, lock.RWMutexConfig{Name: "m", MaxReaders: 4})
	if err := other.RLock(ctx); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Errorf("RLock with another MaxReaders = %v; want ErrLimitMismatch", err)
	}
}

// Readers share; a writer waits for them, and readers that come after a
// waiting writer wait for it (writer preference), while a writer excludes
// everyone. Its token is newer than the readers' before it, and a late
// reader's is newer than the writer's.
func TestRWMutexReadersShareWriterWaits(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 4, TTL: 3 * time.Second}
	var readers []*lock.RWMutex
	for range 3 {
		r := newRW(t, dial(t, srv.Addr()), cfg)
		if err := r.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	r := newRW(t, dial(t, srv.Addr()), cfg)
	if ok, err := r.TryRLock(ctx); !ok || err != nil {
		t.Fatalf("TryRLock beside 3 readers = %v, %v; want true", ok, err)
	}
	readers = append(readers, r)
	cw := dial(t, srv.Addr())
	w := newRW(t, cw, cfg)
	if ok, err := w.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while 4 read = %v, %v; want false", ok, err)
	}
	locked := make(chan error, 1)
	go func() { locked <- w.Lock(ctx) }()
	// The writer took the gate and waits for the readers.
	waitFor(t, "the writer to hold the gate", func() bool {
		res, err := cw.Get(ctx, lock.RWMutexGate("m"))
		return err == nil && res.Found && lock.ParseHolder(res.Value, res.Version).ID == w.Config().HolderID
	})
	late := newRW(t, dial(t, srv.Addr()), cfg)
	rlocked := make(chan error, 1)
	go func() { rlocked <- late.RLock(ctx) }()
	var maxRead hlc.Timestamp
	for _, r := range readers {
		select {
		case err := <-locked:
			t.Fatalf("the writer got in while readers read: %v", err)
		case err := <-rlocked:
			t.Fatalf("a late reader got in ahead of the waiting writer: %v", err)
		default:
		}
		if r.Token().After(maxRead) {
			maxRead = r.Token()
		}
		if err := r.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	tok, err := w.FencingToken()
	if err != nil || !tok.After(maxRead) || !w.Writing() {
		t.Fatalf("writer's token %v, %v; want one after the readers' %v", tok, err, maxRead)
	}
	select {
	case err := <-rlocked:
		t.Fatalf("a reader got in beside the writer: %v", err)
	default:
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-rlocked; err != nil {
		t.Fatal(err)
	}
	if !late.Token().After(tok) || late.Writing() {
		t.Fatalf("late reader's token %v; want one after the writer's %v", late.Token(), tok)
	}
}

// Participants on their own clients read and write at random: never a
// writer with anyone else, many readers at once, and each holding's token
// newer than every write holding that ended before it began, a write's
// newer than every holding that ended before it began.
func TestRWMutexExclusion(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 3, TTL: 3 * time.Second}
	var (
		readers, writers, maxReaders atomic.Int32
		mu                           sync.Mutex
		endedAll, endedWrites        hlc.Timestamp // newest token of the holdings ended
	)
	check := func(m *lock.RWMutex, write bool) error {
		mu.Lock()
		defer mu.Unlock()
		if tok := m.Token(); !tok.After(endedWrites) || (write && !tok.After(endedAll)) {
			return fmt.Errorf("write %v: token %v, not after the ended holdings' %v (writes %v)", write, tok, endedAll, endedWrites)
		}
		return nil
	}
	ended := func(m *lock.RWMutex, write bool) {
		mu.Lock()
		defer mu.Unlock()
		if tok := m.Token(); tok.After(endedAll) {
			endedAll = tok
		}
		if tok := m.Token(); write && tok.After(endedWrites) {
			endedWrites = tok
		}
	}
	const participants, rounds = 5, 12
	errs := make(chan error, participants)
	for range participants {
		m := newRW(t, dial(t, srv.Addr()), cfg)
		go func() {
			errs <- func() error {
				for range rounds {
					write := rand.N(3) == 0
					if write {
						if err := m.Lock(ctx); err != nil {
							return err
						}
						if w, r := writers.Add(1), readers.Load(); w != 1 || r != 0 {
							return fmt.Errorf("a writer with %d writers and %d readers", w, r)
						}
					} else {
						if err := m.RLock(ctx); err != nil {
							return err
						}
						r := readers.Add(1)
						if w := writers.Load(); w != 0 {
							return fmt.Errorf("a reader with %d writers", w)
						}
						for old := maxReaders.Load(); r > old && !maxReaders.CompareAndSwap(old, r); old = maxReaders.Load() {
						}
					}
					if err := check(m, write); err != nil {
						return err
					}
					time.Sleep(time.Duration(2+rand.N(10)) * time.Millisecond) // the guarded work
					ended(m, write)
					if write {
						writers.Add(-1)
						if err := m.Unlock(ctx); err != nil {
							return err
						}
					} else {
						readers.Add(-1)
						if err := m.RUnlock(ctx); err != nil {
							return err
						}
					}
				}
				return nil
			}()
		}()
	}
	for range participants {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if maxReaders.Load() < 2 {
		t.Logf("never 2 readers at once (a slow machine?)")
	}
	t.Logf("at most %d readers at once", maxReaders.Load())
}

// A reader that gives up while a writer holds, and a writer that gives up
// while readers hold, hold nothing and leave no key behind.
func TestRWMutexCancelLeavesNothing(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	obs := dial(t, srv.Addr())
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: 3 * time.Second}
	w := newRW(t, dial(t, srv.Addr()), cfg)
	r := newRW(t, dial(t, srv.Addr()), cfg)
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := r.RLock(short); !errors.Is(err, context.DeadlineExceeded) || r.Err() == nil {
		t.Fatalf("RLock while written = %v (Err %v); want DeadlineExceeded, nothing held", err, r.Err())
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Both slots read: a reader waits for a slot, a writer for both.
	r2 := newRW(t, dial(t, srv.Addr()), cfg)
	for _, m := range []*lock.RWMutex{r, r2} {
		if err := m.RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r3 := newRW(t, dial(t, srv.Addr()), cfg)
	for _, f := range []func(context.Context) error{w.Lock, r3.RLock} {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		if err := f(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock or RLock while 2 read = %v; want DeadlineExceeded", err)
		}
		cancel()
	}
	if w.Err() == nil || r3.Err() == nil {
		t.Fatalf("a cancelled call holds: %v, %v", w.Err(), r3.Err())
	}
	for _, m := range []*lock.RWMutex{r, r2} {
		if err := m.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{lock.RWMutexGate("m"), lock.RWMutexReader("m", 0), lock.RWMutexReader("m", 1)}
	waitFor(t, "no key left", func() bool {
		for _, k := range keys {
			if res, err := obs.Get(ctx, k); err != nil || res.Found {
				return false
			}
		}
		return true
	})
}

// A writer paused past its lease loses the lock on its own clock before the
// store lets the next writer in: no overlap, and its late fenced write is
// refused.
func TestRWMutexPausedWriterLoses(t *testing.T) {
	srv := startStore(t)
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	ctx := testCtx(t)
	ca, cb := dial(t, proxy.Addr()), dial(t, srv.Addr())
	a := newRW(t, ca, lock.RWMutexConfig{Name: "m", TTL: 300 * time.Millisecond})
	b := newRW(t, cb, lock.RWMutexConfig{Name: "m", TTL: 3 * time.Second})
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wa := fenced.New(ca, a)
	if _, err := wa.Set(ctx, "data", []byte("a"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	var aDone atomic.Int64
	go func() {
		<-a.Done()
		aDone.Store(time.Now().UnixNano())
	}()
	proxy.Blackhole()
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	bIn := time.Now().UnixNano()
	if d := aDone.Load(); d == 0 || d > bIn || !errors.Is(a.Err(), lock.ErrRenewDeadline) {
		t.Fatalf("b got in while a believed it held (a's end %d, b in %d, a.Err %v)", d, bIn, a.Err())
	}
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v not after a's %v", b.Token(), a.Token())
	}
	if _, err := fenced.New(cb, b).Set(ctx, "data", []byte("b"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	if _, err := cb.Set(ctx, "data", []byte("late a"), sskv.SetOptions{FencingToken: a.Token()}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("a write with a's token = %v; want ErrFencingTokenLower", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of a lost write holding = %v; want nil", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Uncontended RLock+RUnlock and Lock+Unlock, with the requests each sends.
func BenchmarkRWMutex(b *testing.B) {
	for _, write := range []bool{false, true} {
		name := map[bool]string{false: "RLock", true: "Lock"}[write]
		b.Run(name, func(b *testing.B) {
			srv := startStore(b)
			c := dial(b, srv.Addr())
			m, err := lock.NewRWMutex(c, lock.RWMutexConfig{Name: "m"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = m.Close(context.Background()) })
			ctx := testCtx(b)
			lockf, unlock := m.RLock, m.RUnlock
			if write {
				lockf, unlock = m.Lock, m.Unlock
			}
			// The first acquisition writes the record.
			if err := lockf(ctx); err != nil {
				b.Fatal(err)
			}
			if err := unlock(ctx); err != nil {
				b.Fatal(err)
			}
			before := srv.Requests(c.ID())
			b.ReportAllocs()
			for b.Loop() {
				if err := lockf(ctx); err != nil {
					b.Fatal(err)
				}
				if err := unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(srv.Requests(c.ID())-before)/float64(b.N), "requests/op")
		})
	}
}

// With every slot read, a reader waits on the slots' notifications and
// takes the first freed.
func TestRWMutexReaderWaitsForASlot(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: 3 * time.Second}
	r1, r2, r3 := newRW(t, dial(t, srv.Addr()), cfg), newRW(t, dial(t, srv.Addr()), cfg), newRW(t, dial(t, srv.Addr()), cfg)
	for _, r := range []*lock.RWMutex{r1, r2} {
		if err := r.RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := r3.TryRLock(ctx); ok || err != nil {
		t.Fatalf("TryRLock with every slot read = %v, %v; want false", ok, err)
	}
	got := make(chan error, 1)
	go func() { got <- r3.RLock(ctx) }()
	if err := r2.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if r1.Err() != nil || r3.Err() != nil {
		t.Fatalf("readers' holdings: %v, %v", r1.Err(), r3.Err())
	}
}

// A steady stream of overlapping readers does not starve a writer: it gets
// in once the readers ahead of it have left, while new readers wait.
func TestRWMutexWriterNotStarved(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 4, TTL: 3 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 3 {
		m := newRW(t, dial(t, srv.Addr()), cfg)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := m.RLock(ctx); err != nil {
					t.Error(err)
					return
				}
				reads.Add(1)
				time.Sleep(5 * time.Millisecond) // the guarded work
				if err := m.RUnlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	waitFor(t, "readers to read", func() bool { return reads.Load() >= 10 })
	w := newRW(t, dial(t, srv.Addr()), cfg)
	for range 3 {
		before := reads.Load()
		if err := w.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// Readers ahead of the writer on the gate: at most the 3 readers
		// reading and the one entering.
		inside := reads.Load() - before
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("reads that began while the writer waited: %d", inside)
		if inside > 6 {
			t.Errorf("%d reads began while the writer waited; want at most about 4", inside)
		}
	}
	close(stop)
	wg.Wait()
}

// A store restart loses every key while a reader, cut off, still reads and
// a writer waits for it: the writer gets in only once the reader's holding
// has ended on its own clock (the gate's hold-off after the reconnect), and
// RUnlock of the reader's lost holding ends it.
func TestRWMutexStoreRestart(t *testing.T) {
	srv := startStore(t)
	proxy := startProxy(t, srv.Addr())
	ttl := 2 * time.Second
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: ttl}
	r := newRW(t, dial(t, proxy.Addr()), cfg)
	cw := dial(t, srv.Addr())
	w := newRW(t, cw, cfg)
	ctx := testCtx(t)
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- w.Lock(ctx) }()
	waitFor(t, "the writer to wait for the reader", func() bool {
		return srv.Watching(cw.ID(), lock.RWMutexReader("m", 0)) || srv.Watching(cw.ID(), lock.RWMutexReader("m", 1))
	})
	proxy.Partition()
	down := time.Now()
	restartStore(t, srv, 100*time.Millisecond)
	if err := <-got; err != nil {
		t.Fatalf("Lock: %v", err)
	}
	took := time.Since(down)
	select {
	case <-r.Done():
	default:
		t.Fatalf("the writer got in %v after the restart while the reader still read", took)
	}
	t.Logf("the writer got in %v after the restart (TTL %v); the reader: %v", took, ttl, r.Err())
	proxy.Heal()
	// The key is gone; the reader's client may not have reconnected yet.
	if err := r.RUnlock(ctx); err != nil && !errors.Is(err, lock.ErrNotReleased) {
		t.Fatalf("RUnlock of a lost read holding = %v; want nil or ErrNotReleased", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// While a reader holds and renews, a writer waiting for it sends only the
// renewals of the gate it holds (as many as the reader's), and a reader
// queued behind the writer sends nothing.
func TestRWMutexWaitersSendNothingWhileHoldersRenew(t *testing.T) {
	srv := startStore(t)
	// Long enough for the holders not to miss a renewal on a loaded
	// machine, short enough for 9 TTLs to pass quickly.
	ttl := 600 * time.Millisecond
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: ttl}
	ctx := testCtx(t)
	cr, cw, cl := dial(t, srv.Addr()), dial(t, srv.Addr()), dial(t, srv.Addr())
	r := newRW(t, cr, cfg)
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, late := newRW(t, cw, cfg), newRW(t, cl, cfg)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.Lock(wctx); !errors.Is(err, context.Canceled) {
			t.Errorf("writer's Lock = %v; want it cancelled", err)
		}
	})
	waitFor(t, "the writer to wait for the reader", func() bool {
		return srv.Watching(cw.ID(), lock.RWMutexReader("m", 0)) || srv.Watching(cw.ID(), lock.RWMutexReader("m", 1))
	})
	wg.Go(func() {
		if err := late.RLock(wctx); !errors.Is(err, context.Canceled) {
			t.Errorf("late reader's RLock = %v; want it cancelled", err)
		}
	})
	waitFor(t, "the late reader to queue", func() bool {
		return srv.Watching(cl.ID(), lock.RWMutexGate("m")+"\x00inbox\x00"+late.Config().HolderID)
	})
	// Entry ends when the late reader's count has not moved for a sixth
	// of a TTL.
	var entry int64
	for settle := time.Now().Add(waitTimeout); ; {
		n := srv.Requests(cl.ID())
		time.Sleep(ttl / 6)
		if srv.Requests(cl.ID()) == n {
			entry = n
			break
		}
		if time.Now().After(settle) {
			t.Fatal("the late reader kept sending requests")
		}
	}
	rBefore, wBefore := srv.Requests(cr.ID()), srv.Requests(cw.ID())
	// The span measured, not a wait for an event: 9 TTLs, clear of the
	// queue's safeguard check (10.5 TTLs or more after the last try).
	time.Sleep(9 * ttl)
	rn, wn, ln := srv.Requests(cr.ID())-rBefore, srv.Requests(cw.ID())-wBefore, srv.Requests(cl.ID())-entry
	t.Logf("in 9 TTLs: reader %d requests, waiting writer %d, late reader %d", rn, wn, ln)
	if ln != 0 {
		t.Errorf("the late reader sent %d requests while queued", ln)
	}
	if rn < 18 || wn > rn+3 {
		t.Errorf("reader %d requests, writer %d: want the writer's gate renewals only, about the reader's", rn, wn)
	}
	if r.Err() != nil {
		t.Fatalf("the reader lost its holding: %v", r.Err())
	}
	cancel()
	wg.Wait()
}

// A writer's Lock+Unlock amid 3 readers that read again and again (5 ms of
// work each): its latency, the reads that began while it waited (its
// fairness: the readers ahead of it on the gate), and its requests.
func BenchmarkRWMutexWriterAmidReaders(b *testing.B) {
	srv := startStore(b)
	ctx := testCtx(b)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 4, TTL: 3 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 3 {
		m := newRW(b, dial(b, srv.Addr()), cfg)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := m.RLock(ctx); err != nil {
					b.Error(err)
					return
				}
				reads.Add(1)
				time.Sleep(5 * time.Millisecond) // the guarded work
				if err := m.RUnlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	cw := dial(b, srv.Addr())
	w := newRW(b, cw, cfg)
	var ahead int64
	most := int64(0)
	before := srv.Requests(cw.ID())
	for b.Loop() {
		n := reads.Load()
		if err := w.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		d := reads.Load() - n
		ahead += d
		most = max(most, d)
		if err := w.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(ahead)/float64(b.N), "reads-ahead/op")
	b.ReportMetric(float64(most), "max-reads-ahead")
	b.ReportMetric(float64(srv.Requests(cw.ID())-before)/float64(b.N), "requests/op")
}
