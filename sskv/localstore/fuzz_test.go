package localstore

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
)

// FuzzServe feeds arbitrary payloads and timestamps through the store's
// request path. Whatever comes in, the store answers with a well-formed reply
// and keeps its invariants: no panic, every stored version was issued by its
// clock, and a key's fencing token only moves forward.
func FuzzServe(f *testing.F) {
	now := hlc.Timestamp{Wall: 1_700_000_000_000, Node: "fuzz"}.String()
	seeds := []struct {
		payload []byte
		ts, ft  string
	}{
		{resp.AppendCommand(nil, []byte("SET"), []byte("k"), []byte("v")), now, ""},
		{resp.AppendCommand(nil, []byte("SET"), []byte("k"), []byte("v"), []byte("NEX"), []byte("PX"), []byte("10")), now, now},
		{resp.AppendCommand(nil, []byte("SET"), []byte("k"), []byte("v"), []byte("NX")), now, "1:0:a"},
		{resp.AppendCommand(nil, []byte("GET"), []byte("k")), "", ""},
		{resp.AppendCommand(nil, []byte("DEL"), []byte("k")), "", now},
		{resp.AppendCommand(nil, []byte("VDEL"), []byte("k"), []byte("v")), now, ""},
		{resp.AppendCommand(nil, []byte("KEYNOTIFY"), []byte("k")), "", ""},
		{resp.AppendCommand(nil, []byte("KEYNOTIFY"), []byte("k"), []byte("STOP")), "", ""},
		{[]byte("*1\r\n$3\r\nSET\r\n"), "x", "y"},
		{[]byte("garbage"), "", ""},
	}
	for _, s := range seeds {
		f.Add(s.payload, s.ts, s.ft)
	}
	srv, err := Start(Config{MaxKeys: 8, MaxValueSize: 64})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Close() })

	f.Fuzz(func(t *testing.T, payload []byte, ts, ft string) {
		var props []packets.UserProperty
		if ts != "" {
			props = append(props, packets.UserProperty{Key: "__ts", Val: ts})
		}
		if ft != "" {
			props = append(props, packets.UserProperty{Key: "__ft", Val: ft})
		}
		var key []byte
		if args, err := resp.ParseCommand(payload, nil); err == nil && len(args) > 1 {
			key = args[1]
		}
		// The same entry's token never moves back; a key that expired and was
		// set again is a new entry, whose token may be older.
		srv.mu.Lock()
		before := srv.tab.find(key)
		removals := srv.tab.removals
		var fenceBefore hlc.Timestamp
		if before >= 0 {
			fenceBefore = srv.tab.fence(before)
		}
		srv.mu.Unlock()

		res, _ := srv.serve(clientRef{id: "fuzz"}, "", payload, props, time.Time{}, repeatable{})

		r, err := resp.ParseReply(res.payload)
		if err != nil {
			t.Fatalf("reply %q does not parse: %v", res.payload, err)
		}
		if r.Kind == resp.KindError && !res.version.IsZero() {
			t.Fatalf("error reply %q with a version", res.payload)
		}
		if !res.version.IsZero() && res.version.Node != "statestore" {
			t.Fatalf("version %v not issued by the store", res.version)
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		// A slot freed by a removal may be reused by a new key.
		if i := srv.tab.find(key); i >= 0 && i == before && srv.tab.removals == removals && srv.tab.fence(i).Compare(fenceBefore) < 0 {
			t.Fatalf("fencing token went back from %v to %v", fenceBefore, srv.tab.fence(i))
		}
		if srv.tab.len() > 8 {
			t.Fatalf("%d keys, above MaxKeys", srv.tab.len())
		}
	})
}

// FuzzDecodeRecord feeds arbitrary bytes to the decoder of the records of
// the data file (a corrupt file must fail the store's start, never crash
// it): no panic, and what decodes encodes back to the same bytes. With
// withSum, the input gets a valid checksum, so that the fuzzer reaches the
// parser behind it.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range []diskRecord{
		{key: []byte("k"), value: []byte("v"), version: hlc.Timestamp{Wall: 1, Counter: 2}},
		{key: []byte("key"), version: hlc.Timestamp{Wall: 5}, deadline: 99,
			fence: hlc.Timestamp{Wall: 3, Counter: 1, Node: "n"}, owner: "alice"},
	} {
		b := encodeRecord(r)
		f.Add(b, false)
		f.Add(b[:len(b)-4], true)
	}
	f.Add([]byte{1}, true)
	f.Fuzz(func(t *testing.T, b []byte, withSum bool) {
		if withSum {
			b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
		}
		r, err := decodeRecord(b)
		if err != nil {
			return
		}
		if again := encodeRecord(r); !bytes.Equal(again, b) {
			// Only a non-canonical varint length can differ.
			if _, err := decodeRecord(again); err != nil {
				t.Fatalf("a decoded record does not decode once encoded again: %v", err)
			}
		}
	})
}
