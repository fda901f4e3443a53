package sskv

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// notification is a decoded KEYNOTIFY notification.
type notification struct {
	op      Op
	value   []byte
	version hlc.Timestamp
}

// parseNotification decodes a notification's payload and user properties:
// "NOTIFY SET VALUE v" or "NOTIFY DELETE" (or "DEL"), with __ts. It never
// panics, whatever the input.
func parseNotification(payload []byte, user paho.UserProperties) (notification, error) {
	var n notification
	ts, ok := "", false
	for _, p := range user {
		if p.Key == wire.PropTimestamp {
			ts, ok = p.Value, true
		}
	}
	if !ok {
		return n, errors.New("notification without __ts")
	}
	var err error
	if n.version, err = hlc.Parse(ts); err != nil {
		return n, err
	}
	var buf [4][]byte
	args, err := resp.ParseCommand(payload, buf[:0])
	if err != nil {
		return n, err
	}
	if len(args) < 2 || !bytes.EqualFold(args[0], []byte("NOTIFY")) {
		return n, errors.New("not a NOTIFY")
	}
	switch {
	case bytes.EqualFold(args[1], []byte("SET")) && len(args) == 4 && bytes.EqualFold(args[2], []byte("VALUE")):
		n.op, n.value = OpSet, args[3]
	case (bytes.EqualFold(args[1], []byte("DELETE")) || bytes.EqualFold(args[1], []byte("DEL"))) && len(args) == 2:
		n.op = OpDelete
	default:
		return n, fmt.Errorf("unknown notification %q with %d arguments", args[1], len(args))
	}
	return n, nil
}

// handleNotification runs on paho's receiving goroutine.
func (c *Client) handleNotification(key []byte, p *paho.Publish) {
	var user paho.UserProperties
	if p.Properties != nil {
		user = p.Properties.User
	}
	n, err := parseNotification(p.Payload, user)
	if err != nil {
		c.log.Warn("dropped malformed notification", "key", string(key), "error", err)
		return
	}
	if _, err := c.clock.Update(n.version); err != nil {
		c.log.Debug("clock not updated from a notification", "version", n.version, "error", err)
	}
	c.wmu.Lock()
	calls := c.notify(key, n)
	c.wmu.Unlock()
	calls.run()
}
