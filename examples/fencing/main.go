// Command fencing is dsslock's main demo: why a lease alone cannot keep two
// instances from acting at once, and how a fencing token does.
//
//	go run ./examples/fencing
//
// It starts a local state store in-process (or uses -addr), then plays the
// classic failure: instance A takes a lease and writes under it, then pauses
// (a GC pause, a frozen VM) past the lease's expiry. Instance B, watching the
// lease, takes it over the moment it expires and writes. A wakes up still
// believing it holds the lease and writes again: the state store rejects that
// write, because A's fencing token (its lease's version) is older than B's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func main() {
	addr := flag.String("addr", "", "state store `address`; empty: start a local state store in-process")
	lease := flag.Duration("lease", 2*time.Second, "lease duration")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *addr, *lease); err != nil {
		fmt.Fprintln(os.Stderr, "fencing:", err)
		os.Exit(1)
	}
}

const (
	lockKey = "demo/lease"
	dataKey = "demo/setpoint"
)

// run plays the demo and writes its narrative to out.
func run(ctx context.Context, out io.Writer, addr string, lease time.Duration) error {
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
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+4*lease)
	defer cancel()

	a, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: "instance-A"})
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: "instance-B"})
	if err != nil {
		return err
	}
	defer b.Close()
	// A fresh demo: remove what an earlier run against the same store left.
	if _, err := a.Del(ctx, lockKey, sskv.DelOptions{}); err != nil {
		return err
	}
	if res, err := a.Get(ctx, dataKey); err == nil && res.Found {
		// The key is fenced by an earlier run's token: any token from now on
		// is newer.
		now := hlc.Timestamp{Wall: time.Now().UnixMilli(), Node: "demo"}
		if _, err := a.Del(ctx, dataKey, sskv.DelOptions{FencingToken: now}); err != nil {
			return fmt.Errorf("clearing %s: %w", dataKey, err)
		}
	}

	take := sskv.SetOptions{Condition: sskv.IfNotExists, Expiry: lease}

	// A takes the lease and writes under it.
	resA, err := a.Set(ctx, lockKey, []byte("instance-A"), take)
	if err != nil {
		return err
	}
	if !resA.Applied {
		return errors.New("the lease is held by someone else; is another demo running?")
	}
	tokenA := resA.Version
	say("A", "took the lease for %v; fencing token %s", lease, tokenA)
	if _, err := a.Set(ctx, dataKey, []byte("21.0 (from A)"), sskv.SetOptions{FencingToken: tokenA}); err != nil {
		return err
	}
	say("A", "wrote %s = 21.0 with its token", dataKey)

	// B is on standby: it watches the lease and tries to take it whenever it
	// is deleted or expires.
	w, err := b.Watch(ctx, lockKey)
	if err != nil {
		return err
	}
	defer w.Stop()
	resB, err := b.Set(ctx, lockKey, []byte("instance-B"), take)
	if err != nil {
		return err
	}
	say("B", "standby: lease taken? %v (held by A); watching it", resB.Applied)

	say("A", "pauses (stop-the-world GC, frozen VM...) and does not renew")
	for !resB.Applied {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return fmt.Errorf("watch ended: %v", w.Err())
			}
			if ev.Op != sskv.OpDelete {
				continue
			}
			say("B", "saw the lease expire")
			if resB, err = b.Set(ctx, lockKey, []byte("instance-B"), take); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	tokenB := resB.Version
	say("B", "took the lease; fencing token %s", tokenB)
	if _, err := b.Set(ctx, dataKey, []byte("19.5 (from B)"), sskv.SetOptions{FencingToken: tokenB}); err != nil {
		return err
	}
	say("B", "wrote %s = 19.5 with its token", dataKey)

	// A wakes up, still believing it holds the lease, and writes.
	say("A", "wakes up, still believes it holds the lease, writes 22.0")
	_, err = a.Set(ctx, dataKey, []byte("22.0 (from A, stale)"), sskv.SetOptions{FencingToken: tokenA})
	switch {
	case errors.Is(err, sskv.ErrFencingTokenLower):
		say("A", "write REJECTED by the state store: %v", err)
	case err != nil:
		return err
	default:
		return errors.New("the stale write was accepted: fencing failed")
	}
	final, err := b.Get(ctx, dataKey)
	if err != nil {
		return err
	}
	say("", "%s = %q: only the current lease holder's writes landed", dataKey, final.Value)
	return nil
}
