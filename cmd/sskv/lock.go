package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Environment of the command run by "sskv lock".
const (
	envToken = "DSSLOCK_TOKEN"
	envLock  = "DSSLOCK_LOCK"
	envSlot  = "DSSLOCK_SLOT" // with -n: the semaphore's slot held
)

// releaseTimeout bounds the release of the lock after the command exits.
const releaseTimeout = 10 * time.Second

// holder is what runLocked needs of a lock.Lock or a lock.Semaphore.
type holder interface {
	Done() <-chan struct{}
	Err() error
	Token() hlc.Timestamp
}

// sayHolder says on stderr what holds the key of the lock name, if the lock
// will wait for it: a holder's name alone (a value with no newline), which
// is what another client's lock writes (a Lock without FenceKey, the SDK's
// leased lock), but also what "sskv set NAME VALUE" may have written without
// expiry, never to be released. The store does not tell whether a key
// expires, so the lock cannot tell these apart, and waits; the user can,
// once told. Any other value makes the lock fail at once, saying what it
// is, and a read that fails leaves it to the lock to report.
func sayHolder(ctx context.Context, c *sskv.Client, name string, stderr io.Writer) {
	res, err := c.Get(ctx, name)
	if err != nil || !res.Found || len(res.Value) == 0 || bytes.IndexByte(res.Value, '\n') >= 0 {
		return
	}
	fmt.Fprintf(stderr, "sskv: lock %q is held by %s; waiting for its release or expiry "+
		"(a value set by hand without expiry is never released: 'sskv del %s')\n", name, quoteHolder(res.Value), name)
}

// quoteHolder quotes a holder's name for a message, cut short if long.
func quoteHolder(v []byte) string {
	const max = 64
	if len(v) > max {
		return fmt.Sprintf("%q... (%d bytes)", v[:max], len(v))
	}
	return strconv.Quote(string(v))
}

// withoutLoss is the handler of the lock's logger without -v: the lock's
// warnings reach the user (such as a key left unchanged for 10 TTLs, which
// may never be released), but not its "lost", which sskv reports itself,
// in its own words.
type withoutLoss struct{ slog.Handler }

func (h withoutLoss) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "lost" {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h withoutLoss) WithAttrs(as []slog.Attr) slog.Handler {
	return withoutLoss{h.Handler.WithAttrs(as)}
}

func (h withoutLoss) WithGroup(name string) slog.Handler {
	return withoutLoss{h.Handler.WithGroup(name)}
}

// lockKind says what kind of lock "sskv lock" holds: a Lock, one of limit
// slots of a Semaphore (limit > 0), or an RWMutex for reading or writing.
type lockKind struct {
	limit       int
	read, write bool
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runLocked waits for the lock name (of kind k), runs argv while holding it
// and returns the exit status: argv's, or exitLost if the lock was lost
// meanwhile.
func runLocked(ctx context.Context, c *sskv.Client, name string, k lockKind, argv []string, ttl, maxHold time.Duration, log *slog.Logger, stdin io.Reader, stdout, stderr io.Writer) int {
	limit := k.limit
	var (
		l       holder
		acquire func(context.Context) error
		release func(context.Context) error
		grace   time.Duration // see below
		env     = []string{envLock + "=" + name}
	)
	switch {
	case k.read || k.write:
		m, err := lock.NewRWMutex(c, lock.RWMutexConfig{Name: name, TTL: ttl, MaxHold: maxHold, Logger: log})
		if err != nil {
			return fail(stderr, usagef("%v", err))
		}
		defer func() { _ = m.Close(context.Background()) }() // after the release: closes the gate's idle queue
		l, acquire, release = m, m.RLock, m.RUnlock
		if k.write {
			acquire, release = m.Lock, m.Unlock
		}
		grace = m.Config().TTL - m.Config().RenewDeadline
	case limit == 0:
		lk, err := lock.New(c, lock.Config{Name: name, TTL: ttl, MaxHold: maxHold, Logger: log})
		if err != nil {
			return fail(stderr, usagef("%v", err)) // err says "lock: ..." itself
		}
		l, acquire, release = lk, lk.Lock, lk.Unlock
		grace = lk.Config().TTL - lk.Config().RenewDeadline
	default:
		s, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: name, Limit: limit, TTL: ttl, MaxHold: maxHold, Logger: log})
		if err != nil {
			return fail(stderr, usagef("%v", err))
		}
		defer func() { _ = s.Close(context.Background()) }() // after the release: closes the slots' idle queues
		l, acquire, release = s, s.Acquire, s.Release
		grace = s.Config().TTL - s.Config().RenewDeadline
		env = append(env, envSlot+"=-") // set below, once acquired
	}
	// Signals are passed on to the command once it runs; until then they
	// end the wait (ctx).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if limit == 0 && !k.read && !k.write {
		sayHolder(ctx, c, name, stderr)
	}
	if err := acquire(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "sskv: lock %q: interrupted while waiting\n", name)
			return exitError
		}
		if errors.Is(err, lock.ErrNotALock) { // waiting would last forever: say what fits the key
			err = fmt.Errorf("%w\n(not waiting: -n N holds a slot of a semaphore, -r or -w a read-write lock; 'sskv elect NAME' campaigns in an election)", err)
		}
		return fail(stderr, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := release(rctx); err != nil {
			fmt.Fprintf(stderr, "sskv: %v (it expires after %v)\n", err, ttl)
		}
	}()

	if s, ok := l.(*lock.Semaphore); ok {
		env[len(env)-1] = envSlot + "=" + strconv.Itoa(s.Slot())
	}
	env = append(append(os.Environ(), envToken+"="+l.Token().String()), env...)
	j, err := startJob(argv, env, grace, stdin, stdout, stderr)
	if err != nil {
		return fail(stderr, fmt.Errorf("lock %q: %w", name, err))
	}
	type result struct {
		code int
		err  error
	}
	exited := make(chan result, 1)
	go func() {
		code, err := j.wait() // once COMMAND and (on Linux) all it started are gone
		exited <- result{code, err}
	}()

	// The store can expire the key TTL - RenewDeadline (grace) after the
	// holder noticed the loss: the command must be gone by then.
	var (
		lost <-chan struct{} = l.Done()
		kill <-chan time.Time
	)
	for {
		select {
		case r := <-exited:
			switch {
			case lost == nil:
				return exitLost
			case r.err != nil:
				return fail(stderr, r.err)
			}
			return r.code
		case s := <-sigs:
			j.signal(s)
		case <-lost:
			lost = nil
			fmt.Fprintf(stderr, "sskv: lock %q %s; sending SIGTERM to %s\n", name, strings.TrimPrefix(l.Err().Error(), "lock: "), argv[0])
			j.terminate()
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			fmt.Fprintf(stderr, "sskv: %s still running %v after SIGTERM; killing it\n", argv[0], grace)
			j.kill()
		}
	}
}
