package localstore_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	okResp     = "+OK\r\n"
	notApplied = ":-1\r\n"
	nullResp   = "$-1\r\n"
)

// TestResponses walks the response table of docs/protocol.md: payload and __ts for
// every case, and the properties every response carries.
func TestResponses(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)

	var last hlc.Timestamp
	newer := func(r response) hlc.Timestamp {
		t.Helper()
		ts, ok := r.ts()
		if !ok {
			t.Fatalf("response %q has no __ts", r.payload)
		}
		if ts.Compare(last) <= 0 {
			t.Fatalf("version %v not after %v", ts, last)
		}
		last = ts
		return ts
	}
	same := func(r response, want hlc.Timestamp) {
		t.Helper()
		ts, ok := r.ts()
		if !ok || ts != want {
			t.Fatalf("%q: __ts %v (present %v), want %v", r.payload, ts, ok, want)
		}
	}
	none := func(r response) {
		t.Helper()
		if v, ok := r.props[wire.PropTimestamp]; ok {
			t.Fatalf("%q: unexpected __ts %q", r.payload, v)
		}
	}

	// SET applied: +OK and the new version, after the request's __ts.
	before := c.clock.Peek()
	r := c.do(cmd("SET", "k", "v1"))
	mustPayload(t, r, okResp)
	v1 := newer(r)
	if v1.Compare(before) <= 0 {
		t.Fatalf("version %v not after request time %v", v1, before)
	}

	// Every response: __stat 200, __protVer 1.0, content type.
	if r.props[wire.PropStatus] != "200" || r.props[wire.PropProtocolVer] != "1.0" {
		t.Fatalf("properties %v", r.props)
	}
	if r.pub.Properties.ContentType != wire.ContentType {
		t.Fatalf("content type %q", r.pub.Properties.ContentType)
	}

	// GET hit: the value and the stored version.
	r = c.do(cmd("GET", "k"))
	mustPayload(t, r, "$2\r\nv1\r\n")
	same(r, v1)

	// SET NX on an existing key: not applied, the stored version.
	r = c.do(cmd("SET", "k", "other", "NX"))
	mustPayload(t, r, notApplied)
	same(r, v1)

	// SET NEX with another value: not applied; with the same value: applied
	// with a strictly newer version (a lease renewal).
	r = c.do(cmd("SET", "k", "other", "NEX", "PX", "60000"))
	mustPayload(t, r, notApplied)
	same(r, v1)
	r = c.do(cmd("SET", "k", "v1", "NEX", "PX", "60000"))
	mustPayload(t, r, okResp)
	v2 := newer(r)

	// GET miss: $-1 and no __ts.
	r = c.do(cmd("GET", "missing"))
	mustPayload(t, r, nullResp)
	none(r)

	// Empty value.
	r = c.do(cmd("SET", "empty", ""))
	mustPayload(t, r, okResp)
	newer(r)
	r = c.do(cmd("GET", "empty"))
	mustPayload(t, r, "$0\r\n\r\n")

	// VDEL with another value: :-1 and the version; with the value: :1.
	r = c.do(cmd("VDEL", "k", "nope"))
	mustPayload(t, r, notApplied)
	same(r, v2)
	r = c.do(cmd("VDEL", "k", "v1"))
	mustPayload(t, r, ":1\r\n")
	same(r, v2)
	r = c.do(cmd("VDEL", "k", "v1"))
	mustPayload(t, r, ":0\r\n")
	none(r)

	// DEL: :1 with the version, then :0 without.
	r = c.do(cmd("SET", "d", "x"))
	vd := newer(r)
	r = c.do(cmd("DEL", "d"))
	mustPayload(t, r, ":1\r\n")
	same(r, vd)
	r = c.do(cmd("DEL", "d"))
	mustPayload(t, r, ":0\r\n")
	none(r)

	// SET NX on a missing key is applied.
	r = c.do(cmd("SET", "d", "y", "NX"))
	mustPayload(t, r, okResp)
	newer(r)

	// KEYNOTIFY: +OK (also when already watching), no __ts; STOP: +OK, then :0.
	for range 2 {
		r = c.do(cmd("KEYNOTIFY", "d"))
		mustPayload(t, r, okResp)
		none(r)
	}
	r = c.do(cmd("KEYNOTIFY", "d", "STOP"))
	mustPayload(t, r, okResp)
	r = c.do(cmd("KEYNOTIFY", "d", "STOP"))
	mustPayload(t, r, ":0\r\n")
	none(r)

	// DEL and VDEL need no __ts.
	r = c.do(cmd("DEL", "d").withoutTS())
	mustPayload(t, r, ":1\r\n")
}

// TestVersionsFollowRequestClock: a request from a client whose clock is ahead
// gets a version after its __ts (HLC update), and later versions stay after it.
func TestVersionsFollowRequestClock(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	ahead := hlc.Timestamp{Wall: time.Now().Add(30 * time.Second).UnixMilli(), Counter: 7, Node: "fast"}
	r := c.do(cmd("SET", "k", "v").withoutTS().with(wire.PropTimestamp, ahead.String()))
	mustPayload(t, r, okResp)
	v, _ := r.ts()
	if v.Compare(ahead) <= 0 || v.Node != "statestore" {
		t.Fatalf("version %v, want after %v from node statestore", v, ahead)
	}
	r = c.do(cmd("SET", "k2", "v"))
	v2, _ := r.ts()
	if v2.Compare(v) <= 0 {
		t.Fatalf("later version %v not after %v", v2, v)
	}
}

// TestErrors checks every error message byte for byte, and that a failed
// request changes nothing and the store keeps serving.
func TestErrors(t *testing.T) {
	srv := startStore(t, localstore.Config{MaxKeySize: 16, MaxValueSize: 32})
	c := connect(t, srv)
	mustPayload(t, c.do(cmd("SET", "keep", "v")), okResp)

	future := hlc.Timestamp{Wall: time.Now().Add(2 * time.Minute).UnixMilli(), Node: "c"}.String()
	tests := []struct {
		name string
		req  request
		want string
	}{
		{"unknown verb", cmd("MGET", "k"), wire.MsgUnknownCommand},
		{"lower-case verb", cmd("set", "k", "v"), wire.MsgUnknownCommand},
		{"GET arity", cmd("GET"), wire.MsgWrongArgs},
		{"GET extra", cmd("GET", "a", "b"), wire.MsgWrongArgs},
		{"SET arity", cmd("SET", "k"), wire.MsgWrongArgs},
		{"DEL arity", cmd("DEL", "a", "b"), wire.MsgWrongArgs},
		{"VDEL arity", cmd("VDEL", "a"), wire.MsgWrongArgs},
		{"KEYNOTIFY arity", cmd("KEYNOTIFY"), wire.MsgWrongArgs},
		{"KEYNOTIFY bad option", cmd("KEYNOTIFY", "k", "GET"), wire.MsgSyntaxError},
		{"not RESP", request{payload: []byte("SET k v"), qos: 1}, wire.MsgSyntaxError},
		{"empty payload", request{payload: []byte{}, qos: 1}, wire.MsgSyntaxError},
		{"truncated", request{payload: []byte("*2\r\n$3\r\nGET\r\n$5\r\nab"), qos: 1}, wire.MsgSyntaxError},
		{"trailing bytes", request{payload: []byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\nX"), qos: 1}, wire.MsgSyntaxError},
		{"bad SET option", cmd("SET", "k", "v", "XX"), wire.MsgSyntaxError},
		{"NX and NEX", cmd("SET", "k", "v", "NX", "NEX"), wire.MsgSyntaxError},
		{"PX without ms", cmd("SET", "k", "v", "PX"), wire.MsgSyntaxError},
		{"PX zero", cmd("SET", "k", "v", "PX", "0"), wire.MsgSyntaxError},
		{"PX negative", cmd("SET", "k", "v", "PX", "-5"), wire.MsgSyntaxError},
		{"PX not a number", cmd("SET", "k", "v", "PX", "1s"), wire.MsgSyntaxError},
		{"PX overflow", cmd("SET", "k", "v", "PX", "99999999999999999999999"), wire.MsgSyntaxError},
		{"NEX with argument", cmd("SET", "k", "v", "NEX", "v"), wire.MsgSyntaxError},
		{"missing timestamp", cmd("SET", "k", "v").withoutTS(), wire.MsgMissingTimestamp},
		{"malformed timestamp", cmd("SET", "k", "v").withoutTS().with("__ts", "yesterday"), wire.MsgMalformedTS},
		{"malformed timestamp on GET", cmd("GET", "k").withoutTS().with("__ts", "1:2"), wire.MsgMalformedTS},
		{"timestamp in the future", cmd("SET", "k", "v").withoutTS().with("__ts", future), wire.MsgTimestampSkew},
		{"malformed fencing token", cmd("SET", "k", "v").with("__ft", "x:y:z"), wire.MsgMalformedTS},
		{"fencing token in the future", cmd("SET", "k", "v").with("__ft", future), wire.MsgFencingSkew},
		{"empty key SET", cmd("SET", "", "v"), wire.MsgKeyLengthZero},
		{"empty key GET", cmd("GET", ""), wire.MsgKeyLengthZero},
		{"empty key KEYNOTIFY", cmd("KEYNOTIFY", ""), wire.MsgKeyLengthZero},
		{"key too long", cmd("SET", strings.Repeat("k", 17), "v"), wire.MsgQuotaExceeded},
		{"value too long", cmd("SET", "k", strings.Repeat("v", 33)), wire.MsgQuotaExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.do(tt.req)
			mustPayload(t, r, errPayload(tt.want))
			if r.props[wire.PropStatus] != "200" {
				t.Fatalf("__stat %q on an error", r.props[wire.PropStatus])
			}
		})
	}
	// Nothing changed; the store still serves.
	mustPayload(t, c.do(cmd("GET", "k")), nullResp)
	mustPayload(t, c.do(cmd("GET", "keep")), "$1\r\nv\r\n")
	if n := srv.Len(); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
}

// TestFencing follows the fencing rules of docs/protocol.md for SET, DEL and VDEL.
func TestFencing(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)

	// A lock's version serves as the token.
	lock := c.do(cmd("SET", "lock", "c1", "NEX", "PX", "60000"))
	tok1, _ := lock.ts()
	mustPayload(t, c.do(cmd("SET", "res", "a").with("__ft", tok1.String())), okResp)

	// Without a token, every write is refused; GET ignores fencing.
	mustPayload(t, c.do(cmd("SET", "res", "b")), errPayload(wire.MsgFencingRequired))
	mustPayload(t, c.do(cmd("DEL", "res")), errPayload(wire.MsgFencingRequired))
	mustPayload(t, c.do(cmd("VDEL", "res", "a")), errPayload(wire.MsgFencingRequired))
	mustPayload(t, c.do(cmd("GET", "res")), "$1\r\na\r\n")

	// The same token is accepted; a newer one replaces it; the older one is
	// then refused.
	mustPayload(t, c.do(cmd("SET", "res", "b").with("__ft", tok1.String())), okResp)
	renew := c.do(cmd("SET", "lock", "c1", "NEX", "PX", "60000"))
	tok2, _ := renew.ts()
	mustPayload(t, c.do(cmd("SET", "res", "c").with("__ft", tok2.String())), okResp)
	mustPayload(t, c.do(cmd("SET", "res", "d").with("__ft", tok1.String())), errPayload(wire.MsgFencingLower))
	mustPayload(t, c.do(cmd("DEL", "res").with("__ft", tok1.String())), errPayload(wire.MsgFencingLower))
	mustPayload(t, c.do(cmd("VDEL", "res", "c").with("__ft", tok1.String())), errPayload(wire.MsgFencingLower))

	// A failed conditional on a fenced key still checks the token first.
	mustPayload(t, c.do(cmd("SET", "res", "x", "NX")), errPayload(wire.MsgFencingRequired))
	mustPayload(t, c.do(cmd("SET", "res", "x", "NX").with("__ft", tok2.String())), notApplied)
	mustPayload(t, c.do(cmd("VDEL", "res", "other").with("__ft", tok2.String())), notApplied)

	// The token goes away with the key.
	mustPayload(t, c.do(cmd("VDEL", "res", "c").with("__ft", tok2.String())), ":1\r\n")
	mustPayload(t, c.do(cmd("SET", "res", "free")), okResp)
	mustPayload(t, c.do(cmd("DEL", "res")), ":1\r\n")

	// ... and with its expiry.
	mustPayload(t, c.do(cmd("SET", "short", "a", "PX", "1").with("__ft", tok2.String())), okResp)
	waitGone(t, c, "short")
	mustPayload(t, c.do(cmd("SET", "short", "b")), okResp)
}

// waitGone polls GET until key is gone. Used only where the test has no
// notification to wait on.
func waitGone(t *testing.T, c *rawClient, key string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for c.do(cmd("GET", key)).payload != nullResp {
		if time.Now().After(deadline) {
			t.Fatalf("key %q still there after %v", key, waitTimeout)
		}
	}
}

// TestExpiry: a PX key disappears on time, with a DELETE notification to its
// watchers, and a renewal (NEX PX) extends it.
func TestExpiry(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	w := connect(t, srv)
	mustPayload(t, w.do(cmd("KEYNOTIFY", "lease")), okResp)

	start := time.Now()
	mustPayload(t, c.do(cmd("SET", "lease", "me", "NX", "PX", "200")), okResp)
	n := w.next() // SET notification
	if string(n.Payload) != "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$2\r\nme\r\n" {
		t.Fatalf("SET notification %q", n.Payload)
	}
	n = w.next() // expiry
	elapsed := time.Since(start)
	if string(n.Payload) != "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n" {
		t.Fatalf("expiry notification %q", n.Payload)
	}
	if elapsed < 200*time.Millisecond {
		t.Fatalf("expired after %v, before its PX of 200ms", elapsed)
	}
	t.Logf("PX 200ms: DELETE notification after %v", elapsed)
	mustPayload(t, c.do(cmd("GET", "lease")), nullResp)

	// SET without PX on a key with an expiry removes the expiry.
	mustPayload(t, c.do(cmd("SET", "lease", "me", "PX", "100")), okResp)
	mustPayload(t, c.do(cmd("SET", "lease", "me")), okResp)
	mustPayload(t, c.do(cmd("SET", "probe", "x", "PX", "150")), okResp)
	mustPayload(t, c.do(cmd("KEYNOTIFY", "probe")), okResp)
	for { // wait for probe's expiry: lease's old deadline (100ms) is past by then
		if p := c.next(); string(p.Payload) == "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n" {
			break
		}
	}
	mustPayload(t, c.do(cmd("GET", "lease")), "$2\r\nme\r\n")
}

// TestNotifications: topic, payloads, __ts, exactly-once delivery with or
// without a subscription of the client's own, and privacy.
func TestNotifications(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	writer := connect(t, srv)
	quiet := connect(t, srv)      // never subscribes to its notify topic (like the Go SDK)
	subscribed := connect(t, srv) // subscribes to its notify topic, twice over
	snoop := connect(t, srv)      // subscribes to everything
	subscribed.subscribe(wire.NotifyFilter(subscribed.id))
	subscribed.subscribe(wire.NotifyPrefix + "/#")
	snoop.subscribe("#")

	key := "sensor/\x00setPoint"
	for _, c := range []*rawClient{quiet, subscribed} {
		mustPayload(t, c.do(cmd("KEYNOTIFY", key)), okResp)
	}

	set := writer.do(cmd("SET", key, "21.5"))
	version, _ := set.ts()
	del := writer.do(cmd("DEL", key))
	mustPayload(t, del, ":1\r\n")
	// A last write to a key only snoop's own traffic touches, as a marker: once
	// it is seen, everything before it has been delivered.
	marker := writer.do(cmd("SET", "marker", "m"))
	_ = marker

	for _, c := range []*rawClient{quiet, subscribed} {
		topic := wire.NotifyTopic(c.id, []byte(key))
		if want := "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/" + upperHex(c.id) + "/command/notify/73656E736F722F00736574506F696E74"; topic != want {
			t.Fatalf("topic %q, want %q", topic, want)
		}
		n := c.next()
		if n.Topic != topic || string(n.Payload) != "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\n21.5\r\n" {
			t.Fatalf("%s: SET notification %q on %q", c.id, n.Payload, n.Topic)
		}
		if n.QoS != 1 {
			t.Fatalf("notification at QoS %d", n.QoS)
		}
		if got := decode(n).props[wire.PropTimestamp]; got != version.String() {
			t.Fatalf("SET notification __ts %q, want the version %v", got, version)
		}
		n = c.next()
		if string(n.Payload) != "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n" {
			t.Fatalf("DELETE notification %q", n.Payload)
		}
		ts, err := hlc.Parse(decode(n).props[wire.PropTimestamp])
		if err != nil || ts.Compare(version) <= 0 {
			t.Fatalf("DELETE notification __ts %v (%v), want after %v", ts, err, version)
		}
	}
	// Exactly once: a round trip later, nothing more has arrived.
	for _, c := range []*rawClient{quiet, subscribed} {
		c.do(cmd("GET", "marker"))
		c.noMessage()
	}
	// The snooper saw the responses it is subscribed to (all of them, via #),
	// but no notification.
	snoop.do(cmd("GET", "marker"))
	for {
		select {
		case p := <-snoop.other:
			if strings.HasPrefix(p.Topic, wire.NotifyPrefix) {
				t.Fatalf("another client's notification reached the snooper: %q", p.Topic)
			}
			continue
		default:
		}
		break
	}

	// Nobody but the store publishes notifications.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	pr, err := snoop.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: wire.NotifyTopic(quiet.id, []byte(key)), Payload: []byte("*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n")})
	if err == nil && pr.ReasonCode < 0x80 {
		t.Fatalf("forged notification accepted (reason 0x%02x)", pr.ReasonCode)
	}
	quiet.do(cmd("GET", "marker"))
	quiet.noMessage()
}

func upperHex(s string) string {
	const digits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteByte(digits[s[i]>>4])
		b.WriteByte(digits[s[i]&15])
	}
	return b.String()
}

// TestWatchEndsOnDisconnect: watches belong to a connection; the same client
// id reconnecting has none until it sends KEYNOTIFY again.
func TestWatchEndsOnDisconnect(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	writer := connect(t, srv)
	id := "watcher-" + t.Name()
	w := connect(t, srv, connOpts{id: id, expiry: 3600, noCleanup: true})
	mustPayload(t, w.do(cmd("KEYNOTIFY", "a")), okResp)
	w.close()

	// Same id, resumed session (clean start is set by the helper, so use the
	// session expiry instead): the old watch must not deliver.
	w2 := connect(t, srv, connOpts{id: id, expiry: 3600})
	mustPayload(t, w2.do(cmd("KEYNOTIFY", "b")), okResp)
	writer.do(cmd("SET", "a", "1"))
	writer.do(cmd("SET", "b", "2"))
	n := w2.next()
	if _, key, _ := wire.ParseNotifyTopic(n.Topic); string(key) != "b" {
		t.Fatalf("got a notification for %q after the watch ended", key)
	}
	// The kicked client's watches end too.
	if err := srv.Kick(id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w2.c.Done():
	case <-time.After(waitTimeout):
		t.Fatal("kicked client still connected")
	}
	if err := srv.Kick(id); err == nil {
		t.Fatal("Kick of a gone client: no error")
	}
}

// TestForbiddenResponseTopic: the store disconnects a client that asks for a
// response on the invoke topic or under the notification prefix.
func TestForbiddenResponseTopic(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	for _, topic := range []string{wire.InvokeTopic, wire.NotifyPrefix + "/x/command/notify/00"} {
		c := connect(t, srv)
		// The PUBACK never comes: publish in the background, until the
		// disconnect ends it.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		published := make(chan struct{})
		go func() {
			defer close(published)
			_, _ = c.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: wire.InvokeTopic, Payload: cmd("SET", "k", "v").payload,
				Properties: &paho.PublishProperties{ResponseTopic: topic, CorrelationData: []byte("0123456789abcdef"),
					User: paho.UserProperties{{Key: "__ts", Value: c.clock.Now().String()}}}})
		}()
		select {
		case <-c.c.Done():
		case <-time.After(waitTimeout):
			t.Fatalf("response topic %q: client not disconnected", topic)
		}
		cancel()
		<-published
	}
	c := connect(t, srv)
	mustPayload(t, c.do(cmd("GET", "k")), nullResp)
}

// TestInvalidRequests: QoS 0, no correlation data, no response topic: never
// executed.
func TestInvalidRequests(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)

	r := cmd("SET", "q0", "v")
	r.qos = 0
	if got := c.do(r).payload; !strings.HasPrefix(got, "-ERR ") {
		t.Fatalf("QoS 0 request answered %q", got)
	}
	r = cmd("SET", "nocorr", "v")
	r.noCorr = true
	ch, _ := c.send(r)
	select {
	case p := <-ch:
		if !strings.HasPrefix(string(p.Payload), "-ERR ") {
			t.Fatalf("request without correlation data answered %q", p.Payload)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no answer to a request without correlation data")
	}
	empty := ""
	r = cmd("SET", "notopic", "v")
	r.respTopc = &empty
	c.send(r) // dropped: nothing to wait for but the next response
	for _, k := range []string{"q0", "nocorr", "notopic"} {
		mustPayload(t, c.do(cmd("GET", k)), nullResp)
	}
}

// TestPlainMQTT: the store is also an ordinary broker.
func TestPlainMQTT(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a, b := connect(t, srv), connect(t, srv)
	b.subscribe("factory/+/temp")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := a.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: "factory/line1/temp", Payload: []byte("20.1"),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "unit", Value: "C"}}}}); err != nil {
		t.Fatal(err)
	}
	p := b.next()
	if p.Topic != "factory/line1/temp" || string(p.Payload) != "20.1" || decode(p).props["unit"] != "C" {
		t.Fatalf("got %q %q %v", p.Topic, p.Payload, decode(p).props)
	}
	if p.Properties.MessageExpiry != nil {
		t.Fatalf("message got an expiry of %d s it was not sent with", *p.Properties.MessageExpiry)
	}
}

// TestQuota: MaxKeys counts keys; updates of existing keys still work.
func TestQuota(t *testing.T) {
	srv := startStore(t, localstore.Config{MaxKeys: 2})
	c := connect(t, srv)
	mustPayload(t, c.do(cmd("SET", "a", "1")), okResp)
	mustPayload(t, c.do(cmd("SET", "b", "1")), okResp)
	mustPayload(t, c.do(cmd("SET", "c", "1")), errPayload(wire.MsgQuotaExceeded))
	mustPayload(t, c.do(cmd("SET", "a", "2")), okResp)
	mustPayload(t, c.do(cmd("DEL", "b")), ":1\r\n")
	mustPayload(t, c.do(cmd("SET", "c", "1")), okResp)
}

// TestClockOffset: a store whose clock is behind the client's refuses
// requests stamped more than the max drift ahead of it, accepts those within
// it, and versions them after the request's time.
func TestClockOffset(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	srv.SetClockOffset(-2 * time.Minute)
	c := connect(t, srv)
	mustPayload(t, c.do(cmd("SET", "k", "v")), errPayload(wire.MsgTimestampSkew))
	now := time.Now()
	old := hlc.Timestamp{Wall: now.Add(-2 * time.Minute).UnixMilli(), Node: "c"}
	tok := hlc.Timestamp{Wall: now.UnixMilli(), Node: "c"}
	mustPayload(t, c.do(cmd("SET", "k", "v").withoutTS().with("__ts", old.String()).with("__ft", tok.String())),
		errPayload(wire.MsgFencingSkew))

	srv.SetClockOffset(-30 * time.Second)
	before := c.clock.Peek()
	r := c.do(cmd("SET", "k", "v"))
	mustPayload(t, r, okResp)
	if v, _ := r.ts(); v.Compare(before) <= 0 {
		t.Fatalf("version %v not after the request's time %v", v, before)
	}
	srv.SetClockOffset(0)
}

// TestReconnectSameID: a client that reconnects at once with the same id,
// session expiry 0, keeps receiving its responses.
func TestReconnectSameID(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	id := "flappy"
	for i := range 20 {
		c := connect(t, srv, connOpts{id: id, noCleanup: true})
		mustPayload(t, c.do(cmd("SET", "n", "x")), okResp)
		if i%2 == 0 {
			_ = srv.Drop(id)
		} else {
			c.close()
		}
		<-c.c.Done()
	}
	c := connect(t, srv, connOpts{id: id})
	mustPayload(t, c.do(cmd("GET", "n")), "$1\r\nx\r\n")
}

// TestPipelined: many requests in flight on one connection all get their own
// response.
func TestPipelined(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	type inflight struct {
		ch   <-chan *paho.Publish
		corr []byte
		i    int
	}
	var all []inflight
	for i := range 200 {
		ch, corr := c.send(cmd("SET", "k"+string(rune('a'+i%26)), strings.Repeat("x", i)))
		all = append(all, inflight{ch, corr, i})
	}
	for _, f := range all {
		mustPayload(t, c.await(f.ch, f.corr), okResp)
	}
}

// Requests counts every request a client sends, executed or refused, and
// nothing else it publishes.
func TestRequestsCounted(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	if n := srv.Requests(c.id); n != 0 {
		t.Fatalf("Requests before any = %d", n)
	}
	for _, req := range []request{cmd("SET", "k", "v"), cmd("GET", "k"), cmd("FROB")} {
		ch, corr := c.send(req)
		c.await(ch, corr)
	}
	if n := srv.Requests(c.id); n != 3 {
		t.Fatalf("Requests = %d; want 3", n)
	}
	if n := srv.Requests("nobody"); n != 0 {
		t.Fatalf("Requests of an unknown client = %d", n)
	}
}

// TestCloseBounded: Close returns even with a connection that never sent
// CONNECT and a client that is connected.
func TestCloseBounded(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{CloseTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := netDial(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := connect(t, srv, connOpts{noCleanup: true})
	done := make(chan struct{})
	go func() { _ = srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("Close did not return")
	}
	<-c.c.Done()
	if _, err := localstore.Start(localstore.Config{Addr: "256.0.0.1:1"}); err == nil {
		t.Fatal("Start on a bad address: no error")
	}
	_ = os.Getpid
}
