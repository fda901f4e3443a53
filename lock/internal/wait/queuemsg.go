package wait

import (
	"bytes"
	"encoding/binary"
	"slices"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
)

// The wait queue's keys and messages. docs/design/queue.md specifies the
// protocol: the holder keeps the queue in memory; each Lock that waits,
// holds or has just held the lock watches its own inbox key, and the others
// tell it things with a SET of that key. A waiter joins by writing its
// acquisition record into the holder's inbox; the holder confirms it
// (msgAck) or tells it to watch the lock's key (msgHead: two waiters
// watch, keyWatchers); a release hands the lock and the rest of the queue
// to the first waiter (msgTurn). A handover so costs a fixed number of
// requests however many wait. The queue is advice: mutual exclusion rests
// on the store alone (queue.md 6a).

const (
	// queueSuffix is appended to a lock's name to make its roll-call key.
	queueSuffix = "\x00queue"
	// InboxInfix is put between a lock's name and a HolderID to make that
	// Lock's inbox key.
	InboxInfix = "\x00inbox\x00"
)

// Inbox messages: a kind byte, then its payload.
const (
	msgJoin    = '+' // record: queue the sender, and confirm it
	msgRejoin  = '*' // record: queue the sender; it needs no confirmation
	msgLeave   = '-' // record: the sender gave up
	msgRelay   = '_' // version '\n' record: a leave (of that version) relayed by a Lock that handed the queue on
	msgHead    = 'H' // '1' or '2', then ids: watch the key (see toldFirst, toldSecond); the waiters ahead of you
	msgAck     = 'K' // your join is queued
	msgTurn    = 'Q' // reservation ',' releaser '\n' entries: the lock is released to you; the rest of the queue
	msgForward = 'A' // entries: queue these after the ones you have
	msgRoll    = 'E' // entries: the queue as its holder knows it (the roll-call key)
	msgExpired = 'X' // version '\n' ids: the key expired then, and you are the first waiter; if you do not wait, tell the first of ids
	msgLeft    = 'L' // id: a waiter you were told was ahead of you left the queue
)

// Entry states, as entries are encoded.
const (
	toldNothing = 0   // the waiter awaits a confirmation
	toldAck     = 'k' // confirmed
	toldFirst   = '1' // told to watch the key, as the first waiter (or it became the first): takes an expired key at once
	toldSecond  = '2' // told to watch the key behind others: tells the first of them an expiry, takes the key after coverGrace
)

// appendIDs appends ids to b, one a line (a HolderID has no newline).
func appendIDs(b []byte, ids []string) []byte {
	for i, id := range ids {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, id...)
	}
	return b
}

// parseIDs decodes appendIDs.
func parseIDs(b []byte) []string {
	var ids []string
	for f := range bytes.SplitSeq(b, []byte{'\n'}) {
		if len(f) > 0 {
			ids = append(ids, string(f))
		}
	}
	return ids
}

// expiredBody encodes a msgExpired: the version of the key's deletion (the
// store's time of it), and the waiters after the one it goes to.
func expiredBody(v hlc.Timestamp, ids []string) []byte {
	msg, _ := v.AppendText([]byte{msgExpired})
	msg = append(msg, '\n')
	return appendIDs(msg, ids)
}

// parseExpired decodes expiredBody's body (after the kind byte).
func parseExpired(body []byte) (hlc.Timestamp, []string, bool) {
	a, b, ok := bytes.Cut(body, []byte{'\n'})
	if !ok {
		return hlc.Timestamp{}, nil, false
	}
	v, err := hlc.ParseBytes(a)
	if err != nil || v.IsZero() {
		return hlc.Timestamp{}, nil, false
	}
	return v, parseIDs(b), true
}

// keyWatchers is how many waiters of a queue watch the lock's key.
const keyWatchers = 2

// watches reports whether a waiter told told watches the lock's key.
func watches(told byte) bool { return told == toldFirst || told == toldSecond }

// entry is one waiter in a queue.
type entry struct {
	id   string
	rec  []byte
	told byte
	// ver is the version of the join that queued it here (zero if it came
	// in a turn or a forward): an older leave does not strike it. Not
	// encoded.
	ver hlc.Timestamp
}

func appendEntries(b []byte, es []entry) []byte {
	for _, e := range es {
		b = binary.AppendUvarint(b, uint64(len(e.rec)))
		b = append(b, e.rec...)
		b = append(b, e.told)
	}
	return b
}

// parseEntries decodes appendEntries; ok is false if b is malformed.
func parseEntries(b []byte) (es []entry, ok bool) {
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || n >= uint64(len(b)-k) {
			return nil, false
		}
		rec := bytes.Clone(b[k : k+int(n)])
		told := b[k+int(n)]
		b = b[k+int(n)+1:]
		es = append(es, entry{id: lease.ParseHolder(rec, hlc.Timestamp{}).ID, rec: rec, told: told})
	}
	return es, true
}

// relayBody encodes a msgRelay: the leave's version, and its record.
func relayBody(v hlc.Timestamp, rec []byte) []byte {
	msg, _ := v.AppendText([]byte{msgRelay})
	msg = append(msg, '\n')
	return append(msg, rec...)
}

// parseRelay decodes relayBody's body (after the kind byte).
func parseRelay(body []byte) (hlc.Timestamp, []byte, bool) {
	a, rec, ok := bytes.Cut(body, []byte{'\n'})
	if !ok {
		return hlc.Timestamp{}, nil, false
	}
	v, err := hlc.ParseBytes(a)
	if err != nil || v.IsZero() {
		return hlc.Timestamp{}, nil, false
	}
	return v, rec, true
}

// mergeEntries is first, then the entries of then not in it, without self
// (a place it kept from an earlier join).
func mergeEntries(self string, first, then []entry) []entry {
	out := make([]entry, 0, len(first)+len(then))
	for _, e := range slices.Concat(first, then) {
		if e.id != self && !slices.ContainsFunc(out, func(x entry) bool { return x.id == e.id }) {
			out = append(out, e)
		}
	}
	return out
}

// parseTurn decodes a turn's body: the reservation's version (zero
// without one), the token of the holding that released, and the queue.
func parseTurn(body []byte) (token, rel hlc.Timestamp, es []entry, ok bool) {
	toks, rest, ok := bytes.Cut(body, []byte{'\n'})
	if !ok {
		return token, rel, nil, false
	}
	if es, ok = parseEntries(rest); !ok {
		return token, rel, nil, false
	}
	a, b, _ := bytes.Cut(toks, []byte{','})
	for _, t := range []struct {
		s   []byte
		out *hlc.Timestamp
	}{{a, &token}, {b, &rel}} {
		if len(t.s) == 0 {
			continue
		}
		v, err := hlc.ParseBytes(t.s)
		if err != nil {
			return token, rel, nil, false
		}
		*t.out = v
	}
	return token, rel, es, true
}

// turnBody encodes what parseTurn decodes.
func turnBody(token, rel hlc.Timestamp, es []entry) []byte {
	msg := []byte{msgTurn}
	if !token.IsZero() {
		msg, _ = token.AppendText(msg)
	}
	msg = append(msg, ',')
	if !rel.IsZero() {
		msg, _ = rel.AppendText(msg)
	}
	msg = append(msg, '\n')
	return appendEntries(msg, es)
}
