// Package readme_test keeps the README's Go snippets compiling. Each snippet
// is pasted, word for word, into a function below that declares what it
// uses; TestSnippetsCompiled fails when a snippet in README.md is not found
// here, so a README edit that breaks one fails CI (go vet builds this file).
package readme_test

import (
	"bufio"
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// work stands for the user's guarded work.
func work(ctx context.Context, w *fenced.Writer) error {
	_, err := w.Set(ctx, "orders/state", []byte("done"), sskv.SetOptions{})
	return err
}

// campaign is README's "Leader election".
func campaign(ctx context.Context, c *sskv.Client) error {
	t, err := leader.Campaign(ctx, c, "orders/leader", []byte("10.0.0.5:8080")) // blocks while another leads
	if err != nil {
		return err // ctx ended, or the store refused: nothing is left behind
	}
	w := fenced.New(c, t)              // a term is a token source, as a lock is
	err = work(t.Context(), w)         // cancelled the moment leadership is lost
	_ = t.Resign(context.Background()) // after work has returned: hands over at once
	return err
}

// elector is README's Elector.
func elector(ctx context.Context, c *sskv.Client) error {
	e, err := leader.NewElector(c, "orders/leader", []byte("10.0.0.5:8080"),
		leader.WithTTL(5*time.Second),
		leader.OnNewLeader(func(s leader.State) { log.Println("leader:", s.ID, string(s.Value)) }),
		leader.WithMetrics(leader.Metrics{Leading: func(on bool) { log.Println("leading:", on) }}))
	if err != nil {
		return err
	}
	http.Handle("/healthz", e) // 503 while a lost term's work has not stopped
	err = e.Run(ctx, func(ctx context.Context, t *leader.Term) error {
		return work(ctx, fenced.New(c, t)) // ctx ends when the term does
	})
	return err
}

// lockAndFence is README's "Locks and fenced writes".
func lockAndFence(ctx context.Context, c *sskv.Client, data []byte) error {
	l, err := lock.New(c, lock.Config{Name: "orders/lock", TTL: 10 * time.Second})
	if err != nil {
		return err
	}
	if err := l.Lock(ctx); err != nil { // waits while another instance holds it
		return err
	}
	w := fenced.New(c, l) // every write carries l's fencing token
	_, err = w.Set(l.Context(), "orders/state", data, sskv.SetOptions{})
	if errors.Is(err, fenced.ErrStale) {
		log.Println("a newer holder exists; l is lost already")
	}
	_ = l.Unlock(context.Background()) // only after the work has returned
	return err
}

// client is README's "The client".
func client(ctx context.Context, data []byte) error {
	c, err := sskv.Dial(ctx, sskv.Config{Addr: "127.0.0.1:1883"}) // or sskv.DialEnv(ctx) in a pod
	if err != nil {
		return err
	}
	defer c.Close()

	lease, err := c.Set(ctx, "lock", []byte("me"), sskv.SetOptions{
		Condition: sskv.IfNotExists, Expiry: 10 * time.Second})
	if err != nil {
		return err
	}
	// lease.Applied: it was free; lease.Version: the fencing token
	_, err = c.Set(ctx, "config", data, sskv.SetOptions{FencingToken: lease.Version})
	if errors.Is(err, sskv.ErrFencingTokenLower) {
		log.Println("someone newer holds the lock")
	}

	w, err := c.Watch(ctx, "config") // events survive reconnects; a Resync event reports missed changes
	if err != nil {
		return err
	}
	for ev := range w.Events() { // first the key's state now (ev.Initial), then each change
		log.Println(ev)
	}
	return nil
}

// The snippets that need a store at a fixed address or run forever are only
// compiled.
var _ = []any{elector, client}

// TestREADMEStore runs README's test setup ("The local state store"), then
// the lock and campaign snippets on it: their cleanups must not wait for a
// store that is already gone.
func TestREADMEStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	srv, err := localstore.Start(localstore.Config{}) // 127.0.0.1, a free port
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() }) // registered first, so it runs after the clients' cleanups
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	if err := lockAndFence(ctx, c, []byte("v")); err != nil {
		t.Fatalf("the lock snippet: %v", err)
	}
	if err := campaign(ctx, c); err != nil {
		t.Fatalf("the campaign snippet: %v", err)
	}
	srv, err = srv.Restart(ctx, 500*time.Millisecond) // down for 0.5 s
	if err != nil {
		t.Fatalf("the restart snippet: %v", err)
	}
	if err := lockAndFence(ctx, c, []byte("after the restart")); err != nil {
		t.Fatalf("the lock snippet after a restart: %v", err)
	}
}

// TestSnippetsCompiled checks that every Go snippet in README.md appears in
// this file, line for line, ignoring indentation and runs of spaces.
func TestSnippetsCompiled(t *testing.T) {
	self := normalized(t, "readme_test.go")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := goBlocks(string(readme))
	if len(snippets) < 5 {
		t.Fatalf("found %d Go snippets in README.md; want at least 5", len(snippets))
	}
	for _, sn := range snippets {
		if !strings.Contains(self, normalize(sn)) {
			t.Errorf("README snippet not compiled here; paste it into a function in readme_test.go:\n%s", sn)
		}
	}
}

// elsewhere marks a snippet that another module compiles (it imports what
// this module may not depend on).
const elsewhere = "<!-- compiled in prometheus/readme_test.go -->"

// goBlocks returns the bodies of the ```go blocks of a Markdown text, but
// those marked as compiled elsewhere.
func goBlocks(md string) []string {
	var blocks []string
	var cur []string
	in, skip := false, false
	prev := ""
	sc := bufio.NewScanner(strings.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```go":
			in, cur, skip = true, nil, strings.TrimSpace(prev) == elsewhere
		case in && strings.TrimSpace(line) == "```":
			in = false
			if !skip {
				blocks = append(blocks, strings.Join(cur, "\n"))
			}
		case in:
			cur = append(cur, line)
		}
		prev = line
	}
	return blocks
}

func normalized(t *testing.T, file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return normalize(string(b))
}

// normalize drops indentation and collapses runs of blanks, so that gofmt's
// alignment of comments inside a function matches the README's.
func normalize(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return "\n" + strings.Join(lines, "\n") + "\n"
}
