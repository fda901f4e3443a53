package localstore

import (
	"context"
	"log/slog"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// packetSummaries is the slog.Handler of the broker's logger. mochi logs
// whole packets as attributes (its "error processing packet" warning, among
// others), which a text or JSON handler prints field by field, the payload as
// decimal bytes: a 40 KB value makes a 150 KB line, and stored values reach
// the log. This handler replaces every packets.Packet attribute, whatever its
// key, with a summary: what the packet was and its sizes, never its payload.
type packetSummaries struct{ h slog.Handler }

func (p packetSummaries) Enabled(ctx context.Context, l slog.Level) bool { return p.h.Enabled(ctx, l) }

func (p packetSummaries) Handle(ctx context.Context, r slog.Record) error {
	level := r.Level
	if r.Message == mqtt.ErrMinimumKeepalive.Error() {
		// mochi warns about every keep alive of 5 s or less, which is the
		// sskv default (short, for leases of a few seconds) and fine for a
		// local store: not worth a warning per connection.
		level = slog.LevelDebug
		if !p.h.Enabled(ctx, level) {
			return nil
		}
	}
	out := slog.NewRecord(r.Time, level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(summarize(a))
		return true
	})
	return p.h.Handle(ctx, out)
}

func (p packetSummaries) WithAttrs(as []slog.Attr) slog.Handler {
	sum := make([]slog.Attr, len(as))
	for i, a := range as {
		sum[i] = summarize(a)
	}
	return packetSummaries{p.h.WithAttrs(sum)}
}

func (p packetSummaries) WithGroup(name string) slog.Handler {
	return packetSummaries{p.h.WithGroup(name)}
}

// maxLoggedTopic bounds how much of a topic name a summary quotes.
const maxLoggedTopic = 128

func summarize(a slog.Attr) slog.Attr {
	var pk *packets.Packet
	switch v := a.Value.Any().(type) {
	case packets.Packet:
		pk = &v
	case *packets.Packet:
		pk = v
	default:
		if a.Value.Kind() == slog.KindGroup {
			g := a.Value.Group()
			sum := make([]any, len(g))
			for i, x := range g {
				sum[i] = summarize(x)
			}
			return slog.Group(a.Key, sum...)
		}
		return a
	}
	if pk == nil {
		return a
	}
	attrs := []any{
		"type", packets.PacketNames[pk.FixedHeader.Type],
		"remaining_length", pk.FixedHeader.Remaining,
	}
	if pk.FixedHeader.Type == packets.Publish {
		topic := pk.TopicName
		if len(topic) > maxLoggedTopic {
			topic = topic[:maxLoggedTopic] + "..."
		}
		attrs = append(attrs, "qos", pk.FixedHeader.Qos, "packet_id", pk.PacketID, "topic", topic,
			"payload_bytes", len(pk.Payload), "user_properties", len(pk.Properties.User))
	}
	return slog.Group(a.Key, attrs...)
}
