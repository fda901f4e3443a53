package localstore

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/hlc"
)

// TestPublishSize: publishSize gives the size of the PUBLISH the broker
// encodes, to the byte, for responses and notifications as the store builds
// them, with and without subscription identifiers, across the sizes where
// the variable byte integers of the remaining length and of the properties'
// length grow.
func TestPublishSize(t *testing.T) {
	version := hlc.Timestamp{Wall: 1_795_466_846_917, Counter: 12, Node: "statestore"}
	propsOf := map[string]packets.Properties{
		"response":                   responseProps(bytes.Repeat([]byte{1}, 16), result{version: version}),
		"response without __ts":      responseProps([]byte{0, 7}, result{}),
		"response, long correlation": responseProps(bytes.Repeat([]byte{1}, 200), result{version: version}),
		"notification":               notifyProps(version.String()),
	}
	topics := []string{"r", "clients/" + strings.Repeat("x", 300) + "/response"}
	payload := make([]byte, 2_097_152+2)
	check := func(name string, props packets.Properties, topic string, payloadLen int) {
		t.Helper()
		pk := packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: 1},
			ProtocolVersion: 5,
			PacketID:        65535,
			TopicName:       topic,
			Properties:      props,
			Payload:         payload[:payloadLen],
			Mods:            packets.Mods{AllowResponseInfo: true}, // as Client.WritePacket sets for a PUBLISH
		}
		var buf bytes.Buffer
		if err := pk.PublishEncode(&buf); err != nil {
			t.Fatal(err)
		}
		if got := publishSize(topic, props, payloadLen); got != buf.Len() {
			t.Fatalf("%s, ids %v, topic of %d, payload of %d: publishSize %d, encoded %d bytes",
				name, props.SubscriptionIdentifier, len(topic), payloadLen, got, buf.Len())
		}
	}
	for name, props := range propsOf {
		for _, ids := range [][]int{nil, {0}, {1}, {127, 128}, {16384, 2_097_152, 268_435_455}} {
			props.SubscriptionIdentifier = ids
			for _, topic := range topics {
				for _, base := range []int{0, 100, 127 - 60, 128, 16383 - 120, 16384} {
					for _, payloadLen := range []int{base, base + 1, base + 2} {
						check(name, props, topic, payloadLen)
					}
				}
			}
		}
	}
	for _, payloadLen := range []int{2_097_151 - 120, 2_097_151 - 119, 2_097_152} {
		check("response", propsOf["response"], topics[0], payloadLen)
	}
}

func TestLengthSize(t *testing.T) {
	for n, want := range map[int]int{0: 1, 127: 1, 128: 2, 16383: 2, 16384: 3, 2_097_151: 3, 2_097_152: 4, 268_435_455: 4} {
		if got := lengthSize(n); got != want {
			t.Errorf("lengthSize(%d) = %d, want %d", n, got, want)
		}
		var buf bytes.Buffer
		fh := packets.FixedHeader{Type: packets.Publish, Remaining: n}
		fh.Encode(&buf)
		if got := buf.Len() - 1; got != want {
			t.Errorf("the broker encodes %d in %d bytes, want %d", n, got, want)
		}
	}
}
