package wait

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestQueueSimulation runs the queue's deterministic simulation
// (queuesim_test.go) over many seeds: 10,000 by default, in well under a
// minute without the race detector (a quarter of them with it).
//
//	DSSLOCK_SIM_SEEDS=1000000 go test -run TestQueueSimulation ./lock/   # a longer run
//	DSSLOCK_SIM_SEED=1234 go test -run TestQueueSimulation -v ./lock/    # replay one seed, with its trace
//	DSSLOCK_SIM_FIRST=50000                                              # where the seeds start
func TestQueueSimulation(t *testing.T) {
	if s := os.Getenv("DSSLOCK_SIM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DSSLOCK_SIM_SEED: %v", err)
		}
		sm := newSim(seed)
		sm.keepTrace = true
		err = sm.run()
		t.Logf("seed %d: %+v, %d handovers, %d faults, %d rechecks, max overtaken %d, %d steps, ended at %v",
			seed, sm.cfg, sm.handovers, sm.faults, sm.rechecks, sm.maxOver, sm.steps, sm.now)
		if err != nil {
			t.Logf("trace:\n%s", strings.Join(sm.trace, "\n"))
			t.Fatal(err)
		}
		return
	}
	seeds := uint64(10000)
	if raceEnabled {
		seeds /= 4
	}
	if s := os.Getenv("DSSLOCK_SIM_SEEDS"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DSSLOCK_SIM_SEEDS: %v", err)
		}
		seeds = n
	}
	first := uint64(1)
	if s := os.Getenv("DSSLOCK_SIM_FIRST"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DSSLOCK_SIM_FIRST: %v", err)
		}
		first = n
	}
	start := time.Now()
	var handovers, faults, rechecks, steps, maxOver, failed int
	for seed := first; seed < first+seeds; seed++ {
		sm := newSim(seed)
		err := sm.run()
		handovers += sm.handovers
		faults += sm.faults
		rechecks += sm.rechecks
		steps += sm.steps
		maxOver = max(maxOver, sm.maxOver)
		if err != nil {
			failed++
			t.Errorf("%v (replay: DSSLOCK_SIM_SEED=%d go test -run TestQueueSimulation -v ./lock/)", err, seed)
			if failed >= 5 {
				break
			}
		}
	}
	t.Logf("%d seeds from %d in %v: %d handovers, %d faults, %d safeguard rechecks, %d steps, max overtaken %d",
		seeds, first, time.Since(start).Round(time.Millisecond), handovers, faults, rechecks, steps, maxOver)
}
