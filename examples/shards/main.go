// Command shards splits the leadership of many shards over a few replicas
// with leader.Group, and shows it move when a replica dies and when one
// joins.
//
//	go run ./examples/shards
//	go run ./examples/shards -shards 30 -ttl 2s
//	go run ./examples/shards -addr host:1883   # on any state store
//
// It starts a local state store in-process (or uses -addr) and runs three
// replicas, R1, R2 and R3, in this process, each with its own connection.
// The 12 shards (-shards) are 12 elections of one group; the replica that
// leads a shard serves it: it writes the shard's owner key every 100 ms,
// fenced with its term. Then:
//
//  1. The three replicas start together: each ends up leading a third of
//     the shards.
//  2. R2 crashes: its connection closes, with no resignation. Its shards
//     have no leader until their keys expire, a TTL after R2's last
//     renewal; R1 and R3 then take them over, and lead half the shards
//     each.
//  3. R4 joins: R1 and R3 hand it a third of the shards, one by one: each
//     stops serving the shard, resigns, and R4's campaign, waiting on the
//     shard's key, takes it at once.
//
// The timeline shows each change of a shard's leader, and how long the
// shard had none. The demo checks that no two replicas ever served one
// shard at once, and that a write of the crashed replica, sent with its old
// term's token, is refused by the state store. It exits with status 1 if a
// check fails.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func main() {
	addr := flag.String("addr", "", "state store `address`; empty: start a local state store in-process")
	shards := flag.Int("shards", 12, "how many shards (elections)")
	ttl := flag.Duration("ttl", time.Second, "the TTL of the shards' terms and of the replicas' slots")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *addr, *shards, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "shards:", err)
		stop()
		os.Exit(1)
	}
}

const (
	group      = "demo/shards/replicas"
	writeEvery = 100 * time.Millisecond
)

func shardKey(i int) string        { return fmt.Sprintf("demo/shards/%02d", i) }
func ownerKey(shard string) string { return shard + "/owner" }
func short(shard string) string    { return strings.TrimPrefix(shard, "demo/shards/") }

// demo is the state of one run.
type demo struct {
	out      io.Writer
	start    time.Time
	addr     string
	shards   []string
	ttl      time.Duration
	ctx      context.Context
	replicas []*replica

	active     map[string]*atomic.Int32 // works serving each shard now; read-only map
	violations atomic.Int32             // two works of a shard at once, or a live term's write refused
	accepted   atomic.Int64             // fenced writes accepted

	mu      sync.Mutex
	changes []change                 // not yet printed
	notify  chan struct{}            // capacity 1: a change was recorded
	last    map[string]string        // who led each shard last (drain's)
	since   map[string]time.Duration // when the shard's last work stopped (drain's)
	tokens  map[string]hlc.Timestamp // the token of each replica's last term of each shard, by replica+" "+shard
}

// change is a work starting or stopping.
type change struct {
	at      time.Duration
	replica string
	shard   string
	start   bool
	token   hlc.Timestamp
}

// replica is one member of the group, with its own connection.
type replica struct {
	name string
	c    *sskv.Client
	g    *leader.Group
	stop context.CancelFunc
	done chan struct{} // closed when Run has returned, with err
	err  error
}

func run(ctx context.Context, out io.Writer, addr string, n int, ttl time.Duration) error {
	if n < 1 || n > 100 {
		return fmt.Errorf("-shards %d: want 1 to 100", n)
	}
	d := &demo{out: out, start: time.Now(), ttl: ttl, notify: make(chan struct{}, 1),
		active: map[string]*atomic.Int32{}, last: map[string]string{}, since: map[string]time.Duration{}, tokens: map[string]hlc.Timestamp{}}
	if addr == "" {
		srv, err := localstore.Start(localstore.Config{})
		if err != nil {
			return err
		}
		defer srv.Close()
		addr = srv.Addr()
		d.say("local state store listening on %s", addr)
	}
	d.addr = addr
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+10*ttl)
	defer cancel()
	d.ctx = ctx
	for i := range n {
		d.shards = append(d.shards, shardKey(i))
		d.active[shardKey(i)] = new(atomic.Int32)
	}
	observer, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: "shards-observer"})
	if err != nil {
		return err
	}
	defer observer.Close()
	if err := d.clear(observer); err != nil {
		return err
	}
	defer d.stopAll()

	// 1. Three replicas start together.
	d.say("R1, R2 and R3 start: %d shards, TTL %v", n, ttl)
	for _, name := range []string{"R1", "R2", "R3"} {
		if err := d.startReplica(name); err != nil {
			return err
		}
	}
	if err := d.until(d.balanced, false); err != nil {
		return err
	}
	d.table("balanced")

	// 2. R2 crashes.
	r2 := d.replicas[1]
	d.say("R2 crashes: its connection closes; it neither resigns nor gives up its slot")
	_ = r2.c.Close()
	<-r2.done
	if err := d.until(d.balanced, true); err != nil {
		return err
	}
	d.table("balanced over the two left")

	// 3. R4 joins.
	d.say("R4 joins")
	if err := d.startReplica("R4"); err != nil {
		return err
	}
	if err := d.until(d.balanced, true); err != nil {
		return err
	}
	d.table("balanced")

	// An observer's view agrees.
	states, err := leader.Leaders(ctx, observer, d.shards)
	if err != nil {
		return err
	}
	for _, r := range d.live() {
		for _, s := range r.g.Leading() {
			if states[s].ID != r.name {
				d.violations.Add(1)
				d.say("CHECK FAILED: an observer sees %s led by %q, not %s", short(s), states[s].ID, r.name)
			}
		}
	}
	d.say("an observer (leader.Leaders) sees the same leaders")

	// R2's stale write is refused.
	if err := d.staleWrite(observer); err != nil {
		return err
	}
	d.stopAll()
	d.flush()
	if v := d.violations.Load(); v > 0 {
		return fmt.Errorf("%d checks failed", v)
	}
	d.say("all checks passed: never two replicas serving one shard; %d fenced writes accepted", d.accepted.Load())
	return nil
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "%6.3fs  %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// clear removes what an earlier run against the same store left: the
// shards' keys and the group's slots, with a token newer than any of that
// run's.
func (d *demo) clear(c *sskv.Client) error {
	now := hlc.Timestamp{Wall: time.Now().UnixMilli(), Node: "demo"}
	keys := slices.Clone(d.shards)
	for _, s := range d.shards {
		keys = append(keys, ownerKey(s))
	}
	for i := range leader.DefaultMaxMembers {
		keys = append(keys, fmt.Sprintf("%s\x00member\x00%d", group, i))
	}
	for _, k := range keys {
		if _, err := c.Del(d.ctx, k, sskv.DelOptions{FencingToken: now}); err != nil {
			return fmt.Errorf("clearing %q: %w", k, err)
		}
	}
	return nil
}

func (d *demo) startReplica(name string) error {
	c, err := sskv.Dial(d.ctx, sskv.Config{Addr: d.addr, ClientID: "shards-" + name})
	if err != nil {
		return err
	}
	g, err := leader.NewGroup(c, group, d.shards, []byte(name), leader.WithCandidateID(name), leader.WithTTL(d.ttl))
	if err != nil {
		_ = c.Close()
		return err
	}
	ctx, cancel := context.WithCancel(d.ctx)
	r := &replica{name: name, c: c, g: g, stop: cancel, done: make(chan struct{})}
	go func() {
		r.err = g.Run(ctx, d.work(r))
		_ = c.Close()
		close(r.done)
	}()
	d.replicas = append(d.replicas, r)
	return nil
}

// work serves a shard while r leads it: it writes the shard's owner key,
// fenced with the term, until its context ends.
func (d *demo) work(r *replica) func(context.Context, *leader.Term) error {
	return func(ctx context.Context, t *leader.Term) error {
		s := t.Election()
		if d.active[s].Add(1) != 1 {
			d.violations.Add(1)
			d.say("CHECK FAILED: two replicas serve %s at once", short(s))
		}
		d.record(change{replica: r.name, shard: s, start: true, token: t.Token()})
		w := fenced.New(r.c, t)
		tick := time.NewTicker(writeEvery)
		defer tick.Stop()
		for {
			_, err := w.Set(ctx, ownerKey(s), []byte(r.name), sskv.SetOptions{})
			switch {
			case err == nil:
				d.accepted.Add(1)
			case errors.Is(err, sskv.ErrFencingTokenLower):
				d.violations.Add(1)
				d.say("CHECK FAILED: a write of %s's live term of %s was refused", r.name, short(s))
			}
			select {
			case <-ctx.Done():
				d.active[s].Add(-1)
				d.record(change{replica: r.name, shard: s})
				return nil
			case <-tick.C:
			}
		}
	}
}

func (d *demo) record(c change) {
	c.at = time.Since(d.start)
	d.mu.Lock()
	d.changes = append(d.changes, c)
	if c.start {
		d.tokens[c.replica+" "+c.shard] = c.token
	}
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// flush prints the changes recorded since the last flush.
func (d *demo) flush() { d.drain(true) }

// drain takes the changes recorded since it last ran, and prints each new
// leader of a shard: who led it before, and how long it had no leader (if
// print; otherwise it only keeps track).
func (d *demo) drain(print bool) {
	d.mu.Lock()
	cs := d.changes
	d.changes = nil
	d.mu.Unlock()
	for _, c := range cs {
		if !c.start {
			d.since[c.shard] = c.at
			continue
		}
		prev, ok := d.last[c.shard]
		d.last[c.shard] = c.replica
		if !print || !ok {
			continue
		}
		gap := max(c.at-d.since[c.shard], 0)
		fmt.Fprintf(d.out, "%6.3fs    shard %s: %s → %s after %v without a leader\n",
			c.at.Seconds(), short(c.shard), prev, c.replica, gap.Round(time.Millisecond))
	}
}

// until waits for cond, printing (or only tracking) the changes meanwhile.
// It looks again at each change of a work, and at least once a TTL: cond
// also reads what the groups tell of their members and terms, which can
// settle after the last work has started.
func (d *demo) until(cond func() bool, print bool) error {
	limit := time.NewTimer(20*time.Second + 5*d.ttl)
	defer limit.Stop()
	again := time.NewTicker(d.ttl)
	defer again.Stop()
	for {
		d.drain(print)
		if cond() {
			return nil
		}
		select {
		case <-d.notify:
		case <-again.C:
		case <-d.ctx.Done():
			return d.ctx.Err()
		case <-limit.C:
			return errors.New("the replicas did not balance in time")
		}
	}
}

// live returns the replicas whose Run runs.
func (d *demo) live() []*replica {
	var rs []*replica
	for _, r := range d.replicas {
		select {
		case <-r.done:
		default:
			rs = append(rs, r)
		}
	}
	return rs
}

// balanced reports whether the live replicas see each other and each lead
// their share of the shards, all of them led.
func (d *demo) balanced() bool {
	rs := d.live()
	lo, hi := len(d.shards)/len(rs), (len(d.shards)+len(rs)-1)/len(rs)
	total := 0
	for _, r := range rs {
		k := len(r.g.Leading())
		if k < lo || k > hi || len(r.g.Members()) != len(rs) {
			return false
		}
		total += k
	}
	return total == len(d.shards)
}

func (d *demo) table(what string) {
	var parts []string
	for _, r := range d.live() {
		var ss []string
		for _, s := range r.g.Leading() {
			ss = append(ss, short(s))
		}
		parts = append(parts, fmt.Sprintf("%s leads %d [%s]", r.name, len(ss), strings.Join(ss, " ")))
	}
	d.say("%s: %s", what, strings.Join(parts, ", "))
}

// staleWrite sends a write of one of the crashed R2's shards with the token
// of R2's last term of it: the store refuses it, since the shard's new
// leader has written with a newer token.
func (d *demo) staleWrite(c *sskv.Client) error {
	d.mu.Lock()
	var shard string
	var token hlc.Timestamp
	for _, s := range d.shards {
		if t, ok := d.tokens["R2 "+s]; ok {
			shard, token = s, t
			break
		}
	}
	d.mu.Unlock()
	if shard == "" {
		return errors.New("R2 led no shard")
	}
	_, err := c.Set(d.ctx, ownerKey(shard), []byte("R2 (stale)"), sskv.SetOptions{FencingToken: token})
	if !errors.Is(err, sskv.ErrFencingTokenLower) {
		d.violations.Add(1)
		d.say("CHECK FAILED: a write with R2's old token of %s = %v", short(shard), err)
		return nil
	}
	d.say("a write to %s sent with R2's old term token: REJECTED by the state store (%s)", ownerKey(shard), strings.TrimPrefix(err.Error(), "sskv: "))
	return nil
}

// stopAll stops the live replicas: each resigns its shards and leaves.
func (d *demo) stopAll() {
	for _, r := range d.replicas {
		r.stop()
	}
	for _, r := range d.replicas {
		<-r.done
	}
}
