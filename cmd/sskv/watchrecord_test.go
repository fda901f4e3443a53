package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// watch of an election's key shows its records decoded (who holds it, with
// what token and value), not the raw "ID\n~hex\nvalue" of the store.
func TestWatchDecodesElection(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := newSyncBuffer(), newSyncBuffer()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"-addr", srv.Addr(), "watch", "svc/leader"}, nil, stdout, stderr) }()
	t.Cleanup(func() { cancel(); <-done })
	stderr.WaitFor(t, regexp.MustCompile(`watching svc/leader`))

	c := dialStore(t, srv.Addr())
	term, err := leader.Campaign(context.Background(), c, "svc/leader", []byte("10.0.0.5:8080"), leader.WithCandidateID("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	q := regexp.QuoteMeta
	line := func(rec string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + timePattern + ` svc/leader SET ` + q(rec) + ` \d{15}:\d{5}:statestore\n`)
	}
	stdout.WaitFor(t, line("[holder=node-a,acquiring,value=10.0.0.5:8080]"))
	stdout.WaitFor(t, line("[holder=node-a,token="+term.Token().String()+",value=10.0.0.5:8080]"))
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	stdout.WaitFor(t, regexp.MustCompile(`(?m)^`+timePattern+` svc/leader DELETE - `))
	if regexp.MustCompile(`~[0-9a-f]|\\n`).MatchString(stdout.String()) {
		t.Errorf("raw records in the watch:\n%s", stdout.String())
	}
}

func TestLockRecordLine(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	v := hlc.Timestamp{Wall: 1735787045006, Counter: 2, Node: "statestore"}
	tok := "001735787045000:00001:statestore"
	for _, tc := range []struct{ value, want string }{
		{"me\n" + tok + "\n10.0.0.5:8080", "[holder=me,token=" + tok + ",value=10.0.0.5:8080]"},
		{"me\n~0123456789abcdef\nv", "[holder=me,acquiring,value=v]"},
		// Parts that could be taken for the record's punctuation are quoted.
		{"a b\n~00\nx,y", `[holder="a b",acquiring,value="x,y"]`},
		{"me\n" + tok + "\n", `[holder=me,token=` + tok + `,value=""]`},
		{"me\n~00\n[v]", `[holder=me,acquiring,value="[v]"]`},
		// Not a lock record: shown as any value, and a value that starts
		// with '[' is quoted, so that it cannot pass for one.
		{"me\nnot-a-token\nv", `"me\nnot-a-token\nv"`},
		{"me\n~xyz\nv", `"me\n~xyz\nv"`},
		{"\n~00\nv", `"\n~00\nv"`},
		{"me", "me"},
		{"[holder=me,acquiring,value=v]", `"[holder=me,acquiring,value=v]"`},
	} {
		ev := sskv.Event{Key: "k", Op: sskv.OpSet, Value: []byte(tc.value), Version: v}
		want := "2025-01-02T03:04:05.006Z k SET " + tc.want + " 001735787045006:00002:statestore\n"
		if got := eventLine(at, ev); got != want {
			t.Errorf("value %q: got %q, want %q", tc.value, got, want)
		}
	}
}

// FuzzLockRecord: any value a watch receives is printed on one line; a lock
// record, decoded, reads back as the record's parts, and any other value
// is printed as before and cannot pass for a decoded record.
func FuzzLockRecord(f *testing.F) {
	f.Add([]byte("me\n001735787045000:00001:statestore\n10.0.0.5:8080"))
	f.Add([]byte("me\n~0123456789abcdef\nv"))
	f.Add([]byte("[holder=x,acquiring,value=y]"))
	f.Add([]byte("a b\n~00\n\xff,]"))
	f.Fuzz(func(t *testing.T, v []byte) {
		line := eventLine(time.Time{}, sskv.Event{Key: "k", Op: sskv.OpSet, Value: v})
		if strings.Count(line, "\n") != 1 || !strings.HasSuffix(line, " -\n") {
			t.Fatalf("value %q: line %q", v, line)
		}
		field := strings.TrimSuffix(strings.TrimPrefix(line, "0001-01-01T00:00:00.000Z k SET "), " -\n")
		rec, ok := lockRecord(v)
		if !ok {
			if field != showValue(v, true) || strings.HasPrefix(field, "[") {
				t.Fatalf("value %q printed as %q", v, field)
			}
			return
		}
		if field != rec {
			t.Fatalf("value %q printed as %q, not as its record %q", v, field, rec)
		}
		// The parts read back.
		id, state, val := readRecord(t, field)
		h := lock.ParseHolder(v, hlc.Timestamp{})
		wantState := "acquiring"
		if !h.Token.IsZero() {
			wantState = "token=" + h.Token.String()
		}
		if id != h.ID || val != string(h.Value) || state != wantState {
			t.Fatalf("value %q printed as %q: reads back as %q %q %q", v, field, id, state, val)
		}
	})
}

// readRecord reads a decoded record back, as a script would: each part is
// plain, or quoted Go-style.
func readRecord(t *testing.T, s string) (id, state, val string) {
	t.Helper()
	part := func(s string) (string, string) {
		if q, err := strconv.QuotedPrefix(s); err == nil {
			u, _ := strconv.Unquote(q)
			return u, s[len(q):]
		}
		i := strings.IndexAny(s, ",]")
		if i < 0 {
			t.Fatalf("record part %q does not end", s)
		}
		return s[:i], s[i:]
	}
	rest, ok := strings.CutPrefix(s, "[holder=")
	if !ok {
		t.Fatalf("record %q", s)
	}
	id, rest = part(rest)
	state, rest, ok = strings.Cut(strings.TrimPrefix(rest, ","), ",value=")
	if !ok {
		t.Fatalf("record %q", s)
	}
	val, rest = part(rest)
	if rest != "]" {
		t.Fatalf("record %q ends with %q", s, rest)
	}
	return id, state, val
}
