package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

const (
	electionKey = "demo/failover/leader"
	counterKey  = "demo/failover/counter"
	// writeEvery is how often a leader increments the counter.
	writeEvery = 60 * time.Millisecond
	// minTTL is the shortest -ttl: a leader must have time to write a few
	// times, and to renew, between the demo's steps.
	minTTL = 300 * time.Millisecond
)

// candidateNames are the candidates, one lane each in the picture.
var candidateNames = []string{"A", "B", "C"}

// candidate is one of the processes that campaign: its own connection to
// the store, through its own proxy, which the demo cuts or freezes.
type candidate struct {
	name   string
	lane   int
	id     string // its id in the election's key
	proxy  *faultproxy.Proxy
	client *sskv.Client
}

// term is a candidate's leadership as the demo records it, from the
// campaign that won it to the moment it stopped leading.
type term struct {
	c *candidate
	t *leader.Term

	// Set before the term is handed to the demo (elected: by the campaign's
	// goroutine), then by the demo's goroutine only.
	n        int           // 1 for the first term of the election, and so on
	elected  time.Duration // Campaign returned
	end      time.Duration // stopped leading: resigned, crashed, or term ended and work returned
	how      string        // "resigned", "crashed" or "froze"
	workDone time.Duration // its work returned; set by the worker before it ends

	renewed    chan struct{} // a renewal succeeded (buffer 1, never blocks)
	firstWrite chan struct{} // closed at the term's first accepted write

	mu       sync.Mutex
	renewals []time.Duration // when each successful renewal was sent
	accepted int
	first    int64 // the counter's value after the term's first accepted write
	last     int64 // and after its last
}

// lastRenewal returns when the last successful renewal of the term was
// sent, or when the term began if there was none.
func (tr *term) lastRenewal() time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := len(tr.renewals); n > 0 {
		return tr.renewals[n-1]
	}
	return tr.elected
}

// writes returns the number of accepted writes and the counter's first and
// last values written in the term.
func (tr *term) writes() (n int, first, last int64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.accepted, tr.first, tr.last
}

// write is one write of the counter, accepted or not.
type write struct {
	at    time.Duration
	lane  int
	term  int
	ok    bool   // the store applied it
	stale bool   // refused as stale: by the fenced writer or by the store
	by    string // who refused a stale write: "writer" or "store"
	value int64  // the value written (or meant to be)
}

// report is what the run recorded: what the summary, the JSON result, the
// checks and the picture are made from.
type report struct {
	ttl, renewInterval, renewDeadline time.Duration
	names                             []string
	terms                             []*term
	writes                            []write
	unknown                           int // writes with an unknown outcome (errors other than stale)

	handover struct{ from, to time.Duration } // Resign began; the next leader's Campaign returned
	takeover struct{ from, to time.Duration } // the crashed leader's last renewal; the next leader elected
	crash    struct {
		lane int
		at   time.Duration
	}
	pause struct {
		lane                         int
		lastRenewal                  time.Duration
		frozen, lost, healed, stales time.Duration
		next                         time.Duration // the next leader was elected
	}

	staleWriter error // the paused leader's fenced writer refusing to send
	staleStore  error // the store refusing a write with the paused leader's token
	counter     int64 // the counter's final value in the store
	end         time.Duration
}

// demo runs the scenario and fills in its report.
type demo struct {
	out   io.Writer
	start time.Time
	ttl   time.Duration
	lead  time.Duration // how long each leader works before the next step

	srv   *localstore.Server // nil unless started in-process
	admin *sskv.Client       // a direct connection: sets up and reads the result
	cands []*candidate

	campaignCtx   context.Context
	stopCampaigns context.CancelFunc
	results       chan campaignResult
	campaigns     int // running; touched by the demo's goroutine only
	wg            sync.WaitGroup
	workers       []*worker
	sayMu, repMu  sync.Mutex
	rep           report
}

type campaignResult struct {
	tr  *term
	err error
}

// now is the time since the demo started: the timeline's clock.
func (d *demo) now() time.Duration { return time.Since(d.start) }

// say prints one line of the timeline.
func (d *demo) say(who, format string, args ...any) {
	d.sayMu.Lock()
	defer d.sayMu.Unlock()
	fmt.Fprintf(d.out, "%6.3fs  %-2s %s\n", d.now().Seconds(), who, fmt.Sprintf(format, args...))
}

// play runs the demo and returns its report, or an error if it could not
// run to its end.
func play(ctx context.Context, o options, out io.Writer) (*report, error) {
	// Everything the demo waits for is bounded by this deadline.
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second+8*o.ttl)
	defer cancel()
	d := &demo{
		out:     out,
		start:   time.Now(),
		ttl:     o.ttl,
		lead:    max(o.ttl/2, minTTL),
		results: make(chan campaignResult, len(candidateNames)),
	}
	d.campaignCtx, d.stopCampaigns = context.WithCancel(ctx)
	defer d.close()
	if err := d.connect(ctx, o); err != nil {
		return nil, err
	}
	if err := d.scenario(ctx); err != nil {
		return nil, err
	}
	res, err := d.admin.Get(ctx, counterKey)
	if err != nil {
		return nil, fmt.Errorf("reading the counter: %w", err)
	}
	if d.rep.counter, err = strconv.ParseInt(string(res.Value), 10, 64); err != nil {
		return nil, fmt.Errorf("%s holds %q, not a counter", counterKey, res.Value)
	}
	d.rep.end = d.now()
	return &d.rep, nil
}

// connect starts the local store or finds the one to use, connects the
// candidates through their proxies, and removes what an earlier run left.
func (d *demo) connect(ctx context.Context, o options) error {
	var base sskv.Config
	switch {
	case o.env:
		cfg, err := sskv.ConfigFromEnv()
		if err != nil {
			return err
		}
		base = cfg
		d.say("", "state store at %s, from the AIO_* environment", base.Addr)
	case o.addr != "":
		base.Addr = o.addr
		d.say("", "state store at %s", base.Addr)
	default:
		srv, err := localstore.Start(localstore.Config{})
		if err != nil {
			return err
		}
		d.srv = srv
		base.Addr = srv.Addr()
		d.say("", "local state store listening on %s", base.Addr)
	}
	prefix := base.ClientID
	if prefix == "" {
		prefix = "failover"
	}
	base.CleanStart = true
	base.FailFast = true // a person waits: say at once if the store cannot be reached

	cfg := base
	cfg.ClientID = prefix + "-admin"
	admin, err := sskv.Dial(ctx, cfg)
	if err != nil {
		return err
	}
	d.admin = admin
	if err := d.clear(ctx); err != nil {
		return err
	}

	// PingTimeout is how long a client waits for the answer to a ping
	// before it drops the connection and reconnects. Here it is longer
	// than the demo holds a connection frozen (about a TTL), so that the
	// demo, not the client, decides when the network heals.
	ping := (2*o.ttl + 2*time.Second - 1).Truncate(time.Second)
	host, _, _ := net.SplitHostPort(base.Addr)
	for i, name := range candidateNames {
		p, err := faultproxy.Start(base.Addr, faultproxy.Options{})
		if err != nil {
			return err
		}
		c := &candidate{name: name, lane: i, id: prefix + "-" + name, proxy: p}
		d.cands = append(d.cands, c)
		cfg := base
		cfg.Addr = p.Addr()
		cfg.ClientID = c.id
		if cfg.TLS != nil && cfg.TLS.ServerName == "" {
			// The proxy's address is not the broker's name.
			cfg.TLS = cfg.TLS.Clone()
			cfg.TLS.ServerName = host
		}
		cfg.PingTimeout = max(ping, sskv.DefaultPingTimeout)
		cfg.KeepAlive = max(cfg.KeepAlive, sskv.DefaultKeepAlive, cfg.PingTimeout)
		if c.client, err = sskv.Dial(ctx, cfg); err != nil {
			return fmt.Errorf("connecting %s: %w", name, err)
		}
	}
	return nil
}

// clear removes the election's key and the counter that an earlier run
// against the same store may have left. Both are fenced by that run's
// tokens; a token made of the time now is newer.
func (d *demo) clear(ctx context.Context) error {
	now := hlc.Timestamp{Wall: time.Now().UnixMilli(), Node: "failover"}
	for _, key := range []string{electionKey, counterKey} {
		if _, err := d.admin.Del(ctx, key, sskv.DelOptions{FencingToken: now}); err != nil {
			return fmt.Errorf("clearing %s: %w", key, err)
		}
	}
	return nil
}

// scenario plays the three ways a leadership ends, one after the other:
// a resignation, a crash, a freeze.
func (d *demo) scenario(ctx context.Context) error {
	// As package lock's defaults.
	d.rep.ttl = d.ttl
	d.rep.renewInterval = (d.ttl / 3).Truncate(time.Millisecond)
	d.rep.renewDeadline = (d.ttl * 2 / 3).Truncate(time.Millisecond)
	for _, c := range d.cands {
		d.rep.names = append(d.rep.names, c.name)
	}
	d.say("", "election %q: TTL %v, renewed every %v, renew deadline %v", electionKey, d.ttl, d.rep.renewInterval, d.rep.renewDeadline)
	d.say("", "the leader adds 1 to %q every %v, with a fenced read-modify-write", counterKey, writeEvery)
	for _, c := range d.cands {
		d.campaign(c)
	}
	d.say("", "A, B and C campaign")
	first, err := d.nextLeader(ctx)
	if err != nil {
		return err
	}
	d.elected(first, "")
	second, err := d.handover(ctx, first)
	if err != nil {
		return err
	}
	third, err := d.crash(ctx, second)
	if err != nil {
		return err
	}
	return d.freeze(ctx, third)
}

// handover: the leader works, stops its work and resigns; the next leader
// is elected at once. The resigned candidate campaigns again.
func (d *demo) handover(ctx context.Context, tr *term) (*term, error) {
	if err := d.work(ctx, tr, d.lead).wait(ctx); err != nil {
		return nil, err
	}
	d.say(tr.c.name, "stops its work (%s) and resigns: Term.Resign deletes the key", d.summarize(tr))
	tr.end, tr.how = d.now(), "resigned"
	d.rep.handover.from = tr.end
	if err := resign(ctx, tr); err != nil {
		return nil, err
	}
	next, err := d.nextLeader(ctx)
	if err != nil {
		return nil, err
	}
	d.rep.handover.to = next.elected
	d.elected(next, fmt.Sprintf("%v after %s began to resign: a handover, no waiting for the TTL", fmtDur(next.elected-tr.end), tr.c.name))
	d.campaign(tr.c)
	d.say(tr.c.name, "campaigns again, on standby")
	return next, nil
}

// crash: the leader works, then crashes right after a renewal: its
// connection is cut and nothing reconnects. The next leader is elected
// when its key expires. The crash comes between two writes, so that every
// write's outcome is known.
func (d *demo) crash(ctx context.Context, tr *term) (*term, error) {
	w := d.work(ctx, tr, 0)
	if err := sleep(ctx, d.lead); err != nil {
		return nil, err
	}
	select {
	case <-tr.renewed: // an earlier renewal's
	default:
	}
	select {
	case <-tr.renewed:
	case <-time.After(2 * d.rep.renewInterval):
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	w.stop()
	tr.end, tr.how = d.now(), "crashed"
	d.rep.crash.lane, d.rep.crash.at = tr.c.lane, tr.end
	_ = tr.c.proxy.Close() // cuts its connection, and refuses new ones
	_ = tr.c.client.Close()
	last := tr.lastRenewal()
	d.rep.takeover.from = last
	d.say(tr.c.name, "crashes (%s), %v after its last renewal:", d.summarize(tr), fmtDur(tr.end-last))
	d.say("", "   its connection is cut and nothing reconnects; no renewal, no release")
	next, err := d.nextLeader(ctx)
	if err != nil {
		return nil, err
	}
	d.rep.takeover.to = next.elected
	d.elected(next, fmt.Sprintf("%v after %s's last renewal (TTL %v): a takeover once the key expired", fmtDur(next.elected-last), tr.c.name, d.ttl))
	return next, nil
}

// freeze: the leader works, then freezes past its renew deadline: its
// writes stop and its connection is blackholed. Its term ends on its own
// clock; the last candidate is elected and writes; then the frozen one
// wakes up and tries to write with its old term, through its fenced
// writer and directly with its token. Both are refused. The last leader
// works on, and resigns.
func (d *demo) freeze(ctx context.Context, tr *term) error {
	w := d.work(ctx, tr, 0)
	if err := sleep(ctx, d.lead); err != nil {
		return err
	}
	if err := w.freeze(); err != nil {
		return err
	}
	p := &d.rep.pause
	p.lane, p.frozen = tr.c.lane, d.now()
	tr.c.proxy.Blackhole()
	d.say(tr.c.name, "freezes (%s): a stop-the-world pause, a frozen VM;", d.summarize(tr))
	d.say("", "   its writes stop, its connection is blackholed: its renewals no longer reach the store")
	select {
	case <-tr.t.Done():
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	p.lost = d.now()
	if err := w.wait(ctx); err != nil {
		return err
	}
	tr.end, tr.how = max(p.lost, tr.workDone), "froze"
	p.lastRenewal = tr.lastRenewal()
	d.say(tr.c.name, "its term ends on its own clock, %v after its last renewal, %v before the store", fmtDur(p.lost-p.lastRenewal), fmtDur(p.lastRenewal+d.ttl-p.lost))
	d.say("", "   can expire its key: %v", tr.t.Err())
	d.say("", "   its work is told to stop (Term.Context is cancelled) and returns")

	next, err := d.nextLeader(ctx)
	if err != nil {
		return err
	}
	p.next = next.elected
	d.elected(next, fmt.Sprintf("%v after %s's last renewal", fmtDur(next.elected-p.lastRenewal), tr.c.name))
	nw := d.work(ctx, next, d.lead+writeEvery)
	// Until the new leader has written the counter, the key is fenced with
	// the frozen leader's token, which a late write of the frozen leader
	// would pass. The network heals after that write.
	select {
	case <-next.firstWrite:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	_, value, _ := next.writes()
	d.say(next.c.name, "writes %s = %d: the key is now fenced with its token", counterKey, value)

	tr.c.proxy.Heal()
	p.healed = d.now()
	d.say(tr.c.name, "wakes up: its connection works again, and it goes on with its old term")
	if err := d.staleWrites(ctx, tr); err != nil {
		return err
	}
	p.stales = d.now()
	// A lost term still deletes the key if it is still its own: it is not.
	if err := resign(ctx, tr); err != nil {
		return err
	}

	if err := nw.wait(ctx); err != nil {
		return err
	}
	d.say(next.c.name, "stops its work (%s) and resigns", d.summarize(next))
	next.end, next.how = d.now(), "resigned"
	return resign(ctx, next)
}

// staleWrites has the frozen leader write with its old term: through its
// fenced writer, which checks the term before it sends anything, and
// directly, with a write it had prepared before the pause and its old
// token, which the store refuses.
func (d *demo) staleWrites(ctx context.Context, tr *term) error {
	_, _, prepared := tr.writes()
	prepared++ // its next increment

	var sent bool
	_, err := fenced.New(tr.c.client, tr.t).Edit(ctx, counterKey, func(v []byte, found bool) ([]byte, error) {
		sent = true
		return v, nil
	})
	d.rep.staleWriter = err
	d.record(tr, prepared, err, "writer")
	switch {
	case errors.Is(err, fenced.ErrStale) && !sent:
		d.say(tr.c.name, "its fenced writer refuses to send a write with the old term:")
		d.say("", "   %v", err)
	default:
		d.say(tr.c.name, "its fenced writer did NOT refuse (read sent: %v): %v", sent, err)
	}

	_, err = tr.c.client.Set(ctx, counterKey, strconv.AppendInt(nil, prepared, 10), sskv.SetOptions{FencingToken: tr.t.Token()})
	d.rep.staleStore = err
	d.record(tr, prepared, err, "store")
	switch {
	case errors.Is(err, sskv.ErrFencingTokenLower):
		d.say(tr.c.name, "a write it prepared before the pause (%s = %d), sent with its old token,", counterKey, prepared)
		d.say("", "   is REJECTED by the state store: %s", strings.TrimPrefix(err.Error(), "sskv: "))
	default:
		d.say(tr.c.name, "a write it prepared before the pause, sent with its old token, was NOT rejected: %v", err)
	}
	return nil
}

// elected prints a new leader's election, with why, if not empty.
func (d *demo) elected(tr *term, why string) {
	if why != "" {
		d.say(tr.c.name, "elected %s", why)
		d.say("", "   term %d, fencing token %s", tr.n, tr.t.Token())
		return
	}
	d.say(tr.c.name, "elected: term %d, fencing token %s", tr.n, tr.t.Token())
}

// summarize describes a term's writes.
func (d *demo) summarize(tr *term) string {
	n, first, last := tr.writes()
	switch n {
	case 0:
		return "no write accepted"
	case 1:
		return fmt.Sprintf("1 write accepted: counter %d", last)
	}
	return fmt.Sprintf("%d writes accepted: counter %d to %d", n, first, last)
}

// campaign starts c's campaign; nextLeader collects it when it wins.
func (d *demo) campaign(c *candidate) {
	tr := &term{c: c, renewed: make(chan struct{}, 1), firstWrite: make(chan struct{})}
	onRenewal := func(latency time.Duration, err error) {
		if err != nil {
			return
		}
		sent := d.now() - latency
		tr.mu.Lock()
		tr.renewals = append(tr.renewals, sent)
		tr.mu.Unlock()
		select {
		case tr.renewed <- struct{}{}:
		default:
		}
	}
	d.campaigns++
	d.wg.Go(func() {
		t, err := leader.Campaign(d.campaignCtx, c.client, electionKey, []byte(c.name),
			leader.WithTTL(d.ttl),
			leader.WithCandidateID(c.id),
			leader.WithMetrics(leader.Metrics{Renewal: onRenewal}))
		tr.t, tr.elected = t, d.now()
		d.results <- campaignResult{tr, err}
	})
}

// nextLeader waits for a campaign to win.
func (d *demo) nextLeader(ctx context.Context) (*term, error) {
	select {
	case r := <-d.results:
		d.campaigns--
		if r.err != nil {
			return nil, fmt.Errorf("%s: %w", r.tr.c.name, r.err)
		}
		d.repMu.Lock()
		d.rep.terms = append(d.rep.terms, r.tr)
		r.tr.n = len(d.rep.terms)
		d.repMu.Unlock()
		return r.tr, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a leader: %w", context.Cause(ctx))
	}
}

// resign gives up tr's term after its work has returned.
func resign(ctx context.Context, tr *term) error {
	if err := tr.t.Resign(ctx); err != nil {
		return err
	}
	if !errors.Is(tr.t.Err(), leader.ErrResigned) && !errors.Is(tr.t.Err(), leader.ErrLost) {
		return fmt.Errorf("%s: term still open after Resign: %v", tr.c.name, tr.t.Err())
	}
	return nil
}

// worker is a leader's work: it increments the counter every writeEvery
// until it is stopped, frozen, or its term ends.
type worker struct {
	tr      *term
	stopc   chan struct{} // closed: return after the write under way
	freezec chan struct{} // closed: write no more, and return when the term ends
	frozen  chan struct{} // closed when the worker stopped writing for a freeze
	done    chan struct{} // closed when the worker returned
	once    sync.Once
}

// work starts tr's work; it returns by itself after dur, if dur > 0.
func (d *demo) work(ctx context.Context, tr *term, dur time.Duration) *worker {
	w := &worker{
		tr:      tr,
		stopc:   make(chan struct{}),
		freezec: make(chan struct{}),
		frozen:  make(chan struct{}),
		done:    make(chan struct{}),
	}
	d.workers = append(d.workers, w)
	d.wg.Go(func() {
		defer close(w.done)
		defer func() { tr.workDone = d.now() }()
		fw := fenced.New(tr.c.client, tr.t)
		var until <-chan time.Time
		if dur > 0 {
			t := time.NewTimer(dur)
			defer t.Stop()
			until = t.C
		}
		tick := time.NewTicker(writeEvery)
		defer tick.Stop()
		for {
			d.increment(tr, fw)
			select {
			case <-tick.C:
			case <-until:
				return
			case <-w.stopc:
				return
			case <-tr.t.Done():
				return
			case <-ctx.Done():
				return
			case <-w.freezec:
				close(w.frozen)
				// Frozen: it writes nothing more. Its term's context still
				// ends when the term does, on this process's clock.
				select {
				case <-tr.t.Done():
				case <-w.stopc:
				case <-ctx.Done():
				}
				return
			}
		}
	})
	return w
}

// stop tells the worker to return after the write under way, and waits:
// no write of it is left with an unknown outcome. A write is bounded by
// the term's context and the TTL.
func (w *worker) stop() {
	w.once.Do(func() { close(w.stopc) })
	<-w.done
}

// freeze tells the worker to write no more, and waits until it has
// stopped writing; it returns as soon as its term ends.
func (w *worker) freeze() error {
	close(w.freezec)
	select {
	case <-w.frozen:
		return nil
	case <-w.done:
		return fmt.Errorf("%s: its work ended before the freeze: %v", w.tr.c.name, w.tr.t.Err())
	}
}

// wait waits for the worker to return.
func (w *worker) wait(ctx context.Context) error {
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s's work: %w", w.tr.c.name, context.Cause(ctx))
	}
}

// increment adds one to the counter with a fenced read-modify-write.
func (d *demo) increment(tr *term, fw *fenced.Writer) {
	ctx, cancel := context.WithTimeout(tr.t.Context(), d.ttl)
	defer cancel()
	var next int64
	_, err := fw.Edit(ctx, counterKey, func(v []byte, found bool) ([]byte, error) {
		var n int64
		if found {
			var err error
			if n, err = strconv.ParseInt(string(v), 10, 64); err != nil {
				return nil, fmt.Errorf("%s holds %q, not a counter", counterKey, v)
			}
		}
		next = n + 1
		return strconv.AppendInt(nil, next, 10), nil
	})
	d.record(tr, next, err, "writer")
}

// record counts a write of value by tr's leader, whose error is err; by
// says who would refuse it as stale ("writer" or "store").
func (d *demo) record(tr *term, value int64, err error, by string) {
	w := write{at: d.now(), lane: tr.c.lane, term: tr.n, value: value}
	switch {
	case err == nil:
		w.ok = true
		tr.mu.Lock()
		tr.accepted++
		if tr.accepted == 1 {
			tr.first = value
			close(tr.firstWrite)
		}
		tr.last = value
		tr.mu.Unlock()
	case errors.Is(err, fenced.ErrStale) || errors.Is(err, sskv.ErrFencingTokenLower):
		w.stale, w.by = true, by
	default:
		d.repMu.Lock()
		d.rep.unknown++
		d.repMu.Unlock()
		d.say(tr.c.name, "write of %s = %d failed, its outcome is unknown: %v", counterKey, value, err)
	}
	d.repMu.Lock()
	d.rep.writes = append(d.rep.writes, w)
	d.repMu.Unlock()
}

// close ends everything the demo started, in order: campaigns, work,
// terms, connections, proxies, the store.
func (d *demo) close() {
	d.stopCampaigns()
	for _, w := range d.workers {
		w.once.Do(func() { close(w.stopc) })
	}
	// A run cut short may have left a connection frozen.
	for _, c := range d.cands {
		c.proxy.Heal()
	}
	// Giving the key up spares the next run a wait; it expires anyway.
	ctx, cancel := context.WithTimeout(context.Background(), min(d.ttl, 2*time.Second))
	defer cancel()
	for ; d.campaigns > 0; d.campaigns-- {
		if r := <-d.results; r.err == nil {
			_ = r.tr.t.Resign(ctx) // won just as the demo ended
		}
	}
	d.wg.Wait()
	for _, tr := range d.rep.terms {
		if tr.t.Err() == nil {
			_ = tr.t.Resign(ctx)
		}
	}
	for _, c := range d.cands {
		if c.client != nil {
			_ = c.client.Close()
		}
		_ = c.proxy.Close()
	}
	if d.admin != nil {
		_ = d.admin.Close()
	}
	if d.srv != nil {
		_ = d.srv.Close()
	}
}

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// fmtDur rounds d for reading: to 0.1 ms below 10 ms, else to 1 ms.
func fmtDur(d time.Duration) string {
	if d < 10*time.Millisecond && d > -10*time.Millisecond {
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
