package harness_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A semaphore schedule: participants, each on its own client behind its
// own proxy, acquire one lock.Semaphore of semLimit slots, each holding's
// work read-modify-writes the register of its slot (fenced with the
// holding's token) a few times, then releases it, and acquires again, under
// the same faults as the election schedules. The checks:
//
//   - the registers' history is linearizable (porcupine, partitioned by
//     register), and each register's accepted writes carry non-decreasing
//     tokens (history.checkTokens);
//   - one holder per slot and at most semLimit holders at any moment,
//     judged on the holdings' windows: when the library said each held,
//     with a write the store accepted (see holding and
//     history.checkHoldings);
//   - a holding that was held when the store was closed ends within the
//     renew deadline (history.storeLost);
//   - after the faults are healed, every participant holds and writes again
//     within queuedLimit: the lock's queue documents that a lost message
//     costs a waiter about 11 TTLs (its recheck); one that took longer
//     than livenessLimit is reported, not a violation, with the goroutines'
//     stacks in the log, as is how often an Acquire was overtaken;
//   - every participant's Acquire, holding and Release return soon after
//     the schedule ends.
const (
	participants  = 4
	semLimit      = 2
	semaphoreName = "harness/semaphore"
	holdOps       = 4 // read-modify-writes of a holding's work
)

// slotRegister is the register the work of a holding of slot writes.
func slotRegister(slot int) string { return fmt.Sprintf("harness/slot/%d", slot) }

func (s *schedule) runSemaphore(ctx context.Context, observer *sskv.Client, res result) (result, porcupine.LinearizationInfo, string, bool) {
	violate := func(format string, args ...any) {
		res.violations = append(res.violations, fmt.Sprintf(format, args...))
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, cd := range s.cand {
		sem, err := lock.NewSemaphore(cd.c, lock.SemaphoreConfig{Name: semaphoreName, Limit: semLimit, HolderID: cd.id,
			TTL: ttl, RenewInterval: renewInterval, RenewDeadline: renewDeadline, Logger: s.logger.With("participant", cd.id)})
		if err != nil {
			s.t.Fatalf("NewSemaphore: %v", err)
		}
		cd.runs.Go(func() { s.participate(runCtx, cd, sem) })
	}
	var registers []string
	for i := range semLimit {
		registers = append(registers, slotRegister(i))
	}
	var observing sync.WaitGroup
	observing.Go(func() { s.observeKeys(runCtx, observer, registers) })

	// Faults, then healing, then every participant must hold and write
	// again.
	res.kinds = s.injectFaults(runCtx)
	for _, n := range res.kinds {
		res.faults += n
	}
	res.violations = append(res.violations, s.failures...)
	healed, healedAt := s.h.now(), time.Now()
	allWrote := func() bool {
		for _, cd := range s.cand {
			if !s.h.confirmedSince(cd.id, "", healed) {
				return false
			}
		}
		return true
	}
	ok, stalled := s.waitUntil(runCtx, healedAt, livenessLimit, 0, allWrote)
	if !ok {
		// Where the waiters wait, for the report, then the rest of the
		// time a lost message may cost.
		s.logger.Info("harness: not every participant wrote within livenessLimit after the healing", "harness", s.seed, "slots", s.slotHolders(ctx))
		s.dumpGoroutines()
		ok, stalled = s.waitUntil(runCtx, healedAt, queuedLimit, 0, allWrote)
	}
	recovered := time.Duration(s.h.now() - healed)
	if !ok {
		var missing []string
		for _, cd := range s.cand {
			if !s.h.confirmedSince(cd.id, "", healed) {
				missing = append(missing, cd.id)
			}
		}
		violate("%s did not hold the semaphore and write within %v after the faults were healed (a lost message's recheck and a few handovers), and the %v the test process stood still meanwhile (slots: %s)",
			strings.Join(missing, ", "), queuedLimit, stalled.Round(time.Millisecond), s.slotHolders(ctx))
	} else if recovered > livenessLimit+stalled {
		res.slowQueue = 1
		s.t.Logf("not a violation: a participant held the semaphore again only %v after the faults were healed (within the %v a lost message may cost, but over %v)",
			recovered.Round(time.Millisecond), queuedLimit, livenessLimit)
	}
	s.sleep(runCtx, settle)

	stop()
	slow, stopped := s.stopWorks("the participant's Acquire, work or Release", &res)
	observing.Wait()
	res.violations = append(res.violations, s.finalReads(ctx, observer, registers)...)
	return s.checkKind(res, semLimit, "holders of the semaphore", recovered, stopped, slow)
}

// participate acquires the semaphore, works and releases it, until ctx
// ends; then it closes the semaphore.
func (s *schedule) participate(ctx context.Context, cd *candidate, sem *lock.Semaphore) {
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer cancel()
		if err := sem.Close(cctx); err != nil {
			s.logger.Info("harness: Close", "participant", cd.id, "err", err)
		}
	}()
	for ctx.Err() == nil {
		call := s.h.now()
		if err := sem.Acquire(ctx); err != nil {
			if ctx.Err() == nil {
				// Refused (a clock too far ahead, say): try again after a
				// pause, as a user would.
				s.logger.Info("harness: Acquire failed; acquiring again", "participant", cd.id, "err", err)
				s.sleep(ctx, ttl/2)
			}
			continue
		}
		s.h.acquired(cd.id, call)
		s.hold(ctx, cd, sem)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		err := sem.Release(rctx)
		cancel()
		if err != nil {
			s.logger.Info("harness: Release", "participant", cd.id, "err", err)
		}
	}
}

// hold is a holding's work: holdOps read-modify-writes of its slot's
// register, fenced with its token.
func (s *schedule) hold(ctx context.Context, cd *candidate, sem *lock.Semaphore) {
	tok, slot := sem.Token(), sem.Slot()
	hd := s.h.holdingStarted(cd.lane, cd.id, fmt.Sprintf("slot %d", slot), tok, func() bool {
		t, err := sem.FencingToken()
		return err == nil && t == tok
	})
	defer s.h.holdingEnded(hd)
	cd.works.Add(1)
	defer cd.works.Add(-1)
	// The work stops when the holding ends, or the schedule does.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sem.Context().Done():
			cancel()
		case <-wctx.Done():
		}
	}()
	s.holdWork(wctx, cd, hd, slotRegister(slot), sem, fenced.New(cd.c, sem), holdOps, opPace)
}

// slotHolders says who holds each slot's key, for a report.
func (s *schedule) slotHolders(ctx context.Context) string {
	var parts []string
	for i := range semLimit {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		g, err := s.admin.Get(rctx, lock.SemaphoreSlot(semaphoreName, i))
		cancel()
		switch {
		case err != nil:
			parts = append(parts, fmt.Sprintf("slot %d: %v", i, err))
		case !g.Found:
			parts = append(parts, fmt.Sprintf("slot %d: free", i))
		default:
			h := lock.ParseHolder(g.Value, g.Version)
			parts = append(parts, fmt.Sprintf("slot %d: %s (token %v)", i, h.ID, h.Token))
		}
	}
	return strings.Join(parts, "; ")
}

// checkKind checks the history of a semaphore or group schedule whose work
// has stopped: the registers' linearizability, their token order, the
// holdings' windows (at most limit at once, 0: no bound; one of each slot
// or election), and that holdings held when the store was closed ended in
// time. It returns the result, the linearization for the visualization,
// the summary and slow.
func (s *schedule) checkKind(res result, limit int, what string, recovered, stopped time.Duration, slow bool) (result, porcupine.LinearizationInfo, string, bool) {
	s.h.mu.Lock()
	res.ops = s.h.invoked
	res.stale = s.h.stale
	res.takeovers = max(0, len(s.h.holdings)-1)
	ops := append([]porcupine.Operation(nil), s.h.ops...)
	unknown, notSent, refused, holdings := s.h.unknown, s.h.notSent, s.h.refused, len(s.h.holdings)
	windows := len(s.h.windows())
	s.h.mu.Unlock()
	res.violations = append(res.violations, s.h.checkTokens()...)
	res.violations = append(res.violations, s.h.checkHoldings(limit, what)...)
	closed, late := s.h.checkObserver()
	res.violations = append(res.violations, closed...)
	res.lateKeys = len(late)
	check, info := porcupine.CheckOperationsVerbose(registerModel, ops, checkLimit)
	switch check {
	case porcupine.Illegal:
		res.violations = append(res.violations, "the registers' history is not linearizable")
	case porcupine.Unknown:
		res.violations = append(res.violations, fmt.Sprintf("porcupine could not decide linearizability within %v (%d operations)", checkLimit, len(ops)))
	}
	believed := ""
	if limit > 0 {
		n, most := s.h.believedOver(limit)
		res.overlaps = n
		believed = fmt.Sprintf("; believed holdings over %d %d times (most at once %d)", limit, n, most)
		over, who, n2 := s.h.overtakes(2 * (participants - 1))
		res.overtaken = over
		if over > 0 {
			believed += fmt.Sprintf("; an Acquire overtaken at most %d times (%s), %d over 2N = %d", over, who, n2, 2*(participants-1))
		}
	}
	if slow {
		res.slowStops = 1
	}
	summary := fmt.Sprintf("%s: %d ops (%d in history: %d of unknown outcome), %d faults, %d holdings (%d confirmed by accepted writes), %d stale rejected, %d not sent after a holding ended, %d other refusals%s; all wrote %v after healing; stopped in %v; linearizable: %s; %d violations",
		s.v.kind, res.ops, len(ops), unknown, res.faults, holdings, windows, res.stale, notSent, refused, believed,
		recovered.Round(time.Millisecond), stopped.Round(time.Millisecond), check, len(res.violations))
	return res, info, summary, slow
}
