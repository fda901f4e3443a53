// Package wire holds the constants of the state store protocol that both the
// client (package sskv) and the local state store (package sskv/localstore)
// must agree on: topics, user properties and the exact error messages.
//
// The values follow docs/protocol.md in the repository, which describes the
// deployed service where the public protocol document is vague or wrong.
package wire

import (
	"encoding/hex"
	"strings"
)

// ServiceID is the fixed identifier of the state store service in its topics.
const ServiceID = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"

// InvokeTopic is the topic clients publish requests to.
const InvokeTopic = "statestore/v1/" + ServiceID + "/command/invoke"

// NotifyPrefix starts every notification topic; response topics that start with
// it are forbidden.
const NotifyPrefix = "clients/statestore/v1/" + ServiceID

// User properties.
const (
	PropTimestamp    = "__ts"
	PropFencingToken = "__ft"
	PropStatus       = "__stat"
	PropProtocolVer  = "__protVer"
	PropSourceID     = "__srcId"
	PropPersistence  = "aio-persistence"
)

// ProtocolVersion is the value of __protVer on requests and responses.
const ProtocolVersion = "1.0"

// StatusOK is the value of __stat on every response, service errors included.
const StatusOK = "200"

// ContentType is the content type of requests and responses.
const ContentType = "application/octet-stream"

// The exact error messages of the service (the text after "-ERR ").
const (
	MsgTimestampSkew    = "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
	MsgFencingRequired  = "a fencing token is required for this request"
	MsgFencingSkew      = "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
	MsgFencingLower     = "the request fencing token is a lower version than the fencing token protecting the resource"
	MsgQuotaExceeded    = "the quota has been exceeded"
	MsgSyntaxError      = "syntax error"
	MsgNotAuthorized    = "not authorized"
	MsgUnknownCommand   = "unknown command"
	MsgWrongArgs        = "wrong number of arguments"
	MsgMissingTimestamp = "missing timestamp"
	MsgMalformedTS      = "malformed timestamp"
	MsgKeyLengthZero    = "the key length is zero"
	MsgFencingLowerDoc  = "the request fencing token is a lower version that the fencing token protecting the resource" // the public document's typo
)

// MaxTopic is the length of the longest MQTT topic name, in bytes.
const MaxTopic = 65535

// MaxNotifyKey returns the length of the longest key whose notification
// topic for clientID (see NotifyTopic) fits in MaxTopic: the topic carries
// the client id and the key in hex. It is negative if no key fits.
func MaxNotifyKey(clientID string) int {
	return (MaxTopic - len(NotifyPrefix) - len("/") - 2*len(clientID) - len("/command/notify/")) / 2
}

// NotifyTopic returns the topic on which the service delivers notifications of
// key changes to the client with the given id: both parts upper-case hex.
func NotifyTopic(clientID string, key []byte) string {
	var b strings.Builder
	b.Grow(len(NotifyPrefix) + 2*len(clientID) + len("//command/notify/") + 2*len(key))
	b.WriteString(NotifyPrefix)
	b.WriteByte('/')
	writeUpperHex(&b, []byte(clientID))
	b.WriteString("/command/notify/")
	writeUpperHex(&b, key)
	return b.String()
}

// NotifyFilter returns the topic filter that matches every notification for
// the client with the given id.
func NotifyFilter(clientID string) string {
	var b strings.Builder
	b.WriteString(NotifyPrefix)
	b.WriteByte('/')
	writeUpperHex(&b, []byte(clientID))
	b.WriteString("/command/notify/+")
	return b.String()
}

// ParseNotifyTopic splits a notification topic into the client id and key it
// names. ok is false when topic is not a well-formed notification topic.
func ParseNotifyTopic(topic string) (clientID string, key []byte, ok bool) {
	rest, found := strings.CutPrefix(topic, NotifyPrefix+"/")
	if !found {
		return "", nil, false
	}
	hexID, hexKey, found := strings.Cut(rest, "/command/notify/")
	if !found || strings.Contains(hexKey, "/") {
		return "", nil, false
	}
	id, err := hex.DecodeString(hexID)
	if err != nil {
		return "", nil, false
	}
	k, err := hex.DecodeString(hexKey)
	if err != nil {
		return "", nil, false
	}
	return string(id), k, true
}

// ForbiddenResponseTopic reports whether a request naming topic as its response
// topic must be refused (the service disconnects such a client).
func ForbiddenResponseTopic(topic string) bool {
	return topic == InvokeTopic || strings.HasPrefix(topic, NotifyPrefix)
}

const hexUpper = "0123456789ABCDEF"

func writeUpperHex(b *strings.Builder, p []byte) {
	for _, c := range p {
		b.WriteByte(hexUpper[c>>4])
		b.WriteByte(hexUpper[c&0x0f])
	}
}
