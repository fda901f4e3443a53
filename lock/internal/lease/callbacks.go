package lease

import "sync"

// callbacks runs a Lock's callbacks (Config.OnRenewal) one at a time, in
// the order they were queued, on a goroutine of their own that runs only
// while some are queued. The renewer never waits for a callback, so a
// callback may call any method of the Lock: Unlock and Close, which wait
// for renewals in flight to end, included.
type callbacks struct {
	mu      sync.Mutex
	queue   []func()
	running bool
}

// do queues f.
func (c *callbacks) do(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue = append(c.queue, f)
	if !c.running {
		c.running = true
		go c.run()
	}
}

func (c *callbacks) run() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.queue = nil
			c.running = false
			c.mu.Unlock()
			return
		}
		f := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.mu.Unlock()
		f()
	}
}
