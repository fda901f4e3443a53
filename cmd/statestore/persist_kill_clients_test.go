package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// keyLog is what a writer knows of one of its keys: its last acknowledged
// write (a SET at version, or a DEL or VDEL of the value at version), and
// whether a later write was in flight when the store was killed (its
// outcome unknown).
type keyLog struct {
	acked    bool
	deleted  bool
	version  hlc.Timestamp
	value    string
	inFlight bool
}

// TestStandaloneKill9ClientsDelFence kills a store persisting all keys
// with SIGKILL under writes from several clients, each on its own
// connection: SETs, DELs and VDELs of their keys, and fenced SETs. After
// each restart: a key acknowledged as set is there at that version or a
// newer one (gone only if a later write of it was in flight); a key
// acknowledged as deleted stays deleted (or holds a newer version from a
// write in flight), never its old version again; a fenced key refuses the
// token older than the last acknowledged one; and versions issued are
// above every version seen before the kill.
func TestStandaloneKill9ClientsDelFence(t *testing.T) {
	rounds := killRounds(t)
	dir, addr := t.TempDir(), freeAddr(t)
	args := []string{"-data-dir", dir, "-persist", "all"}
	const writers, keysPerWriter = 8, 3
	logs := make([]map[string]*keyLog, writers)
	tokens := make([][]hlc.Timestamp, writers) // acknowledged fenced writes' tokens, in order
	for w := range logs {
		logs[w] = map[string]*keyLog{}
	}
	var (
		mu     sync.Mutex
		issued hlc.Timestamp // the newest version seen before the last kill
	)
	note := func(v hlc.Timestamp) {
		mu.Lock()
		if v.Compare(issued) > 0 {
			issued = v
		}
		mu.Unlock()
	}
	dial := func(round, w int) *sskv.Client {
		c, err := sskv.Dial(context.Background(), sskv.Config{Addr: addr, ClientID: fmt.Sprintf("kc-%d-%d", round, w),
			ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond, RequestTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("round %d: Dial: %v", round, err)
		}
		return c
	}
	p := startPersisting(t, addr, args...)
	checked := 0
	for round := range rounds {
		c := dial(round, writers)
		ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
		for w := range writers {
			for key, l := range logs[w] {
				if !l.acked {
					continue
				}
				r, err := c.Get(ctx, key)
				if err != nil {
					t.Fatalf("round %d: GET %s: %v", round, key, err)
				}
				checked++
				cmp := r.Version.Compare(l.version)
				switch {
				case l.deleted && r.Found && cmp <= 0:
					t.Fatalf("round %d: %s, deleted at %v (acknowledged), is back after the kill: %+v", round, key, l.version, r)
				case l.deleted && r.Found && !l.inFlight:
					t.Fatalf("round %d: %s, deleted at %v (acknowledged, nothing after), holds %+v after the kill", round, key, l.version, r)
				case l.deleted:
				case !r.Found && !l.inFlight:
					t.Fatalf("round %d: %s, set at %v (%q, acknowledged), is gone after the kill", round, key, l.version, l.value)
				case r.Found && cmp < 0:
					t.Fatalf("round %d: %s, set at %v (acknowledged), is at %v after the kill", round, key, l.version, r.Version)
				case r.Found && cmp == 0 && string(r.Value) != l.value:
					t.Fatalf("round %d: %s at %v holds %q, acknowledged %q", round, key, l.version, r.Value, l.value)
				case r.Found && cmp > 0 && !l.inFlight:
					t.Fatalf("round %d: %s, set at %v (acknowledged, nothing after), is at %v after the kill", round, key, l.version, r.Version)
				}
				l.inFlight = false
				if l.deleted != !r.Found || r.Found && cmp != 0 {
					l.acked = false // the write in flight happened: its outcome is not known here
				}
			}
			if n := len(tokens[w]); n >= 2 {
				old := tokens[w][n-2]
				_, err := c.Set(ctx, fmt.Sprintf("fenced-%d", w), []byte("stale"), sskv.SetOptions{FencingToken: old})
				if !errors.Is(err, sskv.ErrFencingTokenLower) {
					t.Fatalf("round %d: fenced-%d, written with token %v (acknowledged), took a write with older token %v after the kill: %v", round, w, tokens[w][n-1], old, err)
				}
			}
		}
		if round > 0 {
			s, err := c.Set(ctx, "after-kill", []byte("x"), sskv.SetOptions{})
			if err != nil {
				t.Fatalf("round %d: SET: %v", round, err)
			}
			if s.Version.Compare(issued) <= 0 {
				t.Fatalf("round %d: version %v after the restart, not above %v seen before the kill", round, s.Version, issued)
			}
		}
		cancel()
		_ = c.Close()

		stop := make(chan struct{})
		var wg sync.WaitGroup
		clients := make([]*sskv.Client, writers)
		for w := range writers {
			clients[w] = dial(round, w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, keys := clients[w], logs[w]
				rng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if i%4 == 3 { // a fenced write with a new token
						tok, err := c.Set(context.Background(), fmt.Sprintf("token-%d", w), []byte("t"), sskv.SetOptions{})
						if err != nil {
							return
						}
						note(tok.Version)
						s, err := c.Set(context.Background(), fmt.Sprintf("fenced-%d", w), []byte(fmt.Sprint(i)), sskv.SetOptions{FencingToken: tok.Version})
						if err != nil {
							return
						}
						note(s.Version)
						mu.Lock()
						tokens[w] = append(tokens[w], tok.Version)
						mu.Unlock()
						continue
					}
					key := fmt.Sprintf("k-%d-%d", w, rng.IntN(keysPerWriter))
					l := keys[key]
					if l == nil {
						l = &keyLog{}
						keys[key] = l
					}
					l.inFlight = true
					value := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					switch op := rng.IntN(5); {
					case op < 3 || !l.acked || l.deleted:
						s, err := c.Set(context.Background(), key, []byte(value), sskv.SetOptions{})
						if err != nil {
							return
						}
						note(s.Version)
						*l = keyLog{acked: true, version: s.Version, value: value}
					case op == 3:
						d, err := c.VDel(context.Background(), key, []byte(l.value), sskv.DelOptions{})
						if err != nil {
							return
						}
						if !d.Deleted || d.Version != l.version {
							t.Errorf("round %d: VDEL %s of %q at %v: %+v", round, key, l.value, l.version, d)
							return
						}
						*l = keyLog{acked: true, deleted: true, version: d.Version}
					default:
						d, err := c.Del(context.Background(), key, sskv.DelOptions{})
						if err != nil {
							return
						}
						if !d.Deleted || d.Version != l.version {
							t.Errorf("round %d: DEL %s at %v: %+v", round, key, l.version, d)
							return
						}
						*l = keyLog{acked: true, deleted: true, version: d.Version}
					}
				}
			}()
		}
		time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond) // the random moment of the kill, not a wait for a signal
		p.kill()
		close(stop)
		wg.Wait()
		for _, c := range clients {
			_ = c.Close()
		}
		if t.Failed() {
			return
		}
		p = startPersisting(t, addr, args...)
	}
	t.Logf("%d kills; %d key checks after restarts", rounds, checked)
}
