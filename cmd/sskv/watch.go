package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Exit statuses.
func watch(ctx context.Context, c *sskv.Client, keys []string, stdout, stderr io.Writer) int {
	// The watches get a context of their own, so that on ctx's end they are
	// stopped with Stop, which unregisters them before the client closes.
	// ctx still interrupts their registration.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	interrupt := context.AfterFunc(ctx, cancel)
	ws := make([]*sskv.Watcher, 0, len(keys))
	for _, k := range keys {
		w, err := c.Watch(wctx, k)
		if err != nil {
			if ctx.Err() != nil {
				return exitOK // interrupted while starting
			}
			return fail(stderr, err) // it names the key
		}
		ws = append(ws, w)
	}
	if !interrupt() {
		return exitOK // interrupted while starting
	}
	shown := make([]string, len(keys))
	for i, k := range keys {
		shown[i] = showValue([]byte(k), true)
	}
	fmt.Fprintf(stderr, "watching %s (Ctrl-C to stop)\n", strings.Join(shown, " "))

	var (
		mu       sync.Mutex // serializes output and guards firstErr
		firstErr error
		failed   = make(chan struct{})
		wg       sync.WaitGroup
	)
	setErr := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
			close(failed)
		}
	}
	for _, w := range ws {
		wg.Go(func() {
			for ev := range w.Events() {
				if ev.Initial {
					continue // the key's state as the watch started: watch prints changes
				}
				mu.Lock()
				var err error
				if firstErr == nil {
					_, err = io.WriteString(stdout, eventLine(time.Now(), ev))
				}
				mu.Unlock()
				if err != nil {
					setErr(err)
				}
			}
			if err := w.Err(); err != nil {
				setErr(fmt.Errorf("watch %q ended: %s", w.Key(), strings.TrimPrefix(err.Error(), "sskv: ")))
			}
		})
	}
	ended := make(chan struct{})
	go func() {
		wg.Wait()
		close(ended)
	}()
	select {
	case <-ctx.Done():
	case <-failed:
	case <-ended:
	}
	for _, w := range ws {
		w.Stop()
	}
	<-ended
	mu.Lock()
	defer mu.Unlock()
	if firstErr != nil {
		return fail(stderr, firstErr)
	}
	return exitOK
}

func eventLine(t time.Time, ev sskv.Event) string {
	var b strings.Builder
	b.WriteString(t.Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteByte(' ')
	b.WriteString(showValue([]byte(ev.Key), true))
	b.WriteByte(' ')
	b.WriteString(ev.Op.String())
	b.WriteByte(' ')
	if ev.Op == sskv.OpSet {
		if rec, ok := lockRecord(ev.Value); ok {
			b.WriteString(rec)
		} else {
			b.WriteString(showValue(ev.Value, true))
		}
	} else {
		b.WriteByte('-')
	}
	b.WriteByte(' ')
	if ev.Version.IsZero() {
		b.WriteByte('-')
	} else {
		b.WriteString(ev.Version.String())
	}
	if ev.Resync {
		b.WriteString(" (resync)")
	}
	b.WriteByte('\n')
	return b.String()
}

// lockRecord renders v, when it is the record of a lock with
// lock.Config.FenceKey (every election's key holds one), as one field:
//
//	[holder=ID,token=T,value=V]    held: T is the holder's fencing token
//	[holder=ID,acquiring,value=V]  ID is taking the key; its token comes next
//
// ID and V are quoted, Go-style, unless they are printable and hold no
// space, comma, bracket or quote. It reports false for any other value.
func lockRecord(v []byte) (string, bool) {
	id, rest, ok := bytes.Cut(v, []byte{'\n'})
	if !ok || len(id) == 0 {
		return "", false
	}
	tok, val, ok := bytes.Cut(rest, []byte{'\n'})
	if !ok {
		return "", false
	}
	var state string
	if h := lock.ParseHolder(v, hlc.Timestamp{}); !h.Token.IsZero() {
		state = "token=" + h.Token.String()
	} else if nonce, ok := bytes.CutPrefix(tok, []byte{'~'}); ok && len(nonce) > 0 && isHex(nonce) {
		state = "acquiring" // the record of an acquisition under way, or of a reservation for ID
	} else {
		return "", false
	}
	return "[holder=" + recordPart(id) + "," + state + ",value=" + recordPart(val) + "]", true
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// recordPart shows a part of a decoded lock record: as is when it cannot be
// mistaken for the record's punctuation, quoted otherwise.
func recordPart(b []byte) string {
	s := string(b)
	if s == "" || !utf8.ValidString(s) || strings.ContainsAny(s, `,[]"`) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// showValue returns v as is when it is printable UTF-8, and quoted Go-style
// otherwise. Empty values, and values that start with '"', are quoted too,
// so that what is printed is never ambiguous; inLine also quotes values
// with a space, for one-line records, and values that start with '[', which
// there marks a decoded lock record (see lockRecord).
func showValue(v []byte, inLine bool) string {
	s := string(v)
	if s == "" || s[0] == '"' || inLine && s[0] == '[' || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || (inLine && unicode.IsSpace(r)) {
			return strconv.Quote(s)
		}
	}
	return s
}
