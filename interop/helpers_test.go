package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/mqtt/retry"
	"github.com/Azure/iot-operations-sdks/go/protocol"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
)

const (
	// testTimeout bounds every test (all its SDK calls take this context).
	testTimeout = 60 * time.Second
	// waitTimeout bounds a single wait for a signal (notification, response).
	waitTimeout = 10 * time.Second
	// connectTimeout bounds the initial MQTT connection of a client.
	connectTimeout = 15 * time.Second
	// dumpTail is how many trailing lines of a log a failing test prints.
	dumpTail = 400

	invokeTopic = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"
	notifyTopic = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/%s/command/notify/%s"
)

// lineLog is a concurrency-safe, append-only log of text lines.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

func (l *lineLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

func (l *lineLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n > len(l.lines) {
		n = len(l.lines)
	}
	return append([]string(nil), l.lines[n:]...)
}

// writer returns an io.Writer that splits what it gets into lines.
func (l *lineLog) writer(prefix string) io.Writer {
	return &lineWriter{log: l, prefix: prefix}
}

type lineWriter struct {
	mu      sync.Mutex
	log     *lineLog
	prefix  string
	partial []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.log.add(w.prefix + string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// env is the per-test context: a deadline for every SDK call, and the logs
// that a failing test prints (the store's log since the test started and the
// SDK clients' debug logs, which include every MQTT packet they sent and got).
type env struct {
	t      testing.TB
	ctx    context.Context
	sdkLog *lineLog
	// quiet discards the SDK clients' logs instead of keeping them at debug
	// level: benchmarks measure the SDK, not the formatting of its log.
	quiet bool
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvTimeout(t, testTimeout)
}

// newEnvTimeout is newEnv with a deadline of d for every SDK call.
func newEnvTimeout(t testing.TB, d time.Duration) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e := &env{t: t, ctx: ctx, sdkLog: &lineLog{}}
	mark := storeLog.len()
	// Registered first, so it runs last: after the clients have closed.
	t.Cleanup(func() {
		cancel()
		if !t.Failed() {
			return
		}
		if storeHost != "" && storeLog.len() == 0 && mark == 0 {
			t.Logf("state store log: none captured (external store via %s?)", addrEnv)
		} else {
			logTail(t, "state store log during this test", storeLog.since(mark))
		}
		logTail(t, "SDK client log (debug, with MQTT packets)", e.sdkLog.since(0))
	})
	return e
}

func logTail(t testing.TB, title string, lines []string) {
	t.Helper()
	skipped := 0
	if len(lines) > dumpTail {
		skipped = len(lines) - dumpTail
		lines = lines[skipped:]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "---- %s (%d lines", title, len(lines)+skipped)
	if skipped > 0 {
		fmt.Fprintf(&b, ", first %d not shown", skipped)
	}
	b.WriteString(") ----\n")
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	b.WriteString("---- end ----")
	t.Log(b.String())
}

// waitCtx returns a context for one wait: waitTimeout, within the test's.
func (e *env) waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, waitTimeout)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// key returns a key name unique to this test run.
func (e *env) key(name string) string {
	return fmt.Sprintf("interop/%s/%s/%s", e.t.Name(), name, randHex(4))
}

// client is one official SDK state store client on its own MQTT session and
// its own protocol.Application (as separate processes would have).
type client struct {
	id   string
	app  *protocol.Application
	mqtt *mqtt.SessionClient
	ss   *statestore.Client[string, string]

	closeOnce sync.Once
}

// newClient connects a new SDK client to the store under test. It fails the
// test (rather than hanging) if the connection cannot be made in time.
func (e *env) newClient(name string) *client {
	e.t.Helper()
	return e.newClientAt(name, storeHost, storePort)
}

// newClientAt is newClient through host:port (a proxy in front of the store,
// say) instead of the store's own address.
func (e *env) newClientAt(name, host string, port uint16) *client {
	e.t.Helper()
	return e.newClientID(fmt.Sprintf("interop-%s-%s", name, randHex(4)), host, port, false)
}

// newClientID is newClientAt with the MQTT client id given, as a pod with a
// fixed AIO_MQTT_CLIENT_ID has. The SDK's defaults are kept: no clean start,
// the longest session expiry. With holdAcks, the client never acknowledges
// a message it gets (the SDK acknowledges one only when every message
// handler has), as a process that is killed before it did.
func (e *env) newClientID(id, host string, port uint16, holdAcks bool) *client {
	t := e.t
	t.Helper()

	logger := slog.New(slog.NewTextHandler(
		e.sdkLog.writer(""),
		&slog.HandlerOptions{Level: slog.LevelDebug},
	)).With("client", id)
	if e.quiet {
		logger = slog.New(slog.DiscardHandler)
	}

	app, err := protocol.NewApplication(protocol.WithLogger(logger))
	if err != nil {
		t.Fatalf("protocol.NewApplication: %v", err)
	}

	mc, err := mqtt.NewSessionClient(
		id,
		mqtt.TCPConnection(host, port),
		mqtt.WithConnectionTimeout(5*time.Second),
		mqtt.WithConnectionRetry(&retry.ExponentialBackoff{
			MaxAttempts: 4,
			MaxInterval: time.Second,
			Timeout:     connectTimeout,
			Logger:      logger,
		}),
		mqtt.WithLogger(logger),
	)
	if err != nil {
		t.Fatalf("mqtt.NewSessionClient: %v", err)
	}
	if holdAcks {
		t.Cleanup(mc.RegisterMessageHandler(func(context.Context, *mqtt.Message) {}))
	}
	return e.startClient(id, app, mc, logger)
}

// startClient starts mc, waits until it is connected and returns a started
// state store client on it, closed at the end of the test.
func (e *env) startClient(id string, app *protocol.Application, mc *mqtt.SessionClient, logger *slog.Logger) *client {
	t := e.t
	t.Helper()
	connected := make(chan struct{}, 1)
	fatal := make(chan error, 1)
	unregConn := mc.RegisterConnectEventHandler(func(*mqtt.ConnectEvent) {
		select {
		case connected <- struct{}{}:
		default:
		}
	})
	defer unregConn()
	unregFatal := mc.RegisterFatalErrorHandler(func(err error) {
		select {
		case fatal <- err:
		default:
		}
	})
	defer unregFatal()

	if err := mc.Start(); err != nil {
		t.Fatalf("SessionClient.Start: %v", err)
	}

	ctx, cancel := context.WithTimeout(e.ctx, connectTimeout)
	defer cancel()
	select {
	case <-connected:
	case err := <-fatal:
		_ = mc.Stop()
		t.Fatalf("client %s could not connect to %s: %v", id, storeAddress(), err)
	case <-ctx.Done():
		_ = mc.Stop()
		t.Fatalf("client %s did not connect to %s within %s", id, storeAddress(), connectTimeout)
	}

	ss, err := statestore.New[string, string](app, mc, statestore.WithLogger(logger))
	if err != nil {
		_ = mc.Stop()
		t.Fatalf("statestore.New: %v", err)
	}

	c := &client{id: id, app: app, mqtt: mc, ss: ss}
	t.Cleanup(c.close)

	if err := ss.Start(e.ctx); err != nil {
		t.Fatalf("statestore Client.Start (subscribe to the response topic): %v", err)
	}
	return c
}

// close shuts the client down (once; also run at cleanup); bounded even if
// the store is unresponsive (Client.Close unsubscribes with a background
// context).
func (c *client) close() {
	c.closeOnce.Do(c.doClose)
}

func (c *client) doClose() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.ss.Close()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	_ = c.mqtt.Stop() // also unblocks a stuck Close
	<-done
}

// notifyTopicFor is the topic on which the store delivers notifications of
// key to this client (docs/protocol.md: upper-case hex of client id and key).
func (c *client) notifyTopicFor(key string) string {
	return fmt.Sprintf(notifyTopic,
		strings.ToUpper(hex.EncodeToString([]byte(c.id))),
		strings.ToUpper(hex.EncodeToString([]byte(key))))
}

type notification = statestore.Notify[string, string]

// queue forwards an SDK notification channel into a large buffer so that
// the SDK never blocks on us, and lets tests wait on it with a deadline.
type queue struct {
	e   *env
	key string
	ch  chan notification
}

// watch registers a channel for notifications of key on c (the SDK's
// Client.Notify). It does not send KEYNOTIFY; the test does.
func (e *env) watch(c *client, key string) *queue {
	src, done := c.ss.Notify(key)
	q := &queue{e: e, key: key, ch: make(chan notification, 1024)}
	go func() {
		defer close(q.ch)
		for n := range src {
			q.ch <- n
		}
	}()
	e.t.Cleanup(done)
	return q
}

// next waits for the next notification.
func (q *queue) next(what string) notification {
	q.e.t.Helper()
	ctx, cancel := q.e.waitCtx()
	defer cancel()
	select {
	case n, ok := <-q.ch:
		if !ok {
			q.e.t.Fatalf("key %q: notification channel closed while waiting for %s", q.key, what)
		}
		return n
	case <-ctx.Done():
		q.e.t.Fatalf("key %q: no notification within %s while waiting for %s", q.key, waitTimeout, what)
	}
	panic("unreachable")
}

// expectSet waits for the next notification and checks it is a SET of val.
func (q *queue) expectSet(val string) notification {
	q.e.t.Helper()
	n := q.next(fmt.Sprintf("SET %q", val))
	if n.Key != q.key || n.Operation != "SET" || n.Value != val {
		q.e.t.Fatalf("key %q: got notification {Key:%q Operation:%q Value:%q Version:%v}, want {Operation:\"SET\" Value:%q}",
			q.key, n.Key, n.Operation, n.Value, n.Version, val)
	}
	if n.Version.IsZero() {
		q.e.t.Errorf("key %q: SET notification has no version (no __ts user property)", q.key)
	}
	return n
}

// expectDelete waits for the next notification and checks it is a DELETE.
func (q *queue) expectDelete(what string) notification {
	q.e.t.Helper()
	n := q.next("DELETE (" + what + ")")
	if n.Key != q.key || n.Operation != "DELETE" {
		q.e.t.Fatalf("key %q: got notification {Key:%q Operation:%q Value:%q Version:%v}, want {Operation:\"DELETE\"} (%s)",
			q.key, n.Key, n.Operation, n.Value, n.Version, what)
	}
	if n.Value != "" {
		q.e.t.Errorf("key %q: DELETE notification carries value %q, want none", q.key, n.Value)
	}
	if n.Version.IsZero() {
		q.e.t.Errorf("key %q: DELETE notification has no version (no __ts user property)", q.key)
	}
	return n
}

// expectEmpty checks that nothing further has been delivered. Call it only
// after a positive signal that anything sent before it must have arrived.
func (q *queue) expectEmpty(why string) {
	q.e.t.Helper()
	for {
		select {
		case n, ok := <-q.ch:
			if !ok {
				return
			}
			q.e.t.Errorf("key %q: unexpected notification {Operation:%q Value:%q Version:%v} (%s)",
				q.key, n.Operation, n.Value, n.Version, why)
		default:
			return
		}
	}
}

// rawWatch calls fn for every PUBLISH that reaches c's MQTT session (all
// topics, before the SDK's own handlers see them). It acks each message.
func (e *env) rawWatch(c *client, fn func(*mqtt.Message)) {
	done := c.mqtt.RegisterMessageHandler(func(_ context.Context, m *mqtt.Message) {
		defer m.Ack()
		fn(m)
	})
	e.t.Cleanup(done)
}
