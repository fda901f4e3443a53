package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// persistProc is a statestore process persisting keys, which a test kills
// with SIGKILL (kill -9) and starts again on the same address and data
// directory.
type persistProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	out    strings.Builder // its stderr, once exited is closed
}

// freeAddr returns a loopback address with a port free just now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startPersisting starts the program on addr with args and waits until it
// listens. It is killed at the end of the test if still running.
func startPersisting(t *testing.T, addr string, args ...string) *persistProc {
	t.Helper()
	p := &persistProc{cmd: exec.Command(storeBinary(t), append([]string{"-listen", addr}, args...)...), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	up := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.out.WriteString(sc.Text() + "\n")
			if listening.MatchString(sc.Text()) {
				close(up)
			}
		}
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	select {
	case <-up:
	case <-p.exited:
		t.Fatalf("statestore exited at start:\n%s", p.out.String())
	case <-time.After(processTimeout):
		t.Fatal("statestore did not listen")
	}
	return p
}

// kill ends the process with SIGKILL and waits for it.
func (p *persistProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// killRounds is the number of kills of a kill -9 test: DSSLOCK_KILL_ROUNDS,
// default 5.
func killRounds(t *testing.T) int {
	t.Helper()
	s := os.Getenv("DSSLOCK_KILL_ROUNDS")
	if s == "" {
		return 5
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("DSSLOCK_KILL_ROUNDS=%q: want a count of kills", s)
	}
	return n
}

// acked is the newest acknowledged write of a key.
type acked struct {
	version hlc.Timestamp
	value   string
}

// TestStandaloneKill9 kills a persisting store with SIGKILL at random
// moments under a load of writes, and restarts it on the same data
// directory: every write it acknowledged is there after the restart, or a
// newer one is, and every version it issues after the restart, in a write
// persisted or not, is above every version it issued before the kill.
// DSSLOCK_KILL_ROUNDS sets the number of kills (default 5; the issue asks
// for at least 100).
func TestStandaloneKill9(t *testing.T) {
	rounds := killRounds(t)
	dir, addr := t.TempDir(), freeAddr(t)
	args := []string{"-data-dir", dir, "-persist", "dynamic"}
	const writers, keysPerWriter = 16, 2
	last := map[string]acked{}
	var issued hlc.Timestamp // the newest version seen before the last kill
	var writes int           // persisted writes acknowledged, over all rounds
	p := startPersisting(t, addr, args...)
	for round := range rounds {
		c, err := sskv.Dial(context.Background(), sskv.Config{Addr: addr, ClientID: fmt.Sprintf("kill9-%d", round),
			ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond, RequestTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("round %d: Dial: %v", round, err)
		}
		// After the restart: what was acknowledged is there, or newer.
		ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
		for key, want := range last {
			r, err := c.Get(ctx, key)
			if err != nil {
				t.Fatalf("round %d: GET %s: %v", round, key, err)
			}
			switch cmp := r.Version.Compare(want.version); {
			case !r.Found || cmp < 0:
				t.Fatalf("round %d: %s acknowledged at %v (%q) is %+v after the kill", round, key, want.version, want.value, r)
			case cmp == 0 && string(r.Value) != want.value:
				t.Fatalf("round %d: %s at %v holds %q, acknowledged %q", round, key, want.version, r.Value, want.value)
			}
		}
		if round > 0 {
			s, err := c.Set(ctx, "unpersisted", []byte("x"), sskv.SetOptions{})
			if err != nil {
				t.Fatalf("round %d: SET: %v", round, err)
			}
			if s.Version.Compare(issued) <= 0 {
				t.Fatalf("round %d: version %v after the restart, not above %v issued before the kill", round, s.Version, issued)
			}
		}
		cancel()

		// A load of persisted writes (and one writer of a key not
		// persisted), killed at a random moment.
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		stop := make(chan struct{})
		load, endLoad := context.WithCancel(context.Background())
		note := func(v hlc.Timestamp) {
			mu.Lock()
			if v.Compare(issued) > 0 {
				issued = v
			}
			mu.Unlock()
		}
		for w := range writers + 1 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("k-%d-%d", w, i%keysPerWriter)
					value := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					persist := w < writers
					if !persist {
						key = "unpersisted"
					}
					s, err := c.Set(load, key, []byte(value), sskv.SetOptions{Persist: persist})
					if err != nil {
						return // the store is gone: the outcome is unknown
					}
					note(s.Version)
					if persist {
						mu.Lock()
						if s.Version.Compare(last[key].version) > 0 {
							last[key] = acked{s.Version, value}
						}
						writes++
						mu.Unlock()
					}
				}
			}()
		}
		time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond) // the random moment of the kill, not a wait for a signal
		p.kill()
		close(stop)
		endLoad()
		wg.Wait()
		_ = c.Close()
		p = startPersisting(t, addr, args...)
	}
	if len(last) == 0 {
		t.Fatal("no write was acknowledged in any round")
	}
	t.Logf("%d kills; %d persisted writes acknowledged, %d keys checked after each restart", rounds, writes, len(last))
}

// TestStandalonePersistedExpiryAndFence: across a kill -9 and restart, a
// key's expiry keeps running (one whose deadline passed while the store
// was down is gone, one whose deadline is ahead comes back), and a fenced
// key still refuses a write with an older token.
func TestStandalonePersistedExpiryAndFence(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	args := []string{"-data-dir", dir, "-persist", "all"}
	p := startPersisting(t, addr, args...)
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: addr, ClientID: "expiry-fence",
		ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
	defer cancel()
	token := hlc.Timestamp{Wall: time.Now().UnixMilli(), Counter: 7, Node: "writer"}
	if _, err := c.Set(ctx, "fenced", []byte("v"), sskv.SetOptions{FencingToken: token}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "short", []byte("s"), sskv.SetOptions{Expiry: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "long", []byte("l"), sskv.SetOptions{Expiry: time.Hour}); err != nil {
		t.Fatal(err)
	}
	p.kill()
	time.Sleep(300 * time.Millisecond) // the store's down time, not a wait for a signal
	startPersisting(t, addr, args...)
	if r, err := c.Get(ctx, "short"); err != nil || r.Found {
		t.Fatalf("a key whose expiry passed while the store was down: %+v, %v", r, err)
	}
	if r, err := c.Get(ctx, "long"); err != nil || !r.Found {
		t.Fatalf("a key with an hour to live: %+v, %v", r, err)
	}
	older := token
	older.Counter--
	if _, err := c.Set(ctx, "fenced", []byte("w"), sskv.SetOptions{FencingToken: older}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("SET with an older token after the restart: %v, want ErrFencingTokenLower", err)
	}
	if _, err := c.Set(ctx, "fenced", []byte("w"), sskv.SetOptions{FencingToken: token}); err != nil {
		t.Fatalf("SET with the key's token after the restart: %v", err)
	}
}

// TestStandaloneDataDirFaults: the program refuses to start on a data
// directory another statestore process uses, and on a corrupt data file,
// saying why.
func TestStandaloneDataDirFaults(t *testing.T) {
	dir := t.TempDir()
	startPersisting(t, freeAddr(t), "-data-dir", dir, "-persist", "all")
	out, err := exec.Command(storeBinary(t), "-listen", freeAddr(t), "-data-dir", dir, "-persist", "all").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another store") {
		t.Fatalf("a second process on the same directory: %v\n%s", err, out)
	}
	bad := t.TempDir()
	if err := os.WriteFile(bad+"/statestore.db", []byte(strings.Repeat("garbage!", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(storeBinary(t), "-listen", freeAddr(t), "-data-dir", bad, "-persist", "all").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "statestore.db") {
		t.Fatalf("a corrupt data file: %v\n%s", err, out)
	}
	if err := configErr("-data-dir", dir); err == nil {
		t.Error("-data-dir without -persist: no error")
	}
	if err := configErr("-persist", "all"); err == nil {
		t.Error("-persist all without -data-dir: no error")
	}
	if err := configErr("-persist", "sometimes", "-data-dir", dir); err == nil {
		t.Error("-persist sometimes: no error")
	}
}
