package sskv_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// The load test's shape: 100 clients, each watching a block of 30 of the
// 1,000 keys (the blocks wrap around the keys three times, so every key has
// exactly three watchers, on three different clients), and each writing
// random keys at a paced rate.
const (
	loadClients          = 100
	loadKeys             = 1000
	loadWatchesPerClient = 30
	// loadRate is the target of acknowledged writes per second over all
	// writers (DSSLOCK_LOAD_RATE overrides it): about half of what the
	// store sustains with these 100 clients on 2 cores without -race
	// (about 4,000/s). Each of the 100 writers has one write in flight at
	// a time, so a store that cannot keep up slows the writers down
	// rather than piling up requests.
	loadRate = 2000
	// loadRaceRate is the default target under -race, the only scaling down
	// of the CI run: the race detector makes everything 5-10 times slower
	// (the store then acknowledges at most about 800 writes/s here), and a
	// paced load rather than a saturated one keeps the run steady on a busy
	// CI machine. Clients, keys and watches stay at full scale.
	loadRaceRate = 500
	// loadDrainTimeout bounds the wait, after the writers stop, for every
	// watcher to catch up with the last acknowledged write of its keys.
	loadDrainTimeout = 30 * time.Second
)

// ver is a compact version: every version comes from the store's clock, so
// its node id is the same (checked as events arrive) and only wall and
// counter need keeping.
type ver struct {
	wall int64
	ctr  uint32
}

func (v ver) cmp(u ver) int {
	switch {
	case v.wall != u.wall:
		if v.wall < u.wall {
			return -1
		}
		return 1
	case v.ctr != u.ctr:
		if v.ctr < u.ctr {
			return -1
		}
		return 1
	}
	return 0
}

func (v ver) String() string { return fmt.Sprintf("%d:%d", v.wall, v.ctr) }

// ack is one acknowledged write: the key's index, its version, and the
// write's id, which its value carries.
type ack struct {
	key int
	v   ver
	id  uint64
}

// seenEvent is one event a watcher received.
type seenEvent struct {
	v      ver
	id     uint64 // the write id its value carries; 0 when it carries none
	resync bool
	del    bool
}

// loadWatch is one watcher and what it received.
type loadWatch struct {
	client int
	key    int
	w      *sskv.Watcher
	evs    []seenEvent // owned by the watcher's consumer until it exits
	last   ver         // version of the last event received
}

func loadKeyName(i int) string { return fmt.Sprintf("load/k%04d", i) }

// loadValue is the value of write id on key: it names both.
func loadValue(key string, id uint64) []byte {
	return strconv.AppendUint([]byte(key+"#"), id, 10)
}

// parseLoadValue returns the write id that value, read from key, carries.
func parseLoadValue(key string, value []byte) (uint64, bool) {
	s, ok := strings.CutPrefix(string(value), key+"#")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(s, 10, 64)
	return id, err == nil && id > 0
}

// TestLoadNoLostNotifications holds 100 clients, 3,000 watches of 1,000 keys
// and a steady write load against one local store over TCP, and checks that
// every acknowledged write reaches every watcher of its key, in version
// order and once, unless a Resync event covers it (Resync events are allowed,
// counted and reported).
//
// It runs 3 s by default (the CI run, under -race); DSSLOCK_LOAD=30s runs it
// for 30 s. Run with -v for the figures:
//
//	go test -race -count=1 -run TestLoadNoLostNotifications -v ./sskv/
//	DSSLOCK_LOAD=30s go test -count=1 -run TestLoadNoLostNotifications -v ./sskv/
func TestLoadNoLostNotifications(t *testing.T) {
	dur := 3 * time.Second
	if s := os.Getenv("DSSLOCK_LOAD"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("DSSLOCK_LOAD=%q: want a positive duration such as 30s", s)
		}
		dur = d
	}
	rate := loadRate
	if raceEnabled() {
		rate = loadRaceRate
	}
	if s := os.Getenv("DSSLOCK_LOAD_RATE"); s != "" {
		r, err := strconv.Atoi(s)
		if err != nil || r <= 0 {
			t.Fatalf("DSSLOCK_LOAD_RATE=%q: want a positive number of writes per second", s)
		}
		rate = r
	}

	srv := startStore(t, localstore.Config{})
	setupCtx, cancelSetup := context.WithTimeout(context.Background(), time.Minute)
	defer cancelSetup()

	// Connect the clients.
	clients := make([]*sskv.Client, loadClients)
	closeAll := sync.OnceFunc(func() {
		var g sync.WaitGroup
		for _, c := range clients {
			if c != nil {
				g.Go(func() { _ = c.Close() })
			}
		}
		g.Wait()
	})
	defer closeAll()
	start := time.Now()
	var g errgroup.Group
	for i := range clients {
		id := testID(t) // distinct for every client
		g.Go(func() error {
			c, err := sskv.Dial(setupCtx, sskv.Config{
				Addr:         srv.Addr(),
				ClientID:     id,
				ReconnectMin: 10 * time.Millisecond,
				ReconnectMax: 100 * time.Millisecond,
			})
			clients[i] = c
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("Dial: %v", err)
	}

	// Give every key a value before it is watched: its baseline.
	keys := make([]string, loadKeys)
	base := make([]ver, loadKeys)
	var node atomic.Value // the store's node id, which every version carries
	for k := range keys {
		keys[k] = loadKeyName(k)
	}
	for i, c := range clients {
		g.Go(func() error {
			for k := i; k < loadKeys; k += loadClients {
				res, err := c.Set(setupCtx, keys[k], []byte("baseline"), sskv.SetOptions{})
				if err != nil {
					return err
				}
				base[k] = ver{res.Version.Wall, res.Version.Counter}
				node.CompareAndSwap(nil, res.Version.Node)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("baseline Set: %v", err)
	}
	storeNode := node.Load().(string)

	// Watch: client i watches keys 30i .. 30i+29 (mod 1000).
	watches := make([]*loadWatch, 0, loadClients*loadWatchesPerClient)
	for i := range clients {
		for j := range loadWatchesPerClient {
			watches = append(watches, &loadWatch{client: i, key: (i*loadWatchesPerClient + j) % loadKeys})
		}
	}
	for i, c := range clients {
		ws := watches[i*loadWatchesPerClient : (i+1)*loadWatchesPerClient]
		g.Go(func() error {
			for _, lw := range ws {
				w, err := c.Watch(context.Background(), keys[lw.key])
				if err != nil {
					return err
				}
				lw.w = w
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	setupTime := time.Since(start)

	// Consume every watcher's events until its channel closes (when its
	// client closes). Once the writers have stopped, targets holds the last
	// acknowledged version of each key and targetsSet is closed; each
	// watcher then counts itself down, once, on reaching its key's target.
	var (
		targets    []ver
		targetsSet = make(chan struct{})
		remaining  atomic.Int64
		allReached = make(chan struct{})
		delivered  atomic.Int64
		badEvents  atomic.Int64 // events with another node's version or a foreign value
		consumers  sync.WaitGroup
		badMu      sync.Mutex
		badSample  []string
	)
	remaining.Store(int64(len(watches)))
	bad := func(format string, args ...any) {
		if badEvents.Add(1) <= 5 {
			badMu.Lock()
			badSample = append(badSample, fmt.Sprintf(format, args...))
			badMu.Unlock()
		}
	}
	for _, lw := range watches {
		lw.last = base[lw.key]
		consumers.Go(func() {
			key := keys[lw.key]
			reached := false
			check := func() {
				if !reached && lw.last.cmp(targets[lw.key]) >= 0 {
					reached = true
					if remaining.Add(-1) == 0 {
						close(allReached)
					}
				}
			}
			set := targetsSet
			initial := false // the Initial event was received
			for {
				select {
				case ev, ok := <-lw.w.Events():
					if !ok {
						return
					}
					if ev.Initial {
						// The state the watch starts from: the baseline,
						// set before every watch and before any write.
						if ev.Op != sskv.OpSet || string(ev.Value) != "baseline" || (ver{ev.Version.Wall, ev.Version.Counter}) != base[lw.key] || initial || len(lw.evs) > 0 {
							bad("client %d, key %q: Initial event %+v; want the baseline at %v, first", lw.client, key, ev, base[lw.key])
						}
						initial = true
						continue
					}
					if !initial {
						bad("client %d, key %q: event %+v before the Initial event", lw.client, key, ev)
					}
					delivered.Add(1)
					se := seenEvent{v: ver{ev.Version.Wall, ev.Version.Counter}, resync: ev.Resync, del: ev.Op == sskv.OpDelete}
					if ev.Key != key {
						bad("client %d, watcher of %q: event for key %q", lw.client, key, ev.Key)
					}
					if ev.Version.Node != storeNode && !(se.del && ev.Version.IsZero()) {
						bad("client %d, key %q: version %v not from the store's clock (%q)", lw.client, key, ev.Version, storeNode)
					}
					if ev.Op == sskv.OpSet {
						id, ok := parseLoadValue(key, ev.Value)
						if !ok {
							bad("client %d, key %q: value %q is not one of this key's writes", lw.client, key, ev.Value)
						}
						se.id = id
					}
					lw.evs = append(lw.evs, se)
					if se.v.cmp(lw.last) > 0 {
						lw.last = se.v
					}
					if set == nil {
						check()
					}
				case <-set:
					set = nil
					check()
				}
			}
		})
	}

	// Write: one writer per client, each paced to rate/100 writes per
	// second on random keys, with one write in flight at a time.
	var (
		writeID   atomic.Uint64
		failed    atomic.Int64
		failMu    sync.Mutex
		failFirst error
		writers   sync.WaitGroup
		stop      = make(chan struct{})
		acks      = make([][]ack, loadClients)
		fails     = make([][]uint64, loadClients) // ids of the writes whose Set failed
	)
	period := time.Duration(float64(time.Second) * loadClients / float64(rate))
	seed := uint64(time.Now().UnixNano())
	loadStart := time.Now()
	for i, c := range clients {
		writers.Go(func() {
			rnd := rand.New(rand.NewPCG(seed, uint64(i)))
			tick := time.NewTicker(period)
			defer tick.Stop()
			// Start the writers out of phase.
			select {
			case <-time.After(time.Duration(rnd.Int64N(int64(period)))):
			case <-stop:
				return
			}
			for {
				k := rnd.IntN(loadKeys)
				id := writeID.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				res, err := c.Set(ctx, keys[k], loadValue(keys[k], id), sskv.SetOptions{})
				cancel()
				if err != nil {
					// The outcome is unknown: the write may still show up.
					failed.Add(1)
					fails[i] = append(fails[i], id)
					failMu.Lock()
					if failFirst == nil {
						failFirst = err
					}
					failMu.Unlock()
				} else {
					acks[i] = append(acks[i], ack{key: k, v: ver{res.Version.Wall, res.Version.Counter}, id: id})
					if res.Version.Node != storeNode || !res.Applied {
						bad("write %d to %q: applied %v, version %v", id, keys[k], res.Applied, res.Version)
					}
				}
				select {
				case <-tick.C:
				case <-stop:
					return
				}
			}
		})
	}
	time.Sleep(dur) // the load's duration, not a wait for a condition
	close(stop)
	writers.Wait()
	loadTime := time.Since(loadStart)

	// The last acknowledged version of each key, and each key's writes in
	// version order.
	perKey := make([][]ack, loadKeys)
	nAcks := 0
	for _, as := range acks {
		for _, a := range as {
			perKey[a.key] = append(perKey[a.key], a)
		}
		nAcks += len(as)
	}
	targets = make([]ver, loadKeys)
	for k, as := range perKey {
		slices.SortFunc(as, func(a, b ack) int { return a.v.cmp(b.v) })
		targets[k] = base[k]
		if len(as) > 0 {
			targets[k] = as[len(as)-1].v
		}
		for j := 1; j < len(as); j++ {
			if as[j].v == as[j-1].v {
				t.Errorf("key %q: writes %d and %d both acknowledged with version %v", keys[k], as[j-1].id, as[j].id, as[j].v)
			}
		}
	}
	close(targetsSet)

	// Wait until every watcher has caught up, driven by the watchers.
	drainStart := time.Now()
	timer := time.NewTimer(loadDrainTimeout)
	drained := true
	select {
	case <-allReached:
		timer.Stop()
	case <-timer.C:
		drained = false
	}
	drainTime := time.Since(drainStart)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapInuse := ms.HeapInuse
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heapLive := ms.HeapAlloc
	closeAll()
	consumers.Wait()
	if !drained {
		t.Errorf("after %v, %d of %d watchers had not caught up with the last acknowledged write of their key (details below)",
			loadDrainTimeout, remaining.Load(), len(watches))
	}

	// Check every watcher against the acknowledged writes of its key.
	var (
		resyncs, covered, lost, disorder, unknown, reexec int
		problems                                          []string
	)
	report := func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	// What became of every write, by id: acknowledged (with its version)
	// or failed (outcome unknown).
	ackOf := make(map[uint64]ver, nAcks)
	failedIDs := make(map[uint64]bool)
	for i := range acks {
		for _, a := range acks[i] {
			ackOf[a.id] = a.v
		}
		for _, id := range fails[i] {
			failedIDs[id] = true
		}
	}
	for _, lw := range watches {
		as := perKey[lw.key]
		key := keys[lw.key]
		last, ai := base[lw.key], 0
		for n, e := range lw.evs {
			if e.resync {
				resyncs++
			}
			if e.del {
				disorder++
				report("client %d, key %q, event %d: a deletion (Resync %v, version %v); nothing deletes in this test", lw.client, key, n, e.resync, e.v)
				continue
			}
			if e.v.cmp(last) <= 0 {
				disorder++
				report("client %d, key %q, event %d: version %v (write %d, Resync %v) not after the previous %v", lw.client, key, n, e.v, e.id, e.resync, last)
				continue
			}
			// Acknowledged writes before this event were not delivered one
			// by one: a Resync event covers them, any other event skipped
			// them.
			for ; ai < len(as) && as[ai].v.cmp(e.v) < 0; ai++ {
				if e.resync {
					covered++
				} else {
					lost++
					report("client %d, key %q: write %d (version %v) not delivered; the next event is write %d (version %v)", lw.client, key, as[ai].id, as[ai].v, e.id, e.v)
				}
			}
			switch {
			case ai < len(as) && as[ai].v == e.v:
				if e.resync {
					covered++
				}
				if e.id != as[ai].id {
					disorder++
					report("client %d, key %q: event at version %v carries write %d, acknowledged as write %d", lw.client, key, e.v, e.id, as[ai].id)
				}
				ai++
			case failedIDs[e.id]:
				unknown++ // a write whose Set failed: its outcome was unknown
			case ackOf[e.id] != (ver{}):
				// The write was acknowledged at another version: it was
				// executed twice, a request in flight across a reconnect
				// being sent again (QoS 1 is at-least-once), and the
				// client took one of the two responses (see the package
				// documentation). Only a lost connection causes it.
				reexec++
			default:
				disorder++
				report("client %d, key %q: event at version %v (write %d) matches no write (acknowledged at %v)",
					lw.client, key, e.v, e.id, ackOf[e.id])
			}
			last = e.v
		}
		for ; ai < len(as); ai++ {
			lost++
			report("client %d, key %q: write %d (version %v) never delivered; last event at %v", lw.client, key, as[ai].id, as[ai].v, last)
		}
	}

	expected := 0
	for _, lw := range watches {
		expected += len(perKey[lw.key])
	}
	rss := "unavailable"
	if kb, ok := vmHWM(); ok {
		rss = fmt.Sprintf("%.0f MiB", float64(kb)/1024)
	}
	t.Logf("setup: %d clients connected, %d keys set and %d watches registered in %v", loadClients, loadKeys, len(watches), setupTime.Round(time.Millisecond))
	t.Logf("writes: %d acknowledged in %v (%.0f/s, target %d/s), %d failed (outcome unknown)",
		nAcks, loadTime.Round(time.Millisecond), float64(nAcks)/loadTime.Seconds(), rate, failed.Load())
	t.Logf("notifications: %d delivered (%d expected one by one) in %v + %v drain (%.0f/s)",
		delivered.Load(), expected, loadTime.Round(time.Millisecond), drainTime.Round(time.Millisecond),
		float64(delivered.Load())/(loadTime+drainTime).Seconds())
	t.Logf("resync: %d Resync events, covering %d acknowledged writes (the ones they report and the ones skipped before them); "+
		"%d events of failed writes, %d of acknowledged writes executed twice across a reconnect",
		resyncs, covered, unknown, reexec)
	t.Logf("memory: peak RSS %s (VmHWM of the whole process: the test binary, the 100 clients and the in-process store; "+
		"with -race, mostly the race detector's), Go heap in use %.0f MiB at the end of the load (%.0f MiB live after a GC)",
		rss, float64(heapInuse)/(1<<20), float64(heapLive)/(1<<20))
	t.Logf("load: %d clients, %d keys, %d watches, %v (race %v): %.0f writes/s, %.0f notifications/s, %d Resync events, peak RSS %s, heap in use %.0f MiB",
		loadClients, loadKeys, len(watches), dur, raceEnabled(), float64(nAcks)/loadTime.Seconds(),
		float64(delivered.Load())/(loadTime+drainTime).Seconds(), resyncs, rss, float64(heapInuse)/(1<<20))

	if failFirst != nil {
		t.Logf("first failed write: %v", failFirst)
	}
	if n := badEvents.Load(); n > 0 {
		t.Errorf("%d malformed events or writes, first: %s", n, strings.Join(badSample, "; "))
	}
	if lost > 0 || disorder > 0 {
		t.Errorf("%d acknowledged writes lost and %d events out of order, duplicated or wrong; first:\n%s",
			lost, disorder, strings.Join(problems, "\n"))
	}
	if nAcks == 0 {
		t.Errorf("no write was acknowledged")
	}
}

// vmHWM returns the process's peak resident set size in KiB, from
// /proc/self/status, or false where there is none.
func vmHWM() (int64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb, err == nil
		}
	}
	return 0, false
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, st := range bi.Settings {
		if st.Key == "-race" {
			return st.Value == "true"
		}
	}
	return false
}
