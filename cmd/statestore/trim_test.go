package main

import (
	"context"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// Goroutines whose stacks grew and that then wait, as the broker's
// connection goroutines do once a client has subscribed, get their stacks
// back to size once trimStacks sees the growth end: the store's memory
// comes back down without waiting for the runtime's next collection.
func TestTrimStacksShrinksGrownStacks(t *testing.T) {
	sample := []metrics.Sample{{Name: stackBytes}}
	stacks := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	before := stacks()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		trimStacks(ctx, 20*time.Millisecond, 1<<20)
	}()
	release := make(chan struct{})
	var parked, ended sync.WaitGroup
	defer func() {
		close(release)
		cancel()
		<-done
		ended.Wait()
	}()
	const goroutines = 64
	for range goroutines {
		parked.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			_ = deepStack(100) // about 100 KiB of stack, given back on return
			parked.Done()
			<-release
		}()
	}
	parked.Wait()
	grown := stacks()
	if grown < before+goroutines*64<<10 {
		t.Skipf("stacks grew from %d to %d bytes only: nothing to trim", before, grown)
	}

	// A collection halves each stack the goroutines no longer use. Generous:
	// trimStacks runs one within two intervals (40 ms) of the growth ending.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for stacks() > before+(grown-before)*3/4 {
		if time.Now().After(deadline) {
			t.Fatalf("goroutine stacks still %d bytes, grown from %d to %d", stacks(), before, grown)
		}
		<-tick.C
	}
}

// deepStack recurses n times with a 1 KiB frame each.
//
//go:noinline
func deepStack(n int) byte {
	var buf [1024]byte
	buf[n%len(buf)] = byte(n)
	if n == 0 {
		return buf[0]
	}
	return deepStack(n-1) + buf[n%len(buf)]
}
