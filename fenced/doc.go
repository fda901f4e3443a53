// Package fenced writes keys of the Azure IoT Operations state store with a
// fencing token, so that a holder that lost its lock (or leadership) cannot
// overwrite what a newer holder wrote.
//
//	w := fenced.New(client, l)                    // l: a *lock.Lock, or a leader term
//	_, err := w.Set(ctx, "orders/state", data, sskv.SetOptions{})
//	if errors.Is(err, fenced.ErrStale) {
//		// someone newer holds the lock: stop, l is lost already
//	}
//
// # What fencing guarantees
//
// Every write of a [Writer] carries its source's fencing token as __ft. The
// state store keeps, with each key, the newest token that wrote it, and
// refuses a write whose token is older: once a newer holder has written a
// key with its token, no write of an older holder lands on that key, however
// late it arrives (a paused process, a request stuck in the network). The
// refusal comes back as an error wrapping [ErrStale], and the Writer tells
// its source, which then ends its holding as lost.
//
// A Writer also asks its source for the token before every write, and does
// not send the write at all if the source knows it is no longer held (lost
// or released): that error wraps ErrStale and the source's reason.
//
// # What it does not guarantee
//
//   - Fencing protects keys in the state store, written through a Writer.
//     It does nothing for side effects elsewhere (a file, a device, another
//     database, a message): those need their own fencing, for example by
//     passing the token along and comparing it there.
//   - A key is protected from the first fenced write on. A stale holder's
//     write to a key the new holder has not written yet is accepted (its
//     token is at least the key's); it is overwritten by the new holder's
//     first write, and from then on refused.
//   - Reads are not fenced: a Get through a Writer may return a value that a
//     newer holder replaces right after. Use Edit for read-modify-write.
//   - A key written with a token needs a token, at least as new, for every
//     later SET, DEL and VDEL, until it is deleted or expires.
package fenced
