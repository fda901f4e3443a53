package localstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// The limit tests (issue 16, item 7): alice uses all she may of what the
// store keeps, and bob, on dsslock's own lock, does not notice.

const reasonQuotaExceeded = 0x97

// startLimited starts a store with alice and bob (see startTenants) and the
// limits set in cfg.
func startLimited(t testing.TB, cfg localstore.Config) *localstore.Server {
	t.Helper()
	cfg.Users = map[string]string{"alice": "alice-pw", "bob": "bob-pw"}
	cfg.KeyPrefixes = map[string][]string{"alice": {"a/"}, "bob": {"b/"}}
	return startStore(t, cfg)
}

// dialSSKV dials the store as o's user with dsslock's own client.
func dialSSKV(ctx context.Context, t testing.TB, srv *localstore.Server, o connOpts, id string) *sskv.Client {
	t.Helper()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id, Username: o.username, Password: []byte(o.password),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("Dial %s: %v", id, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// bobLocks checks, on dsslock's lock, that bob can still take a lock (with
// TryLock) and wait for one (Lock, which watches the key while another
// holds it).
func bobLocks(ctx context.Context, t *testing.T, srv *localstore.Server, name string) {
	t.Helper()
	holder, waiter := dialSSKV(ctx, t, srv, bob, "bob-holder"), dialSSKV(ctx, t, srv, bob, "bob-waiter")
	l1, err := lock.New(holder, lock.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l1.Close(context.Background()) })
	if ok, err := l1.TryLock(ctx); !ok || err != nil {
		t.Fatalf("bob's TryLock: %v, %v; want true, nil", ok, err)
	}
	l2, err := lock.New(waiter, lock.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close(context.Background()) })
	got := make(chan error, 1)
	go func() { got <- l2.Lock(ctx) }()
	for !srv.Watching("bob-waiter", name) {
		select {
		case err := <-got:
			t.Fatalf("bob's Lock returned %v while the lock was held", err)
		case <-ctx.Done():
			t.Fatal("bob's waiter never watched the lock")
		case <-time.After(time.Millisecond):
		}
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatalf("bob's Unlock: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("bob's Lock: %v", err)
	}
}

// TestKeysPerUser: alice fills her key quota; her next new key is refused,
// and bob's lock works. Before MaxKeysPerUser, the only bound on keys was
// MaxKeys, shared by all: alice filled it and bob's TryLock failed with
// "the quota has been exceeded".
func TestKeysPerUser(t *testing.T) {
	srv := startLimited(t, localstore.Config{MaxKeys: 10, MaxKeysPerUser: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	a := connect(t, srv, alice)
	for i := range 5 {
		mustPayload(t, a.do(cmd("SET", fmt.Sprintf("a/%d", i), "v")), okResp)
	}
	mustPayload(t, a.do(cmd("SET", "a/5", "v")), errPayload(wire.MsgQuotaExceeded))
	mustPayload(t, a.do(cmd("SET", "a/0", "longer value")), okResp) // updating her keys is not a new key
	bobLocks(ctx, t, srv, "b/lock")

	// A key she deletes, or that expires, frees its place.
	mustPayload(t, a.do(cmd("DEL", "a/0")), ":1\r\n")
	mustPayload(t, a.do(cmd("SET", "a/5", "v", "PX", "1")), okResp)
	deadline := time.Now().Add(waitTimeout)
	for {
		r := a.do(cmd("SET", "a/6", "v"))
		if r.payload == okResp {
			break
		}
		mustPayload(t, r, errPayload(wire.MsgQuotaExceeded))
		if time.Now().After(deadline) {
			t.Fatal("an expired key still counts against alice's quota")
		}
		time.Sleep(time.Millisecond) // polling for the expiry, not a signal
	}
}

// TestBytesPerUser: alice's keys take all the bytes she may use; a SET that
// would grow them is refused, one that shrinks them is not, and bob's lock
// works.
func TestBytesPerUser(t *testing.T) {
	srv := startLimited(t, localstore.Config{MaxBytesPerUser: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	a := connect(t, srv, alice)
	big := strings.Repeat("v", 1000-len("a/1"))
	mustPayload(t, a.do(cmd("SET", "a/1", big)), okResp)
	mustPayload(t, a.do(cmd("SET", "a/2", "v")), errPayload(wire.MsgQuotaExceeded))
	mustPayload(t, a.do(cmd("SET", "a/1", big+"v")), errPayload(wire.MsgQuotaExceeded))
	mustPayload(t, a.do(cmd("SET", "a/1", "small")), okResp)
	mustPayload(t, a.do(cmd("SET", "a/2", "v")), okResp)
	mustPayload(t, a.do(cmd("SET", "a/1", big)), errPayload(wire.MsgQuotaExceeded))
	bobLocks(ctx, t, srv, "b/lock")
}

// TestWatchesPerClient: a connection's watches are limited; a KEYNOTIFY
// beyond the limit gets "the quota has been exceeded", one of a key already
// watched does not, and a watch stopped frees its place. Before
// MaxWatchesPerClient, one connection registered as many as it liked
// (50,000 took 240 MB of the store's memory).
func TestWatchesPerClient(t *testing.T) {
	srv := startLimited(t, localstore.Config{MaxWatchesPerClient: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	a := connect(t, srv, alice)
	for i := range 3 {
		mustPayload(t, a.do(cmd("KEYNOTIFY", fmt.Sprintf("a/%d", i))), okResp)
	}
	mustPayload(t, a.do(cmd("KEYNOTIFY", "a/3")), errPayload(wire.MsgQuotaExceeded))
	if srv.Watching(a.id, "a/3") {
		t.Fatal("the refused watch was registered")
	}
	mustPayload(t, a.do(cmd("KEYNOTIFY", "a/0")), okResp)
	mustPayload(t, a.do(cmd("KEYNOTIFY", "a/0", "STOP")), okResp)
	mustPayload(t, a.do(cmd("KEYNOTIFY", "a/3")), okResp)

	// The limit is per connection: another of alice's has its own.
	a2 := connect(t, srv, alice)
	mustPayload(t, a2.do(cmd("KEYNOTIFY", "a/0")), okResp)
	bobLocks(ctx, t, srv, "b/lock")
}

// subscribe sends one SUBSCRIBE with filters and returns its reason codes.
func (rc *rawClient) subscribeAll(filters ...string) []byte {
	rc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var opts []paho.SubscribeOptions
	for _, f := range filters {
		opts = append(opts, paho.SubscribeOptions{Topic: f, QoS: 1})
	}
	sa, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: opts})
	if sa == nil {
		rc.t.Fatalf("subscribe %q: %v", filters, err)
	}
	return sa.Reasons
}

// TestSubscriptionsPerClient: a client's subscriptions are limited; a
// filter beyond the limit is refused with SUBACK 0x97 and has no effect,
// one the client already has is granted again, and an unsubscribe frees
// its place. Before MaxSubscriptionsPerClient, one connection made as many
// as it liked (20,000 took 46 MB).
func TestSubscriptionsPerClient(t *testing.T) {
	srv := startLimited(t, localstore.Config{MaxSubscriptionsPerClient: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	a := connect(t, srv, alice) // subscribed to its response topic: 1
	if got := a.subscribeAll("x/1", "x/2", "x/3"); string(got) != string([]byte{1, 1, reasonQuotaExceeded}) {
		t.Fatalf("SUBACK %v, want [1 1 0x97]", got)
	}
	if got := a.subscribeAll("x/1", "x/4"); string(got) != string([]byte{1, reasonQuotaExceeded}) {
		t.Fatalf("SUBACK %v, want [1 0x97]", got)
	}
	if _, err := a.c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"x/2"}}); err != nil {
		t.Fatal(err)
	}
	if got := a.subscribeAll("x/4", "x/4"); string(got) != string([]byte{1, 1}) {
		t.Fatalf("SUBACK %v, want [1 1]", got)
	}
	// The refused filter has no effect: a message on x/3 does not reach
	// her, one on x/4 does.
	for _, topic := range []string{"x/3", "x/4"} {
		if _, err := a.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(topic)}); err != nil {
			t.Fatal(err)
		}
	}
	if p := a.next(); p.Topic != "x/4" {
		t.Fatalf("got a message on %q, want only x/4's", p.Topic)
	}
	// Her requests, and their responses, still work.
	mustPayload(t, a.do(cmd("SET", "a/k", "v")), okResp)
	bobLocks(ctx, t, srv, "b/lock")
}

// publishRetained publishes a retained message at QoS 1 and returns its
// PUBACK's reason code.
func (rc *rawClient) publishRetained(topic, payload string) byte {
	rc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	pr, err := rc.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: []byte(payload)})
	if pr == nil {
		rc.t.Fatalf("publish %q: %v", topic, err)
	}
	return pr.ReasonCode
}

// retained returns the retained messages on topic (no wildcard), as a new
// subscriber gets them: it subscribes, then publishes a message that is not
// retained to the topic and collects what comes before it (the broker sends
// a subscription's retained messages before it reads the client's next
// packet).
func retained(t *testing.T, srv *localstore.Server, o connOpts, topic string) []string {
	t.Helper()
	c := connect(t, srv, o)
	c.subscribe(topic)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("marker")}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		p := c.next()
		if string(p.Payload) == "marker" && !p.Retain {
			c.close()
			return got
		}
		got = append(got, string(p.Payload))
	}
}

// TestRetainedPerUser: a user's retained messages are limited in number and
// bytes; a retained PUBLISH beyond a limit gets PUBACK 0x97 and is not
// retained, replacing or clearing one's own is allowed, other users keep
// their own quota, and a retained Will beyond it is published without
// retain. Before MaxRetainedPerUser, anyone could leave as many as they
// liked, kept after they left (200 of 1 MiB took 356 MB).
func TestRetainedPerUser(t *testing.T) {
	srv := startLimited(t, localstore.Config{MaxRetainedPerUser: 2, MaxRetainedBytesPerUser: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	a := connect(t, srv, alice)
	for _, c := range []struct {
		topic, payload string
		want           byte
	}{
		{"r/1", "one", 0},
		{"r/2", "two", 0},
		{"r/3", "three", reasonQuotaExceeded}, // a third
		{"r/1", "uno", 0},                     // replaces her own
		{"r/2", "", 0},                        // clears her own
		{"r/3", strings.Repeat("x", 1000), reasonQuotaExceeded}, // too many bytes
		{"r/3", "three", 0},
	} {
		if got := a.publishRetained(c.topic, c.payload); got != c.want {
			t.Fatalf("retained %q on %s: PUBACK 0x%02x, want 0x%02x", c.payload, c.topic, got, c.want)
		}
	}
	for topic, want := range map[string]string{"r/1": "uno", "r/2": "", "r/3": "three"} {
		got := retained(t, srv, bob, topic)
		if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != want) {
			t.Errorf("retained on %s: %q, want %q", topic, got, want)
		}
	}

	// Bob has his own quota: alice's messages do not use it.
	b := connect(t, srv, bob)
	if got := b.publishRetained("r/b", "bob's"); got != 0 {
		t.Fatalf("bob's retained message: PUBACK 0x%02x, want 0", got)
	}
	// And replacing alice's message makes it his.
	if got := b.publishRetained("r/1", "bob's too"); got != 0 {
		t.Fatalf("bob's retained message on r/1: PUBACK 0x%02x, want 0", got)
	}
	if got := a.publishRetained("r/4", "four"); got != 0 {
		t.Fatalf("alice's retained message on r/4 once r/1 was bob's: PUBACK 0x%02x, want 0", got)
	}

	// At her quota, alice's retained Will is published, not retained.
	sub := connect(t, srv, bob)
	sub.subscribe("w/alice")
	w := will("alice-will", "w/alice", true, []byte("gone"), "")
	rc, ca := connectRaw(t, srv, w)
	if ca.ReasonCode != 0 {
		t.Fatalf("alice's CONNECT with a retained Will: CONNACK 0x%02x", ca.ReasonCode)
	}
	dropAndWait(t, srv, rc)
	if p := sub.next(); string(p.Payload) != "gone" {
		t.Fatalf("got %q, want alice's Will", p.Payload)
	}
	if got := retained(t, srv, bob, "w/alice"); len(got) != 0 {
		t.Fatalf("alice's Will beyond her quota was retained: %q", got)
	}
	bobLocks(ctx, t, srv, "b/lock")
}

// TestZeroConfigUnlimited: an embedded store's zero Config sets none of the
// new limits, so that tests that relied on their absence pass as before.
func TestZeroConfigUnlimited(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a := connect(t, srv)
	for i := range 50 {
		mustPayload(t, a.do(cmd("KEYNOTIFY", fmt.Sprintf("k/%d", i))), okResp)
		if got := a.publishRetained(fmt.Sprintf("r/%d", i), "v"); got != 0 {
			t.Fatalf("retained message %d: PUBACK 0x%02x", i, got)
		}
	}
	filters := make([]string, 50)
	for i := range filters {
		filters[i] = fmt.Sprintf("x/%d", i)
	}
	for i, code := range a.subscribeAll(filters...) {
		if code != 1 {
			t.Fatalf("subscription %d: SUBACK 0x%02x", i, code)
		}
	}
	for _, cfg := range []localstore.Config{
		{MaxKeysPerUser: -1}, {MaxBytesPerUser: -1}, {MaxWatchesPerClient: -1},
		{MaxSubscriptionsPerClient: -1}, {MaxRetainedPerUser: -1}, {MaxRetainedBytesPerUser: -1},
	} {
		if srv, err := localstore.Start(cfg); err == nil {
			_ = srv.Close()
			t.Errorf("Start(%+v) accepted a negative limit", cfg)
		}
	}
}
