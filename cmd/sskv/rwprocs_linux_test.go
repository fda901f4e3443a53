package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// rwRun is one "sskv lock -r|-w" process of TestLockRWProcesses.
type rwRun struct {
	id               int
	write            bool
	launched, exited time.Time
	killed           time.Time // zero unless the test killed it (kill -9)
	// From the journal: the command's start and end, and its token.
	in, out time.Time
	token   hlc.Timestamp
}

// 8 processes at once, each running "sskv lock -r" or "sskv lock -w" again
// and again (2 of them writing, 6 mostly reading), while the test kills
// one with SIGKILL every 0.4 to 1 s and restarts the store (persisting
// every key) twice: never a writer's command with another command, a
// writer's token newer than that of every command that ended before it
// began, and a writer waits for a bounded number of reads.
func TestLockRWProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("8 processes for 8 s")
	}
	srv, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	addr := srv.Addr()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	journal := filepath.Join(t.TempDir(), "journal")
	// The command logs its start and end; SIGTERM (the lock lost) ends it
	// at once, logging its end. A SIGKILL (sskv killed: its supervisor
	// kills the command) logs nothing: the end is then the kill's time.
	script := `trap 'echo "out $1 $(date +%s%N)" >> "$0"; exit 0' TERM
echo "in $1 $DSSLOCK_TOKEN $(date +%s%N)" >> "$0"
sleep "$2" & wait $!
echo "out $1 $(date +%s%N)" >> "$0"`
	const (
		procs = 8
		phase = 8 * time.Second
		ttl   = "2s"
	)
	ctx, cancel := context.WithTimeout(context.Background(), phase)
	defer cancel()
	var (
		mu      sync.Mutex
		runs    []*rwRun
		running = map[int]*exec.Cmd{}
		wg      sync.WaitGroup
	)
	for p := range procs {
		rng := rand.New(rand.NewPCG(uint64(p), 37))
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				r := &rwRun{id: len(runs), write: p < 2 || rng.IntN(4) == 0} // 2 writers, 6 mostly readers
				runs = append(runs, r)
				mu.Unlock()
				mode := "-r"
				if r.write {
					mode = "-w"
				}
				work := fmt.Sprintf("0.%02d", 2+rng.IntN(6))
				cmd := exec.Command(self, "-addr", addr, "lock", mode, "-ttl", ttl, "rw", "--", "sh", "-c", script, journal, strconv.Itoa(r.id), work)
				cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
				r.launched = time.Now()
				if err := cmd.Start(); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				running[r.id] = cmd
				mu.Unlock()
				_ = cmd.Wait() // a store down, a kill, a lost lock: all expected here
				mu.Lock()
				delete(running, r.id)
				r.exited = time.Now()
				mu.Unlock()
			}
		})
	}
	// The faults: a kill -9 of a running sskv every 0.4 to 1 s, and two
	// store restarts.
	rng := rand.New(rand.NewPCG(37, 37))
	restarts := []time.Duration{phase / 3, 2 * phase / 3}
	start := time.Now()
	kills := 0
	for ctx.Err() == nil {
		timer := time.NewTimer(time.Duration(400+rng.IntN(600)) * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
		if ctx.Err() != nil {
			break
		}
		if len(restarts) > 0 && time.Since(start) > restarts[0] {
			restarts = restarts[1:]
			next, err := srv.Restart(context.Background(), 200*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			srv = next
			t.Cleanup(func() { _ = next.Close() })
			continue
		}
		mu.Lock()
		for id, cmd := range running { // a random one: map order
			if cmd.Process.Kill() == nil {
				runs[id].killed = time.Now()
				kills++
			}
			break
		}
		mu.Unlock()
	}
	// The end: kill the runs still going (their keys are left to expire).
	mu.Lock()
	for id, cmd := range running {
		if cmd.Process.Kill() == nil {
			runs[id].killed = time.Now()
		}
	}
	mu.Unlock()
	wg.Wait()

	// Read the journal into the runs.
	f, err := os.Open(journal)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 {
			t.Fatalf("journal line %q", sc.Text())
		}
		id, err := strconv.Atoi(fs[1])
		ns, err2 := strconv.ParseInt(fs[len(fs)-1], 10, 64)
		if err != nil || err2 != nil || id >= len(runs) {
			t.Fatalf("journal line %q", sc.Text())
		}
		r, at := runs[id], time.Unix(0, ns)
		switch {
		case fs[0] == "in" && len(fs) == 4:
			if r.token, err = hlc.Parse(fs[2]); err != nil {
				t.Fatalf("journal line %q: %v", sc.Text(), err)
			}
			r.in = at
		case fs[0] == "out" && r.out.IsZero():
			r.out = at
		default:
			t.Fatalf("journal line %q", sc.Text())
		}
	}
	var held []*rwRun
	for _, r := range runs {
		if r.in.IsZero() {
			continue
		}
		if r.out.IsZero() {
			// No end logged: killed by its supervisor when sskv was
			// killed (a next holder waits for the key's expiry, over a
			// second later), or gone by the time sskv exited.
			r.out = r.exited
			if !r.killed.IsZero() {
				r.out = r.killed.Add(300 * time.Millisecond)
			}
		}
		held = append(held, r)
	}
	writes, most := 0, 0
	for _, w := range held {
		if !w.write {
			continue
		}
		writes++
		readsAhead := 0
		for _, x := range held {
			if x == w {
				continue
			}
			if x.in.Before(w.out) && w.in.Before(x.out) {
				t.Errorf("run %d wrote (%v to %v) while run %d (write %v) held (%v to %v)", w.id, w.in, w.out, x.id, x.write, x.in, x.out)
			}
			if x.out.Before(w.in) && !w.token.After(x.token) {
				t.Errorf("run %d's write token %v is not after run %d's %v, which ended before it began", w.id, w.token, x.id, x.token)
			}
			if !x.write && x.in.After(w.launched) && x.in.Before(w.in) {
				readsAhead++
			}
		}
		most = max(most, readsAhead)
	}
	t.Logf("%d runs, %d held (%d writes), %d killed, 2 store restarts; a writer waited for at most %d reads that began after it was launched",
		len(runs), len(held), writes, kills, most)
	if writes == 0 || len(held) == writes {
		t.Errorf("%d writes of %d holdings: want some of each", writes, len(held))
	}
	// Readers that come after a waiting writer wait for it: a writer waits
	// at most for the reads of the processes ahead of it on the gate (7),
	// and for those that slip in before it reaches the gate (it starts a
	// process, dials, reads the record); a kill or a restart can add a
	// round.
	if most > 4*procs {
		t.Errorf("a writer waited for %d reads that began after its launch; want a bound of about %d", most, 2*procs)
	}
}
