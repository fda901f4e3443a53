package localstore_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestIdleConnectionGoroutines: an idle connection costs the store only the
// broker's two goroutines (mochi's reader and write loop). The store's own
// goroutines for a connection (the notification outbox's) run only while
// something is queued: after requests, their responses and a notification,
// none is left.
func TestIdleConnectionGoroutines(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	const n = 40
	base := runtime.NumGoroutine()
	conns := make([]*rawConn, n)
	for i := range conns {
		rc := dialRaw(t, srv.Addr(), 0)
		rc.connect(fmt.Sprintf("idle-%d", i), 60)
		respTopic := fmt.Sprintf("r/%d", i)
		rc.watch(respTopic, fmt.Sprintf("k%d", i))
		conns[i] = rc
	}
	for i, rc := range conns {
		// A SET of its own key: a response and a notification, each
		// acknowledged.
		rc.write(rc.request(2, fmt.Sprintf("r/%d", i), "SET", fmt.Sprintf("k%d", i), "v"))
		for got := 0; got < 2; {
			if p, ok := rc.read().Content.(*packets.Publish); ok {
				rc.write(&packets.Puback{PacketID: p.PacketID, Properties: &packets.Properties{}})
				got++
			}
		}
	}
	// The outboxes' goroutines end a moment after their work.
	const perConn = 2 // mochi's reader and write loop
	const slack = 4   // timers and the runtime's own, which come and go
	storetest.Eventually(t, fmt.Sprintf("%d idle connections to cost at most %d goroutines (%d each)", n, perConn*n+slack, perConn),
		func() bool { return runtime.NumGoroutine() <= base+perConn*n+slack })
}
