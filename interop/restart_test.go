package interop

import (
	"fmt"
	"testing"
)

// TestRestartSameClientID: an SDK process with a fixed client id (a pod with
// AIO_MQTT_CLIENT_ID) is killed without a DISCONNECT while its session has
// messages from the store it did not acknowledge yet, and is started again.
// The SDK connects without clean start (its default), so the store resumes
// the session and sends those messages again, ids 1, 2, 3; the new process
// numbers its own packets from 1, which it may: the client's packet ids and
// the store's are separate spaces [MQTT-2.2.1]. It must start and use the
// store as the first one did. The store used to answer its first SUBSCRIBE
// with 0x91, packet identifier in use, and the SDK did not start.
//
// Both processes hold their acknowledgements (paho sends them in batches,
// every 50 ms, so a kill or a SUBSCRIBE often comes first): that makes the
// race the test is about certain.
func TestRestartSameClientID(t *testing.T) {
	e := newEnv(t)
	key := e.key("k")
	id := "interop-restart-" + randHex(4)

	p := newCutProxy(storeAddress())
	host, port := p.hostPort()
	a := e.newClientID(id, host, port, true)
	if _, err := a.ss.Set(e.ctx, key, "v0"); err != nil {
		t.Fatalf("first process: Set: %v", err)
	}
	if err := a.ss.KeyNotify(e.ctx, key); err != nil {
		t.Fatalf("first process: KeyNotify: %v", err)
	}
	if _, err := a.ss.Get(e.ctx, key); err != nil {
		t.Fatalf("first process: Get: %v", err)
	}

	// kill -9: the connection ends without a DISCONNECT, then the process
	// is gone. Its session (and its KEYNOTIFY) stays at the store.
	p.close()
	_ = a.mqtt.Stop()
	a.close()

	// While it is away, the key changes: the store queues a notification
	// for each change in the session, unacknowledged.
	b := e.newClient("writer")
	const changes = 5
	for i := range changes {
		if _, err := b.ss.Set(e.ctx, key, fmt.Sprintf("v%d", i+1)); err != nil {
			t.Fatalf("writer: Set: %v", err)
		}
	}

	// The new process, same client id, straight to the store.
	a2 := e.newClientID(id, storeHost, storePort, true)
	got, err := a2.ss.Get(e.ctx, key)
	if err != nil {
		t.Fatalf("restarted process: Get: %v", err)
	}
	if want := fmt.Sprintf("v%d", changes); got.Value != want {
		t.Fatalf("restarted process: Get = %q, want %q", got.Value, want)
	}
	if _, err := a2.ss.Set(e.ctx, key, "after"); err != nil {
		t.Fatalf("restarted process: Set: %v", err)
	}
}
