package localstore

import (
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// Notifications reach a watching client through a subscription the store
// makes on the client's behalf: a shared subscription, in a group of one,
// whose filter is the exact notification topic of (client, key). The broker
// merges it with any subscription the client made itself to the same topic,
// so the client gets each notification exactly once whether or not it
// subscribed (the official Go SDK never does), and a client's own
// SUBSCRIBE/UNSUBSCRIBE never touches it. The read ACL (see acl.go) keeps a
// client's notifications away from every other client, and every client out
// of the group.
const (
	watchGroupName = "dsslock-localstore-watch"
	watchGroup     = "$share/" + watchGroupName + "/"
)

func watchFilter(clientID string, key []byte) string {
	return watchGroup + wire.NotifyTopic(clientID, key)
}

// watch registers cl's watch of key. It returns false, registering
// nothing, when the watch would be one more than Config.MaxWatchesPerClient.
// The caller holds s.mu.
func (s *Server) watch(cl clientRef, key []byte) bool {
	// A request that was read before its connection was replaced must not
	// leave a watch behind for the new connection, which did not ask for it.
	if s.current(cl.id) != cl.cl {
		return true
	}
	if max := s.cfg.MaxWatchesPerClient; max > 0 && s.tab.watchCount(cl.id) >= max && !s.tab.watching(cl.id, key) {
		s.log.Warn("refused KEYNOTIFY: too many watches", "client", cl.id, "limit", max)
		return false
	}
	if s.tab.watch(cl.id, key) {
		s.broker.Topics.Subscribe(cl.id, packets.Subscription{Filter: watchFilter(cl.id, key), Qos: 1})
	}
	return true
}

// unwatch ends clientID's watch of key. The caller holds s.mu.
func (s *Server) unwatch(clientID string, key string) bool {
	if !s.tab.unwatch(clientID, key) {
		return false
	}
	s.broker.Topics.Unsubscribe(watchFilter(clientID, []byte(key)), clientID)
	return true
}

// endWatches ends every watch of clientID: watches belong to a connection.
// It only changes the store's tables and the broker's topic index, never
// waits on a client: new connections call it.
func (s *Server) endWatches(clientID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.tab.watchedBy(clientID) {
		s.unwatch(clientID, k)
	}
}

// notifySet tells the watchers of the key in slot i its new value. The
// caller holds s.mu.
func (s *Server) notifySet(i int) {
	w := s.tab.watchers(s.tab.key(i))
	if len(w) == 0 {
		return
	}
	key := string(s.tab.key(i))
	payload := resp.AppendCommand(nil, []byte("NOTIFY"), []byte("SET"), []byte("VALUE"), s.tab.value(i))
	ts := s.tab.version(i).String()
	for id := range w {
		s.publishNotify(id, key, payload, ts)
	}
}

// notifyDelete tells the watchers of key that it is gone (deleted or expired).
// The caller holds s.mu.
func (s *Server) notifyDelete(key string) {
	w := s.tab.watchers([]byte(key))
	if len(w) == 0 {
		return
	}
	payload := resp.AppendCommand(nil, []byte("NOTIFY"), []byte("DELETE"))
	ts := s.clock.Now().String()
	for id := range w {
		s.publishNotify(id, key, payload, ts)
	}
}

// publishNotify queues a notification for clientID's current connection;
// see outbox. The caller holds s.mu.
func (s *Server) publishNotify(clientID, key string, payload []byte, ts string) {
	if s.observe != nil {
		s.observe(clientID, key, payload, ts)
	}
	rec := s.currentRec(clientID)
	if rec == nil {
		return // not connected: its watches are ending
	}
	s.notify(rec, note{topic: wire.NotifyTopic(clientID, []byte(key)), payload: payload, ts: ts, wait: s.durableAfter()})
}

// notifyProps returns the properties of a notification stamped ts.
func notifyProps(ts string) packets.Properties {
	return packets.Properties{User: []packets.UserProperty{{Key: wire.PropTimestamp, Val: ts}}}
}
