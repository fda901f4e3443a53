package sskv_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestGetSetDel(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)

	g, err := c.Get(ctx, "k")
	if err != nil || g.Found || g.Value != nil || !g.Version.IsZero() {
		t.Fatalf("Get missing: %+v, %v", g, err)
	}
	s1, err := c.Set(ctx, "k", []byte("v1"), sskv.SetOptions{})
	if err != nil || !s1.Applied || s1.Version.IsZero() {
		t.Fatalf("Set: %+v, %v", s1, err)
	}
	g, err = c.Get(ctx, "k")
	if err != nil || !g.Found || string(g.Value) != "v1" || g.Version != s1.Version {
		t.Fatalf("Get: %+v, %v (want version %v)", g, err, s1.Version)
	}
	s2, err := c.Set(ctx, "k", nil, sskv.SetOptions{})
	if err != nil || !s2.Applied || !s2.Version.After(s1.Version) {
		t.Fatalf("Set empty: %+v, %v", s2, err)
	}
	g, err = c.Get(ctx, "k")
	if err != nil || !g.Found || g.Value == nil || len(g.Value) != 0 {
		t.Fatalf("Get empty value: %+v, %v", g, err)
	}
	if s, err := c.Set(ctx, "persisted", []byte("p"), sskv.SetOptions{Persist: true}); err != nil || !s.Applied {
		t.Fatalf("Set Persist: %+v, %v", s, err)
	}
	bin := []byte("a\r\nb\x00$-1\r\n")
	if _, err := c.Set(ctx, "bin", bin, sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if g, err := c.Get(ctx, "bin"); err != nil || !bytes.Equal(g.Value, bin) {
		t.Fatalf("binary value: %q, %v", g.Value, err)
	}

	d, err := c.Del(ctx, "k", sskv.DelOptions{})
	if err != nil || !d.Deleted || d.Mismatch {
		t.Fatalf("Del: %+v, %v", d, err)
	}
	d, err = c.Del(ctx, "k", sskv.DelOptions{})
	if err != nil || d.Deleted || d.Mismatch {
		t.Fatalf("Del missing: %+v, %v", d, err)
	}

	if _, err := c.Set(ctx, "vk", []byte("mine"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	d, err = c.VDel(ctx, "vk", []byte("theirs"), sskv.DelOptions{})
	if err != nil || d.Deleted || !d.Mismatch || d.Version.IsZero() {
		t.Fatalf("VDel mismatch: %+v, %v", d, err)
	}
	d, err = c.VDel(ctx, "vk", []byte("mine"), sskv.DelOptions{})
	if err != nil || !d.Deleted || d.Mismatch {
		t.Fatalf("VDel: %+v, %v", d, err)
	}
	d, err = c.VDel(ctx, "vk", []byte("mine"), sskv.DelOptions{})
	if err != nil || d.Deleted || d.Mismatch {
		t.Fatalf("VDel missing: %+v, %v", d, err)
	}
}

func TestSetConditions(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)

	nx := sskv.SetOptions{Condition: sskv.IfNotExists}
	a, err := c.Set(ctx, "lock", []byte("a"), nx)
	if err != nil || !a.Applied {
		t.Fatalf("NX on missing key: %+v, %v", a, err)
	}
	b, err := c.Set(ctx, "lock", []byte("b"), nx)
	if err != nil || b.Applied || b.Version != a.Version {
		t.Fatalf("NX on existing key: %+v, %v (want not applied, version %v)", b, err, a.Version)
	}

	nex := sskv.SetOptions{Condition: sskv.IfEqualOrNotExists}
	r, err := c.Set(ctx, "lock", []byte("a"), nex)
	if err != nil || !r.Applied || !r.Version.After(a.Version) {
		t.Fatalf("NEX renewal: %+v, %v", r, err)
	}
	o, err := c.Set(ctx, "lock", []byte("other"), nex)
	if err != nil || o.Applied || o.Version != r.Version {
		t.Fatalf("NEX other value: %+v, %v", o, err)
	}
	n, err := c.Set(ctx, "fresh", []byte("x"), nex)
	if err != nil || !n.Applied {
		t.Fatalf("NEX on missing key: %+v, %v", n, err)
	}
	if _, err := c.Set(ctx, "k", nil, sskv.SetOptions{Condition: 9}); !errors.Is(err, sskv.ErrInvalidOption) {
		t.Fatalf("bad condition: %v", err)
	}
}

func TestSetExpiry(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)

	for _, d := range []time.Duration{-time.Millisecond, time.Nanosecond, 999 * time.Microsecond} {
		if _, err := c.Set(ctx, "k", nil, sskv.SetOptions{Expiry: d}); !errors.Is(err, sskv.ErrInvalidOption) {
			t.Errorf("Expiry %v: %v, want ErrInvalidOption", d, err)
		}
	}
	if srv.Len() != 0 {
		t.Fatal("an invalid SET was sent")
	}

	w, err := c.Watch(ctx, "lease")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	s, err := c.Set(ctx, "lease", []byte("me"), sskv.SetOptions{Expiry: 30*time.Millisecond + 500*time.Microsecond})
	if err != nil || !s.Applied {
		t.Fatalf("Set PX: %+v, %v", s, err)
	}
	if ev := nextEvent(t, w); ev.Op != sskv.OpSet {
		t.Fatalf("event %+v, want SET", ev)
	}
	ev := nextEvent(t, w) // the expiry
	if ev.Op != sskv.OpDelete || !ev.Version.After(s.Version) || ev.Resync {
		t.Fatalf("event %+v, want DELETE after %v", ev, s.Version)
	}
	if g, err := c.Get(ctx, "lease"); err != nil || g.Found {
		t.Fatalf("Get after expiry: %+v, %v", g, err)
	}
}

func TestFencing(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)

	lock, err := c.Set(ctx, "lock", []byte("me"), sskv.SetOptions{Condition: sskv.IfNotExists})
	if err != nil {
		t.Fatal(err)
	}
	token := lock.Version
	if _, err := c.Set(ctx, "data", []byte("1"), sskv.SetOptions{FencingToken: token}); err != nil {
		t.Fatalf("fenced SET: %v", err)
	}
	_, err = c.Set(ctx, "data", []byte("2"), sskv.SetOptions{})
	if !errors.Is(err, sskv.ErrFencingTokenRequired) {
		t.Fatalf("SET without token: %v", err)
	}
	older := hlc.Timestamp{Wall: token.Wall - 1, Node: token.Node}
	if _, err = c.Set(ctx, "data", []byte("2"), sskv.SetOptions{FencingToken: older}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("SET with older token: %v", err)
	}
	if _, err = c.Del(ctx, "data", sskv.DelOptions{}); !errors.Is(err, sskv.ErrFencingTokenRequired) {
		t.Fatalf("DEL without token: %v", err)
	}
	if _, err = c.VDel(ctx, "data", []byte("1"), sskv.DelOptions{FencingToken: older}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("VDEL with older token: %v", err)
	}
	newer, err := c.Set(ctx, "lock", []byte("me"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := c.Set(ctx, "data", []byte("3"), sskv.SetOptions{FencingToken: newer.Version}); err != nil || !s.Applied {
		t.Fatalf("SET with newer token: %+v, %v", s, err)
	}
	if _, err = c.Set(ctx, "data", []byte("4"), sskv.SetOptions{FencingToken: token}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("the newer token did not replace the old: %v", err)
	}
	if d, err := c.VDel(ctx, "data", []byte("3"), sskv.DelOptions{FencingToken: newer.Version}); err != nil || !d.Deleted {
		t.Fatalf("fenced VDEL: %+v, %v", d, err)
	}
	if _, err := c.Set(ctx, "data", nil, sskv.SetOptions{FencingToken: hlc.Timestamp{Wall: 1, Node: "a:b"}}); !errors.Is(err, sskv.ErrInvalidOption) {
		t.Fatalf("invalid token: %v", err)
	}
}

// TestServiceErrors drives every error of the service from the local store
// and checks it maps to its sentinel, and only to it.
func TestServiceErrors(t *testing.T) {
	srv := startStore(t, localstore.Config{
		MaxKeys:     3,
		KeyPrefixes: map[string][]string{"": {"ok/", "q/", "f/"}},
	})
	c := dial(t, srv)
	ctx := testCtx(t)
	raw := func(payload []byte, props map[string]string, withTS bool) error {
		_, err := sskv.DoRawForTest(ctx, c, payload, props, withTS)
		return err
	}

	lock, err := c.Set(ctx, "f/lock", []byte("x"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "f/data", []byte("x"), sskv.SetOptions{FencingToken: lock.Version}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "q/1", nil, sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	farToken := hlc.Timestamp{Wall: time.Now().Add(2 * time.Minute).UnixMilli(), Node: "x"}

	all := []error{sskv.ErrTimestampSkew, sskv.ErrFencingTokenRequired, sskv.ErrFencingTokenSkew,
		sskv.ErrFencingTokenLower, sskv.ErrQuotaExceeded, sskv.ErrSyntax, sskv.ErrNotAuthorized,
		sskv.ErrUnknownCommand, sskv.ErrWrongArgs, sskv.ErrMissingTimestamp, sskv.ErrMalformedTimestamp,
		sskv.ErrKeyLengthZero}
	cases := []struct {
		want error
		run  func() error
	}{
		{sskv.ErrFencingTokenRequired, func() error {
			_, err := c.Set(ctx, "f/data", nil, sskv.SetOptions{})
			return err
		}},
		{sskv.ErrFencingTokenLower, func() error {
			_, err := c.Del(ctx, "f/data", sskv.DelOptions{FencingToken: hlc.Timestamp{Wall: 1, Node: "old"}})
			return err
		}},
		{sskv.ErrFencingTokenSkew, func() error {
			_, err := c.Set(ctx, "f/data", nil, sskv.SetOptions{FencingToken: farToken})
			return err
		}},
		{sskv.ErrQuotaExceeded, func() error {
			_, err := c.Set(ctx, "q/2", nil, sskv.SetOptions{})
			return err
		}},
		{sskv.ErrNotAuthorized, func() error {
			_, err := c.Get(ctx, "secret/x")
			return err
		}},
		{sskv.ErrKeyLengthZero, func() error {
			_, err := c.Get(ctx, "")
			return err
		}},
		{sskv.ErrSyntax, func() error { return raw(sskv.Command("SET", "ok/k", "v", "BOGUS"), nil, true) }},
		{sskv.ErrSyntax, func() error { return raw([]byte("not resp"), nil, true) }},
		{sskv.ErrUnknownCommand, func() error { return raw(sskv.Command("MGET", "ok/k"), nil, true) }},
		{sskv.ErrWrongArgs, func() error { return raw(sskv.Command("GET"), nil, true) }},
		{sskv.ErrMissingTimestamp, func() error { return raw(sskv.Command("SET", "ok/k", "v"), nil, false) }},
		{sskv.ErrMalformedTimestamp, func() error {
			return raw(sskv.Command("SET", "ok/k", "v"), map[string]string{"__ts": "yesterday"}, false)
		}},
		{sskv.ErrTimestampSkew, func() error {
			srv.SetClockOffset(-2 * time.Minute)
			defer srv.SetClockOffset(0)
			_, err := c.Set(ctx, "ok/k", nil, sskv.SetOptions{})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.want.Error(), func(t *testing.T) {
			err := tc.run()
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var se *sskv.ServiceError
			if !errors.As(err, &se) || se.Message == "" {
				t.Fatalf("%v is not a *ServiceError", err)
			}
			for _, other := range all {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("%v also matches %v", err, other)
				}
			}
		})
	}
}

func TestServiceErrorIs(t *testing.T) {
	typo := &sskv.ServiceError{Message: wire.MsgFencingLowerDoc}
	if !errors.Is(typo, sskv.ErrFencingTokenLower) {
		t.Error("the document's typo does not match ErrFencingTokenLower")
	}
	unknown := &sskv.ServiceError{Message: "the moon is in the wrong phase"}
	for _, s := range []error{sskv.ErrSyntax, sskv.ErrNotAuthorized, sskv.ErrMalformedResponse} {
		if errors.Is(unknown, s) {
			t.Errorf("unknown message matches %v", s)
		}
	}
	if got := unknown.Error(); got != "sskv: state store error: the moon is in the wrong phase" {
		t.Errorf("Error() = %q", got)
	}
}

// TestRequestProperties checks everything a request carries, as the fake
// service sees it.
func TestRequestProperties(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	f := startFake(t, srv)
	f.attach(c)

	token := hlc.Timestamp{Wall: time.Now().UnixMilli(), Counter: 3, Node: "statestore"}
	ctx, cancel := context.WithTimeout(context.Background(), 3500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists,
			Expiry: 1500 * time.Millisecond, FencingToken: token, Persist: true})
		done <- err
	}()
	req := f.next()
	args, err := resp.ParseCommand(req.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"SET", "k", "v", "NEX", "PX", "1500"}
	if len(args) != len(want) {
		t.Fatalf("args %q, want %q", args, want)
	}
	for i := range want {
		if string(args[i]) != want[i] {
			t.Fatalf("args %q, want %q", args, want)
		}
	}
	p := req.Properties
	if req.QoS != 1 {
		t.Errorf("QoS %d", req.QoS)
	}
	if p.ContentType != wire.ContentType {
		t.Errorf("content type %q", p.ContentType)
	}
	if len(p.CorrelationData) != 16 {
		t.Errorf("correlation data %x", p.CorrelationData)
	}
	if wantTopic := "clients/" + c.ID() + "/services/statestore/_any_/command/invoke/response"; p.ResponseTopic != wantTopic {
		t.Errorf("response topic %q, want %q", p.ResponseTopic, wantTopic)
	}
	if p.MessageExpiry == nil || *p.MessageExpiry != 4 {
		t.Errorf("message expiry %v, want 4 (3.5 s rounded up)", p.MessageExpiry)
	}
	u := p.User
	for k, v := range map[string]string{"__protVer": "1.0", "__srcId": c.ID(), "$partition": c.ID(),
		"__ft": token.String(), "aio-persistence": "true"} {
		if got := u.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	ts, err := hlc.Parse(u.Get("__ts"))
	if err != nil || ts.Node != c.ID() {
		t.Errorf("__ts %q: %v", u.Get("__ts"), err)
	}
	version := hlc.Timestamp{Wall: ts.Wall, Counter: ts.Counter + 1, Node: "statestore"}
	f.respond(req, "+OK\r\n", "__stat", "200", "__ts", version.String())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if now := sskv.ClockForTest(c).Now(); !now.After(version) {
		t.Errorf("client clock %v not updated past the response version %v", now, version)
	}

	// A plain request has no __ft and no aio-persistence.
	go func() {
		_, err := c.Del(testCtx(t), "k", sskv.DelOptions{})
		done <- err
	}()
	req = f.next()
	for _, k := range []string{"__ft", "aio-persistence"} {
		if len(req.Properties.User.GetAll(k)) != 0 {
			t.Errorf("plain DEL has %s", k)
		}
	}
	if e := req.Properties.MessageExpiry; e == nil || *e != 10 {
		t.Errorf("default message expiry %v, want 10", e)
	}
	f.respond(req, ":1\r\n", "__stat", "200")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestResponseForms feeds the client every form of response the service or
// the document may send, and malformed ones.
func TestResponseForms(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	f := startFake(t, srv)
	f.attach(c)
	ver := "000001700000000:00001:statestore"

	type outcome struct {
		res any
		err error
	}
	cases := []struct {
		name    string
		call    func(context.Context, *sskv.Client) (any, error)
		payload string
		props   []string
		want    any   // result, when err is nil
		wantErr error // errors.Is target
	}{
		{"set applied", set, "+OK\r\n", []string{"__stat", "200", "__ts", ver}, sskv.SetResult{Applied: true, Version: mustTS(ver)}, nil},
		{"set not applied :-1", set, ":-1\r\n", []string{"__stat", "200", "__ts", ver}, sskv.SetResult{Version: mustTS(ver)}, nil},
		{"set not applied -1 (document)", set, "-1\r\n", []string{"__stat", "200"}, sskv.SetResult{}, nil},
		{"set OK without CRLF", set, "+OK", []string{"__stat", "200", "__ts", ver}, sskv.SetResult{Applied: true, Version: mustTS(ver)}, nil},
		{"set applied without __ts", set, "+OK\r\n", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
		{"get hit", get, "$3\r\nabc\r\n", []string{"__stat", "200", "__ts", ver}, sskv.GetResult{Value: []byte("abc"), Version: mustTS(ver), Found: true}, nil},
		{"get miss", get, "$-1\r\n", []string{"__stat", "200"}, sskv.GetResult{}, nil},
		{"get RESP3 null", get, "_\r\n", []string{"__stat", "200"}, sskv.GetResult{}, nil},
		{"vdel mismatch -1", vdel, "-1\r\n", []string{"__stat", "200"}, sskv.DelResult{Mismatch: true}, nil},
		{"vdel mismatch :-1", vdel, ":-1\r\n", []string{"__stat", "200", "__ts", ver}, sskv.DelResult{Mismatch: true, Version: mustTS(ver)}, nil},
		{"del -1 is not valid", del, ":-1\r\n", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
		{"ERR with colon", get, "-ERR: not authorized\r\n", []string{"__stat", "200"}, nil, sskv.ErrNotAuthorized},
		{"ERR without CRLF", get, "-ERR syntax error", []string{"__stat", "200"}, nil, sskv.ErrSyntax},
		{"no __stat", get, "$-1\r\n", nil, nil, sskv.ErrMalformedResponse},
		{"malformed __ts", get, "$1\r\nx\r\n", []string{"__stat", "200", "__ts", "12:ab"}, nil, sskv.ErrMalformedResponse},
		{"empty payload", get, "", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
		{"garbage payload", get, "\x00\xff garbage", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
		{"huge declared length", get, "$999999999\r\nx", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
		{"wrong reply type", get, ":1\r\n", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
		{"array reply", set, "*1\r\n$1\r\nx\r\n", []string{"__stat", "200"}, nil, sskv.ErrMalformedResponse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan outcome, 1)
			go func() {
				r, err := tc.call(testCtx(t), c)
				done <- outcome{r, err}
			}()
			f.respond(f.next(), tc.payload, tc.props...)
			o := <-done
			if tc.wantErr != nil {
				if !errors.Is(o.err, tc.wantErr) {
					t.Fatalf("err %v, want %v", o.err, tc.wantErr)
				}
				return
			}
			if o.err != nil {
				t.Fatalf("err %v", o.err)
			}
			if !equalResult(o.res, tc.want) {
				t.Fatalf("got %+v, want %+v", o.res, tc.want)
			}
		})
	}

	t.Run("unknown error message", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := c.Get(testCtx(t), "k"); done <- err }()
		f.respond(f.next(), "-ERR the moon is in the wrong phase\r\n", "__stat", "200")
		err := <-done
		var se *sskv.ServiceError
		if !errors.As(err, &se) || se.Message != "the moon is in the wrong phase" {
			t.Fatalf("err %v, want the verbatim message", err)
		}
	})
	t.Run("non-200 status", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := c.Get(testCtx(t), "k"); done <- err }()
		f.respond(f.next(), "", "__stat", "500", "__stMsg", "boom")
		var se *sskv.ServiceError
		if err := <-done; !errors.As(err, &se) || se.Message != "status 500: boom" {
			t.Fatalf("err %v", err)
		}
	})
}

func set(ctx context.Context, c *sskv.Client) (any, error) {
	return c.Set(ctx, "k", []byte("v"), sskv.SetOptions{})
}

func get(ctx context.Context, c *sskv.Client) (any, error) { return c.Get(ctx, "k") }

func del(ctx context.Context, c *sskv.Client) (any, error) { return c.Del(ctx, "k", sskv.DelOptions{}) }

func vdel(ctx context.Context, c *sskv.Client) (any, error) {
	return c.VDel(ctx, "k", []byte("v"), sskv.DelOptions{})
}

func equalResult(a, b any) bool {
	switch x := a.(type) {
	case sskv.GetResult:
		y, ok := b.(sskv.GetResult)
		return ok && x.Found == y.Found && x.Version == y.Version && bytes.Equal(x.Value, y.Value)
	}
	return a == b
}

func mustTS(s string) hlc.Timestamp {
	ts, err := hlc.Parse(s)
	if err != nil {
		panic(err)
	}
	return ts
}

// TestContextEnds: a request ends with its context, and the response that
// comes later is dropped quietly.
func TestContextEnds(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	logs := &loudLogs{}
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.Logger = slog.New(logs) })
	f := startFake(t, srv)
	f.attach(c)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Get(ctx, "k"); done <- err }()
	late := f.next()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	f.respond(late, "$1\r\nx\r\n", "__stat", "200") // nobody waits for it

	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	go func() { _, err := c.Get(dctx, "k"); done <- err }()
	f.next() // never answered
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want context.DeadlineExceeded", err)
	}

	// The client still works, and the late response did not reach this one.
	go func() {
		g, err := c.Get(testCtx(t), "k")
		if err == nil && string(g.Value) != "fresh" {
			err = errors.New("got value " + strconv.Quote(string(g.Value)))
		}
		done <- err
	}()
	f.respond(f.next(), "$5\r\nfresh\r\n", "__stat", "200", "__ts", "000001700000000:00001:statestore")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := logs.n.Load(); n != 0 {
		t.Fatalf("%d log records above Debug for a late response", n)
	}
}

func TestCloseWithRequestsInFlight(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	f := startFake(t, srv)
	f.attach(c)

	const n = 10
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { _, err := c.Get(context.Background(), "k"); errs <- err }()
	}
	for i := 0; i < n; i++ {
		f.next() // all sent, none answered
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; !errors.Is(err, sskv.ErrClosed) {
			t.Fatalf("in-flight request: %v, want ErrClosed", err)
		}
	}
	if _, err := c.Get(testCtx(t), "k"); !errors.Is(err, sskv.ErrClosed) {
		t.Fatalf("request after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

// TestInFlightAcrossReconnect: a request whose connection drops after the
// service got it is answered after the reconnect, from the session.
func TestInFlightAcrossReconnect(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	f := startFake(t, srv)
	f.attach(c)

	done := make(chan error, 1)
	go func() {
		g, err := c.Get(testCtx(t), "k")
		if err == nil && string(g.Value) != "after" {
			err = errors.New("wrong value " + string(g.Value))
		}
		done <- err
	}()
	req := f.next()
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	f.respond(req, "$5\r\nafter\r\n", "__stat", "200", "__ts", "000001700000000:00001:statestore")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRequestsAcrossDrops: requests made around connection drops all
// complete, and none is lost.
func TestRequestsAcrossDrops(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	for i := 0; i < 5; i++ {
		_ = srv.Drop(c.ID())
		if _, err := c.Set(ctx, "k", []byte(strconv.Itoa(i)), sskv.SetOptions{}); err != nil {
			t.Fatalf("Set %d: %v", i, err)
		}
		g, err := c.Get(ctx, "k")
		if err != nil || string(g.Value) != strconv.Itoa(i) {
			t.Fatalf("Get %d: %+v, %v", i, g, err)
		}
	}
}

func TestPipelined(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := "k" + strconv.Itoa(i)
			if _, err := c.Set(ctx, k, []byte(k), sskv.SetOptions{}); err != nil {
				errs <- err
				return
			}
			g, err := c.Get(ctx, k)
			if err == nil && string(g.Value) != k {
				err = errors.New(k + ": got " + string(g.Value))
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
