package localstore_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestNoFreezeUnderLoad: a client that both sends requests and receives a
// stream of notifications from several writers (so the broker has messages in
// flight to it while it reads its packets) keeps getting every response, and
// so do the writers. This is the traffic under which mochi's flow control
// froze the store (see noFlowControl): without that fix this test hangs in
// about one run in ten; TestFlowControlOff pins the fix deterministically.
func TestNoFreezeUnderLoad(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	watcher := connect(t, srv)
	watcher.other = make(chan *paho.Publish, 1<<16)
	mustPayload(t, watcher.do(cmd("KEYNOTIFY", "hot")), okResp)

	const writers, writes, reads = 3, 600, 1500
	var wg sync.WaitGroup
	for i := range writers {
		w := connect(t, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			type inflight struct {
				ch   <-chan *paho.Publish
				corr []byte
			}
			batch := make([]inflight, 0, 32)
			for n := range writes {
				ch, corr := w.send(cmd("SET", "hot", fmt.Sprintf("%d-%d", i, n)))
				batch = append(batch, inflight{ch, corr})
				if len(batch) == cap(batch) {
					for _, f := range batch {
						w.await(f.ch, f.corr)
					}
					batch = batch[:0]
				}
			}
			for _, f := range batch {
				w.await(f.ch, f.corr)
			}
		}()
	}
	// The watcher keeps sending packets (requests) while notifications
	// stream to it; each response must come back.
	for range reads / 30 {
		var batch []<-chan *paho.Publish
		var corrs [][]byte
		for range 30 {
			ch, corr := watcher.send(cmd("GET", "hot"))
			batch, corrs = append(batch, ch), append(corrs, corr)
		}
		for i := range batch {
			watcher.await(batch[i], corrs[i])
		}
	}
	wg.Wait()
	// Still serving.
	c := connect(t, srv)
	mustPayload(t, c.do(cmd("SET", "after", "ok")), okResp)
}
