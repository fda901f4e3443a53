package sskv

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// satMethod is the MQTT v5 enhanced authentication method of Azure IoT
// Operations for Kubernetes service account tokens.
const satMethod = "K8S-SAT"

// receiveMaximum is the Receive Maximum the client declares in CONNECT: how
// many QoS 1 messages (responses and notifications) the broker may have
// sent it unacknowledged. paho allocates a queue of incoming messages this
// long for every connection: at MQTT's default of 65,535 that was 512 KiB
// per client, made again at each reconnect. The client acknowledges each
// message as soon as it has handed it on, so it is never that far behind
// unless it cannot keep up; then a broker holds the rest back, and the
// local store disconnects a client that falls behind by its
// MaxPendingMessages, 8,192 by default, as it always did.
const receiveMaximum = 8192

// errCredentialsFile marks a PasswordFile or SATFile that cannot be read.
var errCredentialsFile = errors.New("credentials file unreadable")

// buildConnect completes the CONNECT packet of each connection attempt,
// reading the password and token files afresh.
func (c *Client) buildConnect(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
	if cp.Properties == nil {
		cp.Properties = &paho.ConnectProperties{}
	}
	if c.cfg.MaxPacketSize > 0 {
		v := uint32(c.cfg.MaxPacketSize)
		cp.Properties.MaximumPacketSize = &v
	}
	if cp.Properties.ReceiveMaximum == nil {
		v := uint16(receiveMaximum)
		cp.Properties.ReceiveMaximum = &v
	}
	if cp.Properties.SessionExpiryInterval == nil {
		v := uint32((c.cfg.SessionExpiry + time.Second - 1) / time.Second)
		cp.Properties.SessionExpiryInterval = &v
	}
	if c.cfg.Username != "" {
		cp.Username, cp.UsernameFlag = c.cfg.Username, true
	}
	switch {
	case len(c.cfg.Password) > 0:
		cp.Password, cp.PasswordFlag = c.cfg.Password, true
	case c.cfg.PasswordFile != "":
		pw, err := os.ReadFile(c.cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("sskv: reading PasswordFile: %w: %w", errCredentialsFile, err)
		}
		cp.Password, cp.PasswordFlag = pw, true
	}
	if c.cfg.SATFile != "" {
		tok, err := os.ReadFile(c.cfg.SATFile)
		if err != nil {
			return nil, fmt.Errorf("sskv: reading SATFile: %w: %w", errCredentialsFile, err)
		}
		cp.Properties.AuthMethod = satMethod
		cp.Properties.AuthData = tok
	}
	return cp, nil
}

// satAuth answers the broker's enhanced-authentication challenges with the
// current service account token. paho requires a handler whenever CONNACK
// names an authentication method.
type satAuth struct{ c *Client }

func (a satAuth) Authenticate(*paho.Auth) *paho.Auth {
	out := &paho.Auth{ReasonCode: 0x18, Properties: &paho.AuthProperties{AuthMethod: satMethod}} // continue authentication
	if a.c.cfg.SATFile != "" {
		tok, err := os.ReadFile(a.c.cfg.SATFile)
		if err != nil {
			a.c.log.Warn("reading SATFile for re-authentication", "error", err)
		}
		out.Properties.AuthData = tok
	}
	return out
}

func (satAuth) Authenticated() {}
