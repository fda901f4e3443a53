// Package hlc implements the hybrid logical clock (HLC) timestamps that the
// Azure IoT Operations state store uses as key versions, request timestamps
// (the __ts user property) and fencing tokens (the __ft user property).
//
// # Timestamps
//
// A [Timestamp] combines a physical part, Wall (milliseconds since the Unix
// epoch), with a logical Counter that orders events within the same
// millisecond, and the id of the Node that issued it. On the wire it is the
// string
//
//	{wall ms}:{counter}:{node id}
//
// which [Timestamp.String] writes zero-padded as "%015d:%05d:%s", for example
// "001696374425000:00001:StateStore". [Parse] accepts any number of digits in
// either number, so "1696374425000:1:StateStore" parses to the same value.
// A string must have exactly three colon-separated parts, so a node id never
// contains ':'. Node ids are also non-empty and contain no ASCII control
// characters, so a stray line break is rejected rather than silently becoming
// part of the node id; spaces are allowed, as official SDKs use the MQTT
// client id as node id. Counters
// never exceed [MaxCounter] (2^31-1), because the .NET SDK reads the counter
// as a 32-bit signed integer.
//
// Timestamps are ordered by Wall, then Counter, then Node (byte-wise); see
// [Timestamp.Compare]. The node id therefore only breaks ties between clocks
// that issued the same (Wall, Counter) pair.
//
// # Clocks
//
// A [Clock] issues timestamps for one node. [Clock.Now] ticks the clock for a
// local or send event and [Clock.Update] merges a timestamp received from
// another node, following the rules of Kulkarni et al., "Logical Physical
// Clocks" (2014). Each value a Clock returns is strictly greater than every
// value it returned before, and the result of Update is also strictly greater
// than the timestamp it was given. This is what lets the state store hand out
// versions that increase on every write, and lets a fencing token taken before
// a write compare lower than the version that write returns.
//
// The clock tolerates a physical clock that stalls or steps backwards: it then
// advances the counter instead of the wall. It does not protect against a
// remote node whose clock runs ahead: Update rejects, with [ErrDrift], any
// result more than the clock's maximum drift (default [DefaultMaxDrift], 60
// seconds, the state store's limit) ahead of the local physical clock, and
// leaves the clock unchanged.
//
// # What is not guaranteed
//
// Timestamps from different nodes are ordered consistently with causality
// (if an event could have influenced another, its timestamp is lower), but
// two unrelated events on different nodes are ordered only by their
// loosely-synchronised wall clocks; the order says nothing about which
// happened first in real time. The Wall of a timestamp is close to, but may
// run ahead of, the physical time at which it was issued, and the package
// does not persist clock state: a Clock recreated after a restart relies on
// the physical clock having moved past the values issued before.
package hlc
