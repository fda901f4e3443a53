package main

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The broker (mochi) handles each connection on a goroutine whose frames are
// large: reading and handling a SUBSCRIBE, then writing its SUBACK, needs
// more than 16 KiB of stack, so every client that subscribes (every sskv
// client does, at once) leaves its connection's goroutine with a 32 KiB
// stack. An idle connection needs only 16 KiB, and Go shrinks a stack only
// during a garbage collection. An idle store allocates little, so after a
// burst of new clients the next collection may be minutes away (the runtime
// forces one every 2 minutes): until then each client costs 16 KiB more
// than it needs to, about a third of what an idle client costs the store.
//
// trimStacks makes that collection come sooner: once goroutine stacks have
// grown by trimThreshold since the last collection it ran, and stopped
// growing (no bigger than at the previous tick), it runs one. A burst of new
// clients thus costs one collection, a few seconds after it ends; clients
// coming and going one at a time cost none. The collection returns what it
// freed to the system at once (debug.FreeOSMemory): the runtime's background
// scavenger keeps free memory up to about the heap goal, which the freed
// stacks often fit in, so with a plain collection the store's RSS stayed
// the same in some runs.
//
// Measured with BenchmarkIdleClientRSS (2,000 idle sskv clients, 30 s after
// they connected): see docs/benchmarks.md.
const (
	trimInterval  = 2 * time.Second
	trimThreshold = 4 << 20 // bytes of stack: 256 connections' worth of excess
)

// stackBytes is the runtime metric trimStacks watches: the memory of
// goroutine stacks.
const stackBytes = "/memory/classes/heap/stacks:bytes"

// trimStacks runs until ctx is done, checking stack memory every interval
// and running a garbage collection as the comment above says once it grew
// by threshold bytes and stopped growing.
func trimStacks(ctx context.Context, interval time.Duration, threshold uint64) {
	sample := []metrics.Sample{{Name: stackBytes}}
	read := func() uint64 {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return 0 // unknown to this runtime: never collect
		}
		return sample[0].Value.Uint64()
	}
	base := read() // stack memory after the last collection, or its low since
	prev := base
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := read()
		if now >= base+threshold && now <= prev {
			debug.FreeOSMemory()
			now = read()
			base = now
		}
		base = min(base, now)
		prev = now
	}
}
