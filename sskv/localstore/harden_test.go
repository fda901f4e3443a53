package localstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// promptBound is the generous safety bound on "answered promptly": far above
// any normal latency (a few milliseconds), far below the ~90 s freeze a
// paused client used to cause.
const promptBound = 2 * time.Second

// connectWithin connects a new client and fails if that takes longer than
// promptBound; it returns how long it took.
func connectWithin(t *testing.T, srv *localstore.Server) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan *rawClient, 1)
	go func() {
		rc, err := dial(t, srv, connOpts{})
		if err != nil {
			t.Errorf("dial: %v", err)
		}
		done <- rc
	}()
	select {
	case rc := <-done:
		if rc != nil {
			rc.close()
		}
		return time.Since(start)
	case <-time.After(promptBound):
		t.Fatalf("a new client could not connect within %v", promptBound)
		return 0
	}
}

// TestPausedWatcherDoesNotFreezeStore: a watcher that registers KEYNOTIFY
// and then never reads its socket (keep-alive 0, so nothing times it out)
// while another client writes thousands of large values: every SET is
// answered promptly, new clients connect at once, and the store disconnects
// the watcher instead of waiting for it. The store used to publish
// notifications while holding its lock, and that publish waited on the
// broker's write to the watcher's full socket: the whole store froze.
func TestPausedWatcherDoesNotFreezeStore(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	base := connectWithin(t, srv)

	w := dialRaw(t, srv.Addr(), 4096)
	w.connect("paused-watcher", 0)
	w.watch("paused/response", "hot")
	if !srv.Watching("paused-watcher", "hot") {
		t.Fatal("watch not registered")
	}
	// From here on the watcher never reads.

	writer := connect(t, srv)
	const sets = 3000
	var worst, total time.Duration
	var connects []time.Duration
	for i := range sets {
		size := 1024 + (i*7919)%(39*1024) // 1-40 KB
		value := strings.Repeat(string(rune('a'+i%26)), size)
		start := time.Now()
		ch, corr := writer.send(cmd("SET", "hot", value))
		select {
		case p := <-ch:
			if !bytes.Equal(p.Properties.CorrelationData, corr) || string(p.Payload) != okResp {
				t.Fatalf("SET %d: got %q", i, p.Payload)
			}
		case <-time.After(promptBound):
			t.Fatalf("SET %d (%d bytes) not answered within %v: the paused watcher froze the store", i, size, promptBound)
		}
		d := time.Since(start)
		total += d
		worst = max(worst, d)
		if i == 300 || i == 1500 { // the watcher's socket is long full
			connects = append(connects, connectWithin(t, srv))
		}
	}
	t.Logf("connect before the watcher paused: %v; while paused: %v", base, connects)
	t.Logf("SET latency during the pause (%d SETs of 1-40 KB): mean %v, worst %v", sets, total/sets, worst)

	// The watcher cannot keep up: it is disconnected, not waited for.
	deadline := time.Now().Add(waitTimeout)
	for srv.Connected("paused-watcher") {
		if time.Now().After(deadline) {
			t.Fatalf("paused watcher still connected %v after the writes", waitTimeout)
		}
		time.Sleep(10 * time.Millisecond) // polling the store's state: there is no event to wait on
	}
}

// TestClockErrors: a request stamped 50 s ahead with a counter near its
// maximum is accepted and does not stop the clock for anyone else (issue 6's
// repro). When the store's own clock is ahead of its wall clock by more than
// the drift (the wall clock stepped back), requests are refused with the
// store's own message, not "the request timestamp is too far in the future".
func TestClockErrors(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a, b := connect(t, srv), connect(t, srv)
	ahead := hlc.Timestamp{Wall: time.Now().Add(50 * time.Second).UnixMilli(), Counter: 2147483645, Node: "a"}
	mustPayload(t, a.do(cmd("SET", "ctr", "v").withoutTS().with("__ts", ahead.String())), okResp)
	for i := range 5 {
		mustPayload(t, b.do(cmd("SET", fmt.Sprintf("k%d", i), "v")), okResp)
		mustPayload(t, a.do(cmd("GET", "ctr")), "$1\r\nv\r\n")
	}

	// The store's wall clock steps back two minutes: its clock (which
	// issued versions 50 s ahead) is now far ahead of it.
	srv.SetClockOffset(-2 * time.Minute)
	old := hlc.Timestamp{Wall: time.Now().Add(-5 * time.Minute).UnixMilli(), Node: "b"}
	r := b.do(cmd("SET", "k", "v").withoutTS().with("__ts", old.String()))
	mustPayload(t, r, errPayload(localstore.MsgClockAhead))
	srv.SetClockOffset(0)
	mustPayload(t, b.do(cmd("SET", "k", "v")), okResp)
}

// memDelta runs f and returns how many bytes the process allocated meanwhile.
func memDelta(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestOversizedPacketHeaders: ten connected clients that each declare a 256
// MB PUBLISH, and ten unauthenticated connections that declare a 256 MB
// CONNECT, are cut off before the store allocates anything for them.
func TestOversizedPacketHeaders(t *testing.T) {
	const huge = 268435455 // MQTT's largest remaining length
	srv := startStore(t, localstore.Config{Users: map[string]string{"u": "p"}})
	allocated := memDelta(func() {
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := dialRaw(t, srv.Addr(), 0)
				c.id = fmt.Sprintf("big-%d", i)
				if i < 10 {
					_, _ = c.c.Write(append(lengthHeader(0x10, huge), 0, 4, 'M', 'Q'))
				} else {
					rm := uint16(100)
					c.write(&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: fmt.Sprintf("big-%d", i),
						UsernameFlag: true, Username: "u", PasswordFlag: true, Password: []byte("p"),
						Properties: &packets.Properties{ReceiveMaximum: &rm}})
					if p, err := c.tryRead(); err != nil || p.Type != packets.CONNACK || p.Content.(*packets.Connack).ReasonCode != 0 {
						t.Errorf("%s: connect refused: %v %v", c.id, p, err)
						return
					}
					_, _ = c.c.Write(append(lengthHeader(0x32, huge), 0, 1, 'x'))
				}
				if _, err := c.closed(); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	})
	t.Logf("allocated %d KB while 20 connections declared 256 MB packets", allocated/1024)
	if allocated > 64<<20 {
		t.Fatalf("allocated %d MB for packets declared but never sent", allocated>>20)
	}

	// The limit is announced in CONNACK, and a packet within it still works.
	c := dialRaw(t, srv.Addr(), 0)
	rm := uint16(100)
	c.write(&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "within",
		UsernameFlag: true, Username: "u", PasswordFlag: true, Password: []byte("p"),
		Properties: &packets.Properties{ReceiveMaximum: &rm}})
	ca := c.read().Content.(*packets.Connack)
	if ca.Properties == nil || ca.Properties.MaximumPacketSize == nil || *ca.Properties.MaximumPacketSize != localstore.DefaultMaxPacketSize {
		t.Fatalf("CONNACK does not announce the maximum packet size %d: %+v", localstore.DefaultMaxPacketSize, ca.Properties)
	}
}

// TestMaxPacketSize: a packet over Config.MaxPacketSize ends the connection
// without being executed; one within it is served.
func TestMaxPacketSize(t *testing.T) {
	srv := startStore(t, localstore.Config{MaxPacketSize: 64 << 10})
	c := connect(t, srv)
	mustPayload(t, c.do(cmd("SET", "small", strings.Repeat("v", 60<<10))), okResp)

	raw := dialRaw(t, srv.Addr(), 0)
	raw.connect("too-big", 30)
	raw.write(raw.request(1, "too-big/response", "SET", "big", strings.Repeat("v", 65<<10)))
	raw.readUntilClosed()
	mustPayload(t, c.do(cmd("GET", "big")), nullResp)
}

// TestTruncatedSubscribe: an MQTT 5 SUBSCRIBE that ends right after its topic
// filter, without the subscription options byte, makes mochi's decoder index
// past the packet (mochi-mqtt/server#501). The panic ended the whole
// process: any client could stop the store with eight bytes. FuzzMQTTInput
// found it. Now the connection is closed as for any malformed packet, the
// store forgets its watches, the store goes on serving, and the client id
// can connect again.
func TestTruncatedSubscribe(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	raw := dialRaw(t, srv.Addr(), 0)
	raw.connect("truncated", 30)
	raw.watch("truncated/response", "k")
	if !srv.Watching("truncated", "k") {
		t.Fatal("the KEYNOTIFY was not registered")
	}

	// SUBSCRIBE, packet id 1, no properties, filter "k", and no options byte.
	if _, err := raw.c.Write([]byte{0x82, 0x06, 0, 1, 0, 0, 1, 'k'}); err != nil {
		t.Fatal(err)
	}
	raw.readUntilClosed()
	storetest.Eventually(t, "the store to forget the closed connection's watch", func() bool { return !srv.Watching("truncated", "k") })
	mustPayload(t, c.do(cmd("SET", "k", "v")), okResp)
	dialRaw(t, srv.Addr(), 0).connect("truncated", 30)
}

// TestInvalidResponseTopic: a request whose response topic has a wildcard
// (or is otherwise not a topic one can publish to) cannot be answered, so it
// is not executed: its PUBACK says 0x90 (topic name invalid).
func TestInvalidResponseTopic(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	for _, topic := range []string{"resp/+", "resp/#", "+", "$SYS/resp"} {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		pr, err := c.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: wire.InvokeTopic, Payload: cmd("SET", "k", topic).payload,
			Properties: &paho.PublishProperties{ResponseTopic: topic, CorrelationData: []byte("0123456789abcdef"),
				User: paho.UserProperties{{Key: "__ts", Value: c.clock.Now().String()}}}})
		cancel()
		if err == nil || pr == nil || pr.ReasonCode != 0x90 {
			t.Fatalf("response topic %q: publish returned %+v, %v; want PUBACK 0x90", topic, pr, err)
		}
	}
	mustPayload(t, c.do(cmd("GET", "k")), nullResp)
}

// TestUnacknowledgedResponses: a client that pipelines requests and reads
// its responses but never acknowledges them reaches the store's limit of
// unacknowledged messages (Config.MaxPendingMessages). It is disconnected
// with 0x97 (quota exceeded), and no request beyond the limit is executed.
// The broker used to execute them all and drop the responses beyond its
// in-flight limit ("client store quota reached") without a word. Responses
// not yet written when the DISCONNECT goes out end with the connection, as
// every message in flight of a session that is not kept does (under load a
// few dozen of them); a client that keeps its session gets them on resume.
func TestUnacknowledgedResponses(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	const limit, sent = 8192, 9000
	c := dialRaw(t, srv.Addr(), 0)
	c.connect("no-acks", 0)
	c.subscribe("no-acks/response")
	writeErr := make(chan error, 1)
	go func() {
		var buf bytes.Buffer
		for i := range sent {
			_, _ = c.request(uint16(i+2), "no-acks/response", "SET", fmt.Sprintf("k%05d", i), "v").WriteTo(&buf)
			if buf.Len() > 64<<10 || i == sent-1 {
				if _, err := c.c.Write(buf.Bytes()); err != nil {
					writeErr <- err
					return
				}
				buf.Reset()
			}
		}
		writeErr <- nil
	}()
	answered := map[string]bool{}
	var disc *packets.Disconnect
	for {
		p, err := c.tryRead()
		if err != nil {
			break
		}
		switch x := p.Content.(type) {
		case *packets.Publish:
			answered[fmt.Sprintf("k%05d", int(x.Properties.CorrelationData[0])<<8|int(x.Properties.CorrelationData[1])-2)] = true
		case *packets.Disconnect:
			disc = x
		}
	}
	<-writeErr
	if disc == nil || disc.ReasonCode != 0x97 {
		t.Fatalf("after %d answers: disconnect %+v, want reason 0x97", len(answered), disc)
	}
	if len(answered) > limit {
		t.Errorf("%d requests answered, more than the limit %d", len(answered), limit)
	}
	// Every answered request was executed, and none beyond the limit.
	check := connect(t, srv)
	executed := 0
	for i := range sent {
		k := fmt.Sprintf("k%05d", i)
		got := check.do(cmd("GET", k)).payload
		if got != nullResp {
			executed++
		} else if answered[k] {
			t.Fatalf("request %s answered but not executed", k)
		}
	}
	if executed > limit || executed < len(answered) {
		t.Fatalf("%d requests executed, %d answered; want at most the limit %d executed", executed, len(answered), limit)
	}
	t.Logf("%d executed, %d answered before the DISCONNECT", executed, len(answered))
}

// TestReceiveMaximum: a client that has more QoS 2 messages in flight to the
// store than the store's Receive Maximum (1024) is disconnected with 0x93.
// (QoS 1 messages are acknowledged as they are read, so they never count
// against it.)
func TestReceiveMaximum(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dialRaw(t, srv.Addr(), 0)
	ca := c.connect("qos2-flood", 0)
	if ca.Properties == nil || ca.Properties.ReceiveMaximum == nil || *ca.Properties.ReceiveMaximum != 1024 {
		t.Fatalf("CONNACK Receive Maximum %+v, want 1024", ca.Properties)
	}
	go func() {
		var buf bytes.Buffer
		for i := range 1100 {
			_, _ = (&packets.Publish{QoS: 2, PacketID: uint16(i + 1), Topic: "flood", Payload: []byte("x"),
				Properties: &packets.Properties{}}).WriteTo(&buf)
		}
		_, _ = c.c.Write(buf.Bytes())
	}()
	d := c.readUntilClosed()
	if d == nil || d.ReasonCode != 0x93 {
		t.Fatalf("disconnect %+v, want 0x93 (receive maximum exceeded)", d)
	}
}

// recordingHandler keeps every log record's text, and signals records whose
// message is watched.
type recordingHandler struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	h     slog.Handler
	watch string
	seen  chan struct{}
	once  sync.Once
}

func newRecordingHandler(watch string) *recordingHandler {
	r := &recordingHandler{watch: watch, seen: make(chan struct{})}
	r.h = slog.NewTextHandler(&r.buf, &slog.HandlerOptions{Level: slog.LevelDebug})
	return r
}

func (r *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordingHandler) Handle(ctx context.Context, rec slog.Record) error {
	r.mu.Lock()
	err := r.h.Handle(ctx, rec)
	r.mu.Unlock()
	if rec.Message == r.watch {
		r.once.Do(func() { close(r.seen) })
	}
	return err
}
func (r *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{r: r, attrs: as}
}
func (r *recordingHandler) WithGroup(string) slog.Handler { return r }
func (r *recordingHandler) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

type attrHandler struct {
	r     *recordingHandler
	attrs []slog.Attr
}

func (a *attrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (a *attrHandler) Handle(ctx context.Context, rec slog.Record) error {
	rec.AddAttrs(a.attrs...)
	return a.r.Handle(ctx, rec)
}
func (a *attrHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{r: a.r, attrs: append(slices.Clip(a.attrs), as...)}
}
func (a *attrHandler) WithGroup(string) slog.Handler { return a }

// TestLogHasNoPayloads: the broker's "error processing packet" warning names
// the packet with sizes, never with its payload: a stored value must not
// reach the log, nor a 40 KB value make a 150 KB line.
func TestLogHasNoPayloads(t *testing.T) {
	rec := newRecordingHandler("error processing packet")
	srv := startStore(t, localstore.Config{Logger: slog.New(rec)})
	c := dialRaw(t, srv.Addr(), 0)
	c.connect("bad-publisher", 0)
	secret := "SECRET-" + strings.Repeat("x", 40<<10)
	// A PUBLISH with neither a topic nor a topic alias: a protocol error.
	c.write(&packets.Publish{QoS: 1, PacketID: 1, Topic: "", Payload: []byte(secret), Properties: &packets.Properties{}})
	select {
	case <-rec.seen:
	case <-time.After(waitTimeout):
		t.Fatal("no 'error processing packet' log record")
	}
	log := rec.text()
	if strings.Contains(log, "SECRET") || strings.Contains(log, "83 69 67 82 69 84") { // also as decimal bytes
		t.Fatal("the payload reached the log")
	}
	for _, line := range strings.Split(log, "\n") {
		if len(line) > 1024 {
			t.Fatalf("log line of %d bytes: %.300s...", len(line), line)
		}
		if strings.Contains(line, "error processing packet") && !strings.Contains(line, fmt.Sprint(len(secret))) {
			t.Errorf("the warning does not give the payload size %d: %s", len(secret), line)
		}
	}
}

// A keep alive of 5 s, sskv's default, is logged at Debug, not as mochi's
// warning on every connection.
func TestShortKeepAliveNotWarned(t *testing.T) {
	rec := newRecordingHandler(mqtt.ErrMinimumKeepalive.Error())
	srv := startStore(t, localstore.Config{Logger: slog.New(rec)})
	dialRaw(t, srv.Addr(), 0).connect("short-keepalive", 5)
	select {
	case <-rec.seen:
	case <-time.After(waitTimeout):
		t.Fatal("no keep alive record")
	}
	for _, line := range strings.Split(rec.text(), "\n") {
		if strings.Contains(line, "keepalive") && !strings.Contains(line, "level=DEBUG") {
			t.Errorf("logged above Debug: %s", line)
		}
	}
}
