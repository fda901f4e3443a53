// Command rwconfig shows a fenced read-write lock (lock.RWMutex) guarding a
// shared configuration on the state store.
//
//	go run ./examples/rwconfig
//
// It starts a local state store in-process (or uses -addr). Two readers read
// the configuration at once, under RLock. A writer asks for the lock: it
// waits for the readers inside, while a reader that comes after it waits
// for the writer (writers first, so a stream of readers cannot starve it).
// The writer updates the configuration with a fenced write: its token is
// newer than every reader's before it. Then one of the first readers, which
// decided to "fix" the configuration from what it had read, writes with its
// reader's token: the state store rejects it, because the writer's newer
// token has fenced the key. Its own fenced writer refuses even to send.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func main() {
	addr := flag.String("addr", "", "state store `address`; empty: start a local state store in-process")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "rwconfig:", err)
		os.Exit(1)
	}
}

const (
	lockName  = "demo/config-lock"
	configKey = "demo/config"
)

// run plays the demo and writes its narrative to out.
func run(ctx context.Context, out io.Writer, addr string) error {
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Fprintf(out, "%6.3fs  %-2s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}
	if addr == "" {
		srv, err := localstore.Start(localstore.Config{})
		if err != nil {
			return err
		}
		defer srv.Close()
		addr = srv.Addr()
		say("", "local state store listening on %s", addr)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// Each participant has a client of its own, as separate processes would.
	var (
		clients = map[string]*sskv.Client{}
		rw      = map[string]*lock.RWMutex{}
	)
	for _, id := range []string{"R1", "R2", "R3", "W"} {
		c, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: "rwconfig-" + id})
		if err != nil {
			return err
		}
		defer c.Close()
		m, err := lock.NewRWMutex(c, lock.RWMutexConfig{Name: lockName, HolderID: id, TTL: 5 * time.Second})
		if err != nil {
			return err
		}
		defer m.Close(context.Background())
		clients[id], rw[id] = c, m
	}
	if err := clear(ctx, clients["W"]); err != nil {
		return err
	}

	// Two readers read the configuration at once.
	for _, id := range []string{"R1", "R2"} {
		if err := rw[id].RLock(ctx); err != nil {
			return err
		}
		res, err := clients[id].Get(ctx, configKey)
		if err != nil {
			return err
		}
		say(id, "reads %s = %q under RLock (token %s)", configKey, res.Value, rw[id].Token())
	}
	r1Token := rw["R1"].Token()

	// The writer waits for them; a reader after it waits for the writer.
	wLocked := make(chan error, 1)
	go func() { wLocked <- rw["W"].Lock(ctx) }()
	say("W", "asks for the lock: waits while R1 and R2 read")
	if err := waitGate(ctx, clients["W"], "W"); err != nil {
		return err
	}
	r3Locked := make(chan error, 1)
	go func() { r3Locked <- rw["R3"].RLock(ctx) }()
	say("R3", "asks to read after W: waits behind the writer")
	for _, id := range []string{"R1", "R2"} {
		if err := rw[id].RUnlock(ctx); err != nil {
			return err
		}
		say(id, "done reading")
	}

	if err := <-wLocked; err != nil {
		return err
	}
	say("W", "holds the lock alone; token %s, newer than the readers'", rw["W"].Token())
	if _, err := fenced.New(clients["W"], rw["W"]).Set(ctx, configKey, []byte("mode=v2"), sskv.SetOptions{}); err != nil {
		return err
	}
	say("W", "wrote %s = \"mode=v2\" through its fenced writer", configKey)
	select {
	case err := <-r3Locked:
		return fmt.Errorf("R3 got in beside the writer (%v)", err)
	default:
	}
	if err := rw["W"].Unlock(ctx); err != nil {
		return err
	}
	say("W", "done writing")
	if err := <-r3Locked; err != nil {
		return err
	}
	res, err := clients["R3"].Get(ctx, configKey)
	if err != nil {
		return err
	}
	say("R3", "reads %s = %q (token %s)", configKey, res.Value, rw["R3"].Token())
	if err := rw["R3"].RUnlock(ctx); err != nil {
		return err
	}

	// R1, from what it read before W's update, turns writer: with its
	// reader's token, older than W's.
	_, err = clients["R1"].Set(ctx, configKey, []byte("mode=v1 (from R1, stale)"), sskv.SetOptions{FencingToken: r1Token})
	if !errors.Is(err, sskv.ErrFencingTokenLower) {
		return fmt.Errorf("R1's stale write was not refused for its token: %v", err)
	}
	say("R1", "turns writer with its read token %s: REJECTED by the state store: %v", r1Token, strings.TrimPrefix(err.Error(), "sskv: "))
	_, err = fenced.New(clients["R1"], rw["R1"]).Set(ctx, configKey, []byte("mode=v1 (from R1)"), sskv.SetOptions{})
	if err == nil {
		return errors.New("R1's fenced writer sent a write without a holding")
	}
	say("R1", "its fenced writer refuses even to send: it holds nothing (%v)", err)

	final, err := clients["W"].Get(ctx, configKey)
	if err != nil {
		return err
	}
	say("", "%s = %q: the stale reader's write did not land", configKey, final.Value)
	return nil
}

// waitGate returns once the participant id holds the lock's gate: a writer
// that took it waits for the readers inside, and readers queue behind it.
func waitGate(ctx context.Context, c *sskv.Client, id string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := c.Watch(ctx, lock.RWMutexGate(lockName))
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.Events() {
		if ev.Op == sskv.OpSet && lock.ParseHolder(ev.Value, ev.Version).ID == id {
			return nil
		}
	}
	return fmt.Errorf("watching the gate: %w", context.Cause(ctx))
}

// clear removes what an earlier run against the same store left: the
// configuration, fenced by that run's token (any token from now on is
// newer), with a first value.
func clear(ctx context.Context, c *sskv.Client) error {
	now := hlc.Timestamp{Wall: time.Now().UnixMilli(), Node: "demo"}
	if _, err := c.Del(ctx, configKey, sskv.DelOptions{FencingToken: now}); err != nil {
		return fmt.Errorf("clearing %s: %w", configKey, err)
	}
	_, err := c.Set(ctx, configKey, []byte("mode=v1"), sskv.SetOptions{})
	return err
}
