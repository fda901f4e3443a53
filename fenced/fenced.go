package fenced

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// Errors of package fenced.
var (
	// ErrStale is wrapped by the error of a write that a newer fencing
	// token made impossible: the store refused it because a newer token
	// protects the key, or the Writer did not send it because its source no
	// longer holds its lock (or, for Edit, holds it under another token
	// than the one the read was made under). Either way the write's token
	// is not the current holder's.
	ErrStale = errors.New("fenced: stale fencing token")

	// ErrNoToken is wrapped by the error of a write the Writer did not
	// send because its source gave a zero token without an error: a write
	// without a token would not be fenced at all.
	ErrNoToken = errors.New("fenced: the token source gave no token")

	// ErrConflict is wrapped by the error of an Edit whose key was created
	// between its read, which found no key, and its write: the write was
	// not applied.
	ErrConflict = errors.New("fenced: the key changed between Edit's read and its write")
)

// TokenSource has the fencing token of a holding: a *lock.Lock, or a leader
// term. A Writer calls FencingToken before every write, and Fenced when the
// store refused a write because a newer token protects the key.
type TokenSource interface {
	// FencingToken returns the token to write with, or an error if the
	// source no longer holds its lock.
	FencingToken() (hlc.Timestamp, error)
	// Fenced tells the source that a write with token was refused because
	// a newer token protects a key: the holding of that token is over (a
	// later holding of the same source is not).
	Fenced(token hlc.Timestamp, err error)
}

// ConnSource is a TokenSource that also gives the connection its holding
// last saw its key on (a *lock.Lock, a leader term): FencingConn confirms
// the key first after a reconnect. A Writer on the same client sends the
// writes of such a source through that connection, so that none of them
// crosses an outage the holding has not checked: after a store restart
// that lost the lock's key, say, the holding ends before any of its fenced
// writes goes out.
type ConnSource interface {
	TokenSource
	FencingConn(ctx context.Context) (hlc.Timestamp, *sskv.Conn, error)
}

// Writer writes keys through an sskv client, fenced with the token of its
// source. It is safe for concurrent use.
type Writer struct {
	c       *sskv.Client
	src     TokenSource
	persist bool
}

// An Option changes what a Writer does (see New).
type Option func(*Writer)

// Persist makes every SET the Writer sends (Set's, and Edit's write back)
// ask the store to persist the key (sskv.SetOptions.Persist). A store
// with dynamic persistence takes a key off disk at a SET without it, so
// keys that must survive a broker restart are written by a Writer with
// Persist.
func Persist() Option { return func(w *Writer) { w.persist = true } }

// New returns a Writer that writes through c with src's token. If src is a
// ConnSource, every write waits for src to have confirmed its key after a
// reconnect, and goes through the connection src gives when it is one of c's
// (as when the Writer uses its lock's client).
func New(c *sskv.Client, src TokenSource, opts ...Option) *Writer {
	w := &Writer{c: c, src: src}
	for _, o := range opts {
		o(w)
	}
	return w
}

// store is what a write is sent through: the client, or one connection of
// it.
type store interface {
	Get(ctx context.Context, key string) (sskv.GetResult, error)
	Set(ctx context.Context, key string, value []byte, opts sskv.SetOptions) (sskv.SetResult, error)
	Del(ctx context.Context, key string, opts sskv.DelOptions) (sskv.DelResult, error)
	VDel(ctx context.Context, key string, value []byte, opts sskv.DelOptions) (sskv.DelResult, error)
}

// token returns the source's token and what to send the write through, or
// an error wrapping ErrStale (or ErrNoToken).
func (w *Writer) token(ctx context.Context, op, key string) (hlc.Timestamp, store, error) {
	switch {
	case w == nil || w.c == nil:
		return hlc.Timestamp{}, nil, fmt.Errorf("fenced: %s %q: nil Writer or sskv.Client", op, key)
	case isNil(w.src):
		return hlc.Timestamp{}, nil, fmt.Errorf("fenced: %s %q: nil token source: %w", op, key, ErrNoToken)
	}
	var (
		t   hlc.Timestamp
		via store = w.c
		err error
	)
	if cs, ok := w.src.(ConnSource); ok {
		var cn *sskv.Conn
		if t, cn, err = cs.FencingConn(ctx); err == nil {
			if cn.Client() == w.c {
				via = cn
			}
		} else if _, serr := w.src.FencingToken(); serr == nil {
			// Not the end of the holding: the confirmation could not be
			// made (ctx ended, the store did not answer).
			return hlc.Timestamp{}, nil, fmt.Errorf("fenced: %s %q: %w", op, key, err)
		}
	} else {
		t, err = w.src.FencingToken()
	}
	if err != nil {
		return hlc.Timestamp{}, nil, &staleError{op: op, key: key, cause: err}
	}
	if t.IsZero() {
		return hlc.Timestamp{}, nil, fmt.Errorf("fenced: %s %q: %w", op, key, ErrNoToken)
	}
	return t, via, nil
}

// refused wraps err for op on key, and tells the source when the store
// refused the write of token t for an older token.
func (w *Writer) refused(op, key string, t hlc.Timestamp, err error) error {
	if errors.Is(err, sskv.ErrFencingTokenLower) {
		w.src.Fenced(t, err)
		return &staleError{op: op, key: key, cause: err}
	}
	return fmt.Errorf("fenced: %s %q: %w", op, key, err)
}

// Set sets key as sskv.Client.Set does, with opts.FencingToken replaced by
// the source's token.
func (w *Writer) Set(ctx context.Context, key string, value []byte, opts sskv.SetOptions) (sskv.SetResult, error) {
	t, via, err := w.token(ctx, "set", key)
	if err != nil {
		return sskv.SetResult{}, err
	}
	return w.set(ctx, via, "set", key, value, opts, t)
}

func (w *Writer) set(ctx context.Context, via store, op, key string, value []byte, opts sskv.SetOptions, t hlc.Timestamp) (sskv.SetResult, error) {
	opts.FencingToken = t
	opts.Persist = opts.Persist || w.persist
	res, err := via.Set(ctx, key, value, opts)
	if err != nil {
		return res, w.refused(op, key, t, err)
	}
	return res, nil
}

// Del deletes key, fenced with the source's token.
func (w *Writer) Del(ctx context.Context, key string) (sskv.DelResult, error) {
	t, via, err := w.token(ctx, "del", key)
	if err != nil {
		return sskv.DelResult{}, err
	}
	res, err := via.Del(ctx, key, sskv.DelOptions{FencingToken: t})
	if err != nil {
		return res, w.refused("del", key, t, err)
	}
	return res, nil
}

// VDel deletes key if it holds value, fenced with the source's token.
func (w *Writer) VDel(ctx context.Context, key string, value []byte) (sskv.DelResult, error) {
	t, via, err := w.token(ctx, "vdel", key)
	if err != nil {
		return sskv.DelResult{}, err
	}
	res, err := via.VDel(ctx, key, value, sskv.DelOptions{FencingToken: t})
	if err != nil {
		return res, w.refused("vdel", key, t, err)
	}
	return res, nil
}

// Edit reads key, calls change with its value (nil and found false when it
// does not exist) and writes back what change returns, fenced with the
// token the read was made under, through the same connection. If change
// returns an error, nothing is written and Edit returns that error.
//
// If a newer holder writes the key between the read and the write back,
// the write back is refused with ErrStale; if the source's holding ends
// meanwhile (even if the source then holds its lock again, under a newer
// token), the write back is not sent, with ErrStale. If the read found no
// key, the write back creates it only if it is still missing (NX), and
// fails with ErrConflict otherwise. What fencing cannot protect: the store
// keeps a key's token only as long as the key, so if a newer holder
// deletes the key between the read and the write back, the write back
// creates it again. A holder that must not lose a newer holder's deletion
// marks the key deleted (a tombstone value written through the Writer)
// instead of deleting it. Concurrent Edits of the same holder are not
// ordered.
func (w *Writer) Edit(ctx context.Context, key string, change func(value []byte, found bool) ([]byte, error)) (sskv.SetResult, error) {
	if change == nil {
		return sskv.SetResult{}, fmt.Errorf("fenced: edit %q: nil change function", key)
	}
	t, via, err := w.token(ctx, "edit", key)
	if err != nil {
		return sskv.SetResult{}, err
	}
	cur, err := via.Get(ctx, key)
	if err != nil {
		return sskv.SetResult{}, fmt.Errorf("fenced: edit %q: %w", key, err)
	}
	next, err := change(cur.Value, cur.Found)
	if err != nil {
		return sskv.SetResult{}, err
	}
	now, err := w.src.FencingToken()
	if err == nil && now != t {
		err = fmt.Errorf("the read was made under token %v, and the source holds %v now", t, now)
	}
	if err != nil {
		return sskv.SetResult{}, &staleError{op: "edit", key: key, cause: err}
	}
	var opts sskv.SetOptions
	if !cur.Found {
		opts.Condition = sskv.IfNotExists
	}
	res, err := w.set(ctx, via, "edit", key, next, opts, t)
	if err == nil && !res.Applied {
		return res, fmt.Errorf("fenced: edit %q: %w (created at version %v)", key, ErrConflict, res.Version)
	}
	return res, err
}

// staleError is a write made impossible by a newer token: it wraps ErrStale
// and the cause (the source's error, or the store's refusal).
type staleError struct {
	op, key string
	cause   error
}

func (e *staleError) Error() string {
	return fmt.Sprintf("fenced: %s %q: stale fencing token: %v", e.op, e.key, e.cause)
}

func (e *staleError) Unwrap() []error { return []error{ErrStale, e.cause} }

// isNil reports whether src is nil, or a nil pointer (a *lock.Lock or
// *leader.Term never set), whose methods would panic.
func isNil(src TokenSource) bool {
	if src == nil {
		return true
	}
	v := reflect.ValueOf(src)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
