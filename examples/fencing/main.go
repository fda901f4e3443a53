// Command fencing is dsslock's main demo: why a lease alone cannot keep two
// instances from acting at once, and how packages lock and fenced do.
//
//	go run ./examples/fencing
//
// It starts a local state store in-process (or uses -addr), then plays the
// classic failure. Instance A takes the lock and writes under it; B waits
// for the lock. A freezes (a GC pause, a frozen VM): its renewals stop
// reaching the store, which the demo does by freezing A's connection in a
// fault-injecting proxy. A's lock gives up on A's own clock before the
// store can expire the key, and tells A's work to stop. B takes the lock
// once the key expires, and writes. A write of A's sent with its old token
// (one prepared before the pause) is rejected by the state store, because
// B's token is newer; A's fenced writer refuses even to send one.
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

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func main() {
	addr := flag.String("addr", "", "state store `address`; empty: start a local state store in-process")
	ttl := flag.Duration("ttl", 2*time.Second, "the lock's TTL (lease)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *addr, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "fencing:", err)
		os.Exit(1)
	}
}

const (
	lockKey = "demo/lock"
	dataKey = "demo/setpoint"
)

// run plays the demo and writes its narrative to out.
func run(ctx context.Context, out io.Writer, addr string, ttl time.Duration) error {
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
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+4*ttl)
	defer cancel()

	// A reaches the store through a proxy that can freeze its connection.
	proxy, err := faultproxy.Start(addr, faultproxy.Options{})
	if err != nil {
		return err
	}
	defer proxy.Close()
	ca, err := sskv.Dial(ctx, sskv.Config{Addr: proxy.Addr(), ClientID: "instance-A"})
	if err != nil {
		return err
	}
	defer ca.Close()
	cb, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: "instance-B"})
	if err != nil {
		return err
	}
	defer cb.Close()
	if err := clear(ctx, cb); err != nil {
		return err
	}

	cfg := lock.Config{Name: lockKey, TTL: ttl}
	cfg.HolderID = "instance-A"
	a, err := lock.New(ca, cfg)
	if err != nil {
		return err
	}
	defer a.Close(context.Background())
	cfg.HolderID = "instance-B"
	b, err := lock.New(cb, cfg)
	if err != nil {
		return err
	}
	defer b.Close(context.Background())

	// A takes the lock and writes under it.
	if err := a.Lock(ctx); err != nil {
		return err
	}
	rd := a.Config().RenewDeadline
	say("A", "took the lock (TTL %v, renewed every %v); fencing token %s", ttl, a.Config().RenewInterval, a.Token())
	wa := fenced.New(ca, a)
	if _, err := wa.Set(ctx, dataKey, []byte("21.0 (from A)"), sskv.SetOptions{}); err != nil {
		return err
	}
	say("A", "wrote %s = 21.0 through its fenced writer", dataKey)

	// B is on standby: Lock waits, on the key's notifications, until the
	// lock is free.
	bLocked := make(chan error, 1)
	go func() { bLocked <- b.Lock(ctx) }()
	say("B", "standby: waiting for the lock")

	proxy.Blackhole()
	say("A", "freezes (stop-the-world GC, frozen VM...): its renewals stop reaching the store")
	select {
	case <-a.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	say("A", "its lock gave up on A's own clock, %v after the last renewal was sent,", rd)
	say("", "   before the store can expire the key: %v", a.Err())
	say("", "   A's work is told to stop (lock.Context is cancelled)")

	if err := <-bLocked; err != nil {
		return err
	}
	say("B", "took the lock once A's lease expired; fencing token %s", b.Token())
	if _, err := fenced.New(cb, b).Set(ctx, dataKey, []byte("19.5 (from B)"), sskv.SetOptions{}); err != nil {
		return err
	}
	say("B", "wrote %s = 19.5 through its fenced writer", dataKey)

	proxy.Heal()
	say("A", "wakes up; a write it had prepared before the pause goes out with its old token")
	_, err = ca.Set(ctx, dataKey, []byte("22.0 (from A, stale)"), sskv.SetOptions{FencingToken: a.Token()})
	if !errors.Is(err, sskv.ErrFencingTokenLower) {
		return fmt.Errorf("the stale write was not refused for its token: %v", err)
	}
	say("A", "write REJECTED by the state store: %v", strings.TrimPrefix(err.Error(), "sskv: "))
	_, err = wa.Set(ctx, dataKey, []byte("22.5 (from A)"), sskv.SetOptions{})
	if !errors.Is(err, fenced.ErrStale) {
		return fmt.Errorf("the fenced writer of A did not refuse: %v", err)
	}
	say("A", "its fenced writer refuses even to send: %v", err)

	final, err := cb.Get(ctx, dataKey)
	if err != nil {
		return err
	}
	say("", "%s = %q: only the current holder's writes landed", dataKey, final.Value)
	if err := b.Unlock(ctx); err != nil {
		return err
	}
	return nil
}

// clear removes what an earlier run against the same store left: the lock,
// and the data key, fenced by that run's token (any token from now on is
// newer).
func clear(ctx context.Context, c *sskv.Client) error {
	if _, err := c.Del(ctx, lockKey, sskv.DelOptions{}); err != nil {
		return err
	}
	now := hlc.Timestamp{Wall: time.Now().UnixMilli(), Node: "demo"}
	if _, err := c.Del(ctx, dataKey, sskv.DelOptions{FencingToken: now}); err != nil {
		return fmt.Errorf("clearing %s: %w", dataKey, err)
	}
	return nil
}
