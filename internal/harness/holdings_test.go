package harness_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// holding is one holding of a semaphore's slot (semaphore_test.go), or one
// term of one of a group's elections (group_test.go), as its work saw it.
//
// Its window is when it was held for sure, judged by the library and by
// the store together: from the start of its work (Acquire had returned, or
// the term's work began: the library said it held) to the last moment the
// library said it still held it, with a write the store then accepted,
// fenced with its token. A write through a fenced.Writer asks for the token
// after its call, so the holding was still valid at the call; a write
// after a pause carries a token asked for before the pause, so it counts
// from then. A holding is valid from its start until it ends, so it was
// valid throughout its window.
//
// A holding whose key was deleted by hand (the "delete key" fault) may not
// know it until its renew deadline: its writes accepted from the DEL's call
// to lossGrace after its answer do not extend its window (fencing is what
// keeps the register safe meanwhile, as for a term whose key the observer
// saw deleted; see observations). A holding with no write counted has no
// window: it may have lost its key unseen, and nothing the store accepted
// says otherwise.
type holding struct {
	who        string
	lane       int
	slot       string // the slot ("slot 1") or election held: at most one window of each at any moment
	token      hlc.Timestamp
	start, end int64   // its work started; its work ended, before Release (0: not yet)
	confirmed  []int64 // when the library said it held, for each write the store accepted
	paused     bool    // its work was paused
	term       *termRecord
}

// window is the part of a holding's time that counts: see holding.
type window struct {
	hd       *holding
	from, to int64
}

// holdingStarted records a holding whose work starts now; live reports
// whether it is still held (it is a term record too: see storeLost).
func (h *history) holdingStarted(lane int, who, slot string, token hlc.Timestamp, live func() bool) *holding {
	r := h.termStarted(lane, who, token, live)
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := &holding{who: who, lane: lane, slot: slot, token: token, start: r.start, term: r}
	h.holdings = append(h.holdings, hd)
	h.log.Info("the term above holds", "candidate", who, "slot", slot)
	return hd
}

// holdingEnded records that hd's work ended (before its Release).
func (h *history) holdingEnded(hd *holding) {
	h.termEnded(hd.term)
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.end = hd.term.end
}

// confirm records that the store accepted a write of hd's whose token the
// library gave at time at.
func (h *history) confirm(hd *holding, at int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.confirmed = append(hd.confirmed, at)
	h.lastConfirmed[hd.who] = max(h.lastConfirmed[hd.who], at)
	if at > h.lastConfirmedSlot[hd.slot] {
		h.lastConfirmedSlot[hd.slot] = at
	}
}

// pausedHolding marks hd's work as paused.
func (h *history) pausedHolding(hd *holding) {
	h.markPaused(hd.term)
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.paused = true
}

// keyDeleted records that the key held with token was deleted by hand at
// some time from call to ret.
func (h *history) keyDeleted(token hlc.Timestamp, call, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deleted[token] = append(h.deleted[token], [2]int64{call, ret})
}

// confirmedSince reports whether who made a write the store accepted, with
// a token the library gave after t; of slot, if slot is not "".
func (h *history) confirmedSince(who, slot string, t int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if slot != "" {
		return h.lastConfirmedSlot[slot] > t
	}
	return h.lastConfirmed[who] > t
}

// windows returns the windows of the holdings, those that have one. The
// caller holds h.mu.
func (h *history) windows() []window {
	var ws []window
	for _, hd := range h.holdings {
		to, ok := int64(0), false
		for _, at := range hd.confirmed {
			exempt := false
			for _, d := range h.deleted[hd.token] {
				if d[0] <= at && at <= d[1]+int64(h.lossGrace) {
					exempt = true
				}
			}
			if !exempt && at >= hd.start {
				to, ok = max(to, at), true
			}
		}
		if ok {
			ws = append(ws, window{hd: hd, from: hd.start, to: to})
		}
	}
	return ws
}

// checkHoldings returns the violations of the holdings' windows: two
// windows of one slot (or election) overlap, or more than limit windows
// overlap at some moment (limit 0: no such bound). Windows that only touch
// do not overlap.
func (h *history) checkHoldings(limit int, what string) []string {
	h.mu.Lock()
	ws := h.windows()
	h.mu.Unlock()
	var v []string
	bySlot := map[string][]window{}
	var slots []string
	for _, w := range ws {
		if _, ok := bySlot[w.hd.slot]; !ok {
			slots = append(slots, w.hd.slot)
		}
		bySlot[w.hd.slot] = append(bySlot[w.hd.slot], w)
	}
	slices.Sort(slots)
	for _, slot := range slots {
		sw := bySlot[slot]
		slices.SortFunc(sw, func(a, b window) int { return cmp.Compare(a.from, b.from) })
		var last *window // the window that reaches furthest, of those before
		for i := range sw {
			w := &sw[i]
			if last != nil && w.from < last.to {
				v = append(v, fmt.Sprintf("two holders of %s: %s held it from %v, while %s held it until at least %v, each with a write the store accepted then%s",
					slot, w.hd.who, ms(w.from), last.hd.who, ms(last.to), h.holdingsJudged([]window{*last, *w})))
			}
			if last == nil || w.to > last.to {
				last = w
			}
		}
	}
	if limit <= 0 {
		return v
	}
	type event struct {
		at  int64
		end bool
		w   window
	}
	var evs []event
	for _, w := range ws {
		evs = append(evs, event{at: w.from, w: w}, event{at: w.to, end: true, w: w})
	}
	// Ends before starts at the same moment: windows that touch do not
	// overlap.
	slices.SortFunc(evs, func(a, b event) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		if a.end != b.end {
			if a.end {
				return -1
			}
			return 1
		}
		return 0
	})
	var live []window
	over := 0 // moments with more than limit
	for _, e := range evs {
		if e.end {
			live = slices.DeleteFunc(live, func(w window) bool { return w.hd == e.w.hd })
			continue
		}
		live = append(live, e.w)
		if len(live) > limit {
			over++
			if over == 1 {
				var who []string
				for _, w := range live {
					who = append(who, fmt.Sprintf("%s (%s)", w.hd.who, w.hd.slot))
				}
				v = append(v, fmt.Sprintf("more than %d %s: at %v, %d held it, each with a write the store accepted then or later: %s%s",
					limit, what, ms(e.at), len(live), strings.Join(who, ", "), h.holdingsJudged(live)))
			}
		}
	}
	if over > 1 {
		v = append(v, fmt.Sprintf("more than %d %s at %d more moments (the first is above)", limit, what, over-1))
	}
	return v
}

// believedOver returns how many times more than limit holdings believed
// they held at once, by their works' starts and ends alone, leaving out
// paused ones (which cannot see their end), and the most at once. Not a
// violation: a holding may have lost its key unseen (deleted by hand).
func (h *history) believedOver(limit int) (n, most int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	type event struct {
		at    int64
		delta int
	}
	var evs []event
	for _, hd := range h.holdings {
		if hd.paused {
			continue // a paused process cannot see its holding end: that is what fencing is for
		}
		end := hd.end
		if end == 0 {
			end = h.now()
		}
		evs = append(evs, event{hd.start, 1}, event{end, -1})
	}
	slices.SortFunc(evs, func(a, b event) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	cur := 0
	for _, e := range evs {
		cur += e.delta
		if cur > limit && e.delta > 0 {
			n++
		}
		most = max(most, cur)
	}
	return n, most
}

// holdingsJudged returns, as indented lines, what a check of windows was
// judged on: each holding's work, its writes counted, the deletions of its
// key, and the faults of its candidate around it. The caller must not hold
// h.mu.
func (h *history) holdingsJudged(ws []window) string {
	var b strings.Builder
	line := func(format string, args ...any) {
		b.WriteString("\n    ")
		fmt.Fprintf(&b, format, args...)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	b.WriteString("\n  judged on:")
	for _, w := range ws {
		hd := w.hd
		end := "not ended"
		if hd.end != 0 {
			end = fmt.Sprint(ms(hd.end))
		}
		line("%s held %s with token %v: work from %v to %s (paused %v), counted until %v; the library said it held, for writes the store accepted, at %v",
			hd.who, hd.slot, hd.token, ms(hd.start), end, hd.paused, ms(w.to), msList(hd.confirmed))
		for _, d := range h.deleted[hd.token] {
			line("  its key deleted by hand between %v and %v (writes until %v not counted)", ms(d[0]), ms(d[1]), ms(d[1]+int64(h.lossGrace)))
		}
		from, to := hd.start-int64(evidenceWindow), max(hd.end, w.to)
		if hd.end == 0 {
			to = h.now()
		}
		for _, a := range h.annotations {
			if a.Tag == "faults" && strings.Contains(a.Description, hd.who) && a.Start <= to && max(a.End, a.Start) >= from {
				line("  fault from %v to %v: %s", ms(a.Start), ms(max(a.End, a.Start)), a.Description)
			}
		}
		for _, d := range h.delays[hd.who] {
			if d[0] <= to && d[1] >= from {
				line("  requests of %s held back or slowed from %v to %v", hd.who, ms(d[0]), ms(d[1]))
			}
		}
	}
	for _, a := range h.annotations {
		if a.Tag == "faults" && strings.HasPrefix(a.Description, "store restart") {
			line("store restart from %v to %v", ms(a.Start), ms(a.End))
		}
	}
	return b.String()
}

// msList formats times of the schedule, eliding the middle of a long list.
func msList(ts []int64) string {
	var parts []string
	for i, t := range ts {
		if len(ts) > 12 && i == 6 {
			parts = append(parts, fmt.Sprintf("... (%d more)", len(ts)-12))
		}
		if len(ts) > 12 && i >= 6 && i < len(ts)-6 {
			continue
		}
		parts = append(parts, fmt.Sprint(ms(t)))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

const (
	// pollPace is the pace of checks that poll the store.
	pollPace = 50 * time.Millisecond
	// lostMessage is how long a waiter in a lock's queue may wait for a
	// message lost on its way (an inbox key overwritten, say): it joins
	// again after about 11 TTLs, the queue's safeguard recheck
	// (docs/design/queue.md, L7).
	lostMessage = 11 * ttl
	// queuedLimit is how soon after the faults are healed every waiter
	// must be served: a lost message, then a few handovers.
	queuedLimit = lostMessage + 2*time.Second
)

// acquisition is a call of Acquire that returned nil.
type acquisition struct {
	who       string
	call, ret int64
}

// acquired records an acquisition by who, called at call, that returned
// now.
func (h *history) acquired(who string, call int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acquisitions = append(h.acquisitions, acquisition{who: who, call: call, ret: h.now()})
}

// overtakes returns, for the acquisition overtaken most often, how many
// acquisitions of others were called after it and returned before it, and
// who it was; and how many acquisitions were overtaken more than limit
// times. The lock documents about 2N at most with N others waiting (more
// after a lost message): reported, not a violation.
func (h *history) overtakes(limit int) (most int, who string, over int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.acquisitions {
		n := 0
		for _, b := range h.acquisitions {
			if b.who != a.who && b.call > a.call && b.ret < a.ret {
				n++
			}
		}
		if n > most {
			most, who = n, fmt.Sprintf("%s, waiting from %v to %v", a.who, ms(a.call), ms(a.ret))
		}
		if n > limit {
			over++
		}
	}
	return most, who, over
}

// tokenSource is what a holding's work asks for its token: a Semaphore or
// a leader.Term.
type tokenSource interface {
	FencingToken() (hlc.Timestamp, error)
}

// holdWork is a holding's work: read-modify-write key, the writes fenced
// through w with src's token, n times (0: until ctx ends), pace apart. As a
// term's work (see schedule.lead), a pending pause fault stops it between
// the read and the write for longer than the renew deadline, with its
// traffic held; it then writes with the token it had before the pause.
// Each write the store accepts confirms hd (see holding).
func (s *schedule) holdWork(ctx context.Context, cd *candidate, hd *holding, key string, src tokenSource, w *fenced.Writer, n int, pace time.Duration) {
	for i := 0; ctx.Err() == nil && (n == 0 || i < n); i++ {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		call := s.h.now()
		g, err := cd.c.Get(rctx, key)
		cancel()
		s.h.readOf(key, cd.lane, call, g, err)
		if err != nil {
			s.sleep(ctx, pace)
			continue
		}
		value := fmt.Sprintf("%s/%d/%d", cd.id, hd.token.Wall%100000, i)
		if d := time.Duration(cd.pause.Swap(0)); d > 0 {
			at := s.h.now()
			tok, err := src.FencingToken()
			if err != nil || tok != hd.token {
				return // the holding ended already
			}
			start := s.h.now()
			s.h.pausedHolding(hd)
			srv := s.store()
			if srv != nil {
				_ = srv.Hold(cd.id, localstore.Both)
			}
			time.Sleep(d) // the pause itself: nothing of this process runs
			if srv != nil {
				srv.Release(cd.id)
			}
			s.h.fault(start, s.h.now(), fmt.Sprintf("pause %s %v", cd.id, d.Round(time.Millisecond)))
			if srv != nil {
				s.h.delayed(cd.id, start, s.h.now())
			}
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
			call := s.h.now()
			opts := sskv.SetOptions{FencingToken: tok}
			if s.v.unfenced {
				opts.FencingToken = hlc.Timestamp{}
			}
			r, err := cd.c.Set(wctx, key, []byte(value), opts)
			cancel()
			if s.h.writeOf(key, cd.lane, cd.id, value, tok, true, call, r, err) {
				s.h.confirm(hd, at)
			}
			continue
		}
		call = s.h.now()
		var r sskv.SetResult
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		if s.v.unfenced {
			r, err = cd.c.Set(wctx, key, []byte(value), sskv.SetOptions{})
		} else {
			r, err = w.Set(wctx, key, []byte(value), sskv.SetOptions{})
		}
		cancel()
		// An unfenced write (a variant's) was not checked by the library:
		// it confirms nothing.
		if s.h.writeOf(key, cd.lane, cd.id, value, hd.token, false, call, r, err) && !s.v.unfenced {
			s.h.confirm(hd, call)
		}
		s.sleep(ctx, pace)
	}
}

// observeKeys reads the registers keys in turn until ctx ends.
func (s *schedule) observeKeys(ctx context.Context, c *sskv.Client, keys []string) {
	for i := 0; ctx.Err() == nil; i++ {
		key := keys[i%len(keys)]
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		call := s.h.now()
		g, err := c.Get(rctx, key)
		cancel()
		s.h.readOf(key, s.observerLane, call, g, err)
		s.sleep(ctx, readPace)
	}
}

// finalReads reads each register once, with a client that saw no fault,
// after the work stopped.
func (s *schedule) finalReads(ctx context.Context, c *sskv.Client, keys []string) []string {
	var v []string
	for _, key := range keys {
		call := s.h.now()
		g, err := c.Get(ctx, key)
		s.h.readOf(key, s.observerLane, call, g, err)
		if err != nil {
			v = append(v, fmt.Sprintf("final read of %s: %v", key, err))
		}
	}
	return v
}

// waitUntil waits until cond holds, from healedAt for limit and the time
// the process stood still meanwhile (up to maxStall; see stallMonitor). It
// checks cond after each accepted write, or every every if that is not 0.
// It returns whether cond held, and how long the process stood still.
func (s *schedule) waitUntil(ctx context.Context, healedAt time.Time, limit, every time.Duration, cond func() bool) (bool, time.Duration) {
	for {
		next, _ := s.h.wroteSince(0)
		if cond() {
			return true, s.stalls.within(healedAt, time.Now())
		}
		stalled := s.stalls.within(healedAt, time.Now())
		if stalled > maxStall {
			stalled = 0
		}
		wait := time.Until(healedAt.Add(limit + stalled))
		if wait <= 0 {
			return cond(), stalled
		}
		var tick <-chan time.Time
		if every > 0 {
			next = nil
			tick = time.After(min(every, wait))
		} else {
			tick = time.After(wait)
		}
		select {
		case <-next:
		case <-tick:
		case <-ctx.Done():
			return cond(), stalled
		}
	}
}

// stopWorks stops the candidates' works (runCtx has ended): each must
// return within stopLimit; it reports whether one was slow (slowStop), and
// adds a violation for each that was not back in time.
func (s *schedule) stopWorks(what string, res *result) (slow bool, took time.Duration) {
	stopping := time.Now()
	for _, cd := range s.cand {
		if !slow && !waitGroup(&cd.runs, slowStop) {
			slow = true
			s.t.Logf("%s: %s is slow to return after its context ended", cd.id, what)
			s.dumpGoroutines()
		}
		if !waitGroup(&cd.runs, stopLimit) {
			res.violations = append(res.violations, fmt.Sprintf("%s: %s did not return within %v of its context's end", cd.id, what, stopLimit))
			cd.c.Close() // unblock it, so the schedule can end
			cd.runs.Wait()
		}
	}
	return slow, time.Since(stopping)
}
