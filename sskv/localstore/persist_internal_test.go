package localstore

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	mochipk "github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// TestPersistedAnswerWaitsForDisk: a persisted SET is executed at once,
// but neither its PUBACK, nor its answer, nor the notification of a
// watcher goes out before its write is durable; all go out once it is.
// The disk is held up by holding the engine's write transaction.
func TestPersistedAnswerWaitsForDisk(t *testing.T) {
	srv, err := Start(Config{Persist: PersistAll, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := dialQueueTest(t, srv.Addr(), "durable", 0)
	defer c.Close()
	const respTopic = "clients/durable/resp"
	c.subscribe(t, respTopic, 1)
	clock, _ := hlc.NewClock("durable")
	send := func(id uint16, args ...string) {
		t.Helper()
		var b [][]byte
		for _, a := range args {
			b = append(b, []byte(a))
		}
		if _, err := (&packets.Publish{QoS: 1, PacketID: id, Topic: wire.InvokeTopic,
			Payload: resp.AppendCommand(nil, b...),
			Properties: &packets.Properties{ResponseTopic: respTopic, CorrelationData: []byte{byte(id)},
				User: []packets.User{{Key: wire.PropTimestamp, Value: clock.Now().String()}}}}).WriteTo(c); err != nil {
			t.Fatal(err)
		}
	}
	// recv returns the PUBACK ids and response correlations read until
	// both of want's have come, or until the deadline.
	recv := func(deadline time.Time, acks, answers int) (gotAcks, gotAnswers int) {
		t.Helper()
		_ = c.SetReadDeadline(deadline)
		defer func() { _ = c.SetReadDeadline(time.Time{}) }()
		for gotAcks < acks || gotAnswers < answers {
			p, err := packets.ReadPacket(c.r)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch p.Type {
			case packets.PUBACK:
				gotAcks++
			case packets.PUBLISH:
				gotAnswers++
				pub := p.Content.(*packets.Publish)
				_, _ = (&packets.Puback{PacketID: pub.PacketID, Properties: &packets.Properties{}}).WriteTo(c)
			}
		}
		return
	}
	send(1, "SET", "first", "v") // raises the high-water mark of versions: the next SET does not write it
	if a, r := recv(time.Now().Add(10*time.Second), 1, 1); a != 1 || r != 1 {
		t.Fatalf("first SET: %d PUBACKs, %d answers", a, r)
	}
	send(3, "KEYNOTIFY", "second")
	if a, r := recv(time.Now().Add(10*time.Second), 1, 1); a != 1 || r != 1 {
		t.Fatalf("KEYNOTIFY: %d PUBACKs, %d answers", a, r)
	}

	tx, err := srv.persist.db.Begin(true) // the committer waits for it
	if err != nil {
		t.Fatal(err)
	}
	send(2, "SET", "second", "v")
	deadline := time.Now().Add(10 * time.Second)
	for srv.Len() != 2 { // executed, in memory
		if time.Now().After(deadline) {
			_ = tx.Rollback()
			t.Fatal("the SET was not executed while the disk was held")
		}
		time.Sleep(time.Millisecond)
	}
	a, r := recv(time.Now().Add(300*time.Millisecond), 1, 2)
	_ = tx.Rollback()
	if a != 0 || r != 0 {
		t.Fatalf("while its write was not durable: %d PUBACKs and %d answers or notifications went out, want none", a, r)
	}
	if a, r := recv(time.Now().Add(10*time.Second), 1, 2); a != 1 || r != 2 {
		t.Fatalf("once durable: %d PUBACKs, %d answers and notifications, want 1 and 2", a, r)
	}
}

// TestPersistVersionsAfterClockStepBack: a store whose wall clock was
// ahead issues versions ahead; restarted with its wall clock stepped back,
// it still issues only greater versions.
func TestPersistVersionsAfterClockStepBack(t *testing.T) {
	dir := t.TempDir()
	srv, err := Start(Config{Persist: PersistDynamic, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetClockOffset(20 * time.Second)
	ahead := srv.setForTest(t, "k")
	next, err := srv.Restart(t.Context(), 0) // its offset is 0: the wall clock stepped back by 20 s
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if v := next.setForTest(t, "k2"); v.Compare(ahead) <= 0 {
		t.Fatalf("version %v after the restart, not above %v issued before", v, ahead)
	}
	_ = os.RemoveAll(dir)
}

// setForTest executes a SET of key (not persisted) and returns its version.
func (s *Server) setForTest(t *testing.T, key string) hlc.Timestamp {
	t.Helper()
	clock, _ := hlc.NewClock("test")
	res, _ := s.serve(clientRef{id: "test"}, "", resp.AppendCommand(nil, []byte("SET"), []byte(key), []byte("v")),
		[]mochipk.UserProperty{{Key: wire.PropTimestamp, Val: clock.Now().String()}}, time.Time{}, repeatable{})
	if res.version.IsZero() {
		t.Fatalf("SET %s: %q", key, res.payload)
	}
	return res.version
}
