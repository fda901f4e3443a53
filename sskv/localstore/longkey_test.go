package localstore_test

import (
	"strings"
	"testing"

	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A KEYNOTIFY of a key too long to be notified of (its notification topic
// would pass MQTT's 65,535 bytes) is refused as a key size quota. Before,
// the store accepted it and then sent a malformed notification on the
// next change, which the client dropped the connection for, over and over
// as its resumed session got it again. The longest key that fits is
// watched, and its notifications arrive.
func TestKeyNotifyOfKeyTooLongToNotify(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	max := wire.MaxNotifyKey(c.id)
	long, longest := strings.Repeat("k", max+1), strings.Repeat("k", max)

	mustPayload(t, c.do(cmd("KEYNOTIFY", long)), errPayload(wire.MsgQuotaExceeded))
	mustPayload(t, c.do(cmd("SET", long, "v")), okResp)
	c.noMessage()

	mustPayload(t, c.do(cmd("KEYNOTIFY", longest)), okResp)
	mustPayload(t, c.do(cmd("SET", longest, "v")), okResp)
	if p := c.next(); p.Topic != wire.NotifyTopic(c.id, []byte(longest)) || len(p.Topic) != wire.MaxTopic-1 && len(p.Topic) != wire.MaxTopic {
		t.Fatalf("notification on a topic of %d bytes; want the longest key's, at most %d", len(p.Topic), wire.MaxTopic)
	}
	mustPayload(t, c.do(cmd("GET", "other")), nullResp)
}
