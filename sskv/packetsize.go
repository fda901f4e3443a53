package sskv

import (
	"fmt"

	"github.com/eclipse/paho.golang/paho"
)

// checkSize returns an error wrapping ErrTooLarge if pub's packet would be
// larger than the Maximum Packet Size of the broker behind cn. It encodes
// the packet (with paho's encoder, into a counter) only when a cheap upper
// bound of its size comes near the limit, so small requests cost nothing.
func checkSize(pub *paho.Publish, cn *Conn) error {
	limit := uint64(maxMQTTPacket)
	if cn != nil && cn.maxOut != 0 {
		limit = uint64(cn.maxOut)
	}
	if sizeBound(pub) <= limit {
		return nil
	}
	size := packetSize(pub)
	if size <= limit {
		return nil
	}
	return &SizeError{Size: size, Limit: limit}
}

// SizeError is the error of a request too large for the broker: its error
// wraps ErrTooLarge.
type SizeError struct {
	Size  uint64 // the request's MQTT packet, in bytes
	Limit uint64 // the broker's Maximum Packet Size
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%v: the request's packet is %d bytes, and the broker takes at most %d", ErrTooLarge, e.Size, e.Limit)
}

func (e *SizeError) Unwrap() error { return ErrTooLarge }

// packetSize is the size of pub's PUBLISH packet on the wire, as paho
// encodes it.
func packetSize(pub *paho.Publish) uint64 {
	var n counter
	pk := pub.Packet()
	if pk.QoS > 0 && pk.PacketID == 0 {
		pk.PacketID = 1 // paho assigns one when it sends; its size is fixed
	}
	_, _ = pk.WriteTo(&n)
	return uint64(n)
}

// counter is an io.Writer that counts what is written to it.
type counter uint64

func (n *counter) Write(p []byte) (int, error) {
	*n += counter(len(p))
	return len(p), nil
}

// sizeBound is more than pub's packet can take on the wire: every field,
// plus room for every header, length and property identifier.
func sizeBound(pub *paho.Publish) uint64 {
	n := uint64(len(pub.Payload) + len(pub.Topic) + 64)
	if p := pub.Properties; p != nil {
		n += uint64(len(p.CorrelationData) + len(p.ContentType) + len(p.ResponseTopic) + 32)
		for _, u := range p.User {
			n += uint64(len(u.Key) + len(u.Value) + 5)
		}
	}
	return n
}
