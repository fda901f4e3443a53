package localstore

import (
	"context"
	"fmt"
	"time"
)

// Restart stops the store as a crash would, and after down starts a new one
// on the same address (and TLS address) with the same Config, which it
// returns; s is closed. It is the way to test what a service does across a
// restart of the broker and its state store:
//
//   - every connection is cut without a DISCONNECT, as when the process
//     dies; clients find the store gone for down, then reconnect;
//   - sessions and watches end: the new store knows no client;
//   - keys not persisted (see Config.Persist) are lost; persisted ones come
//     back with their value, version, fencing token and expiry (a key
//     whose deadline passed during down is gone);
//   - every version the new store issues is above every version the old
//     one issued, persisted or not, when it persists anything.
//
// Writes the old store executed but had not yet answered (waiting for the
// disk) are committed before it stops, as a crash could have, and their
// answers are lost with their connections. Restart returns ctx's error if
// ctx ends during down (s is closed then), and Start's if the new store
// cannot start (another process took the port, say).
func (s *Server) Restart(ctx context.Context, down time.Duration) (*Server, error) {
	cfg := s.cfg
	cfg.Addr, cfg.TLSAddr = s.Addr(), s.TLSAddr()
	if s.plain == nil {
		cfg.Addr = "-"
	}
	s.crash()
	if down > 0 {
		t := time.NewTimer(down)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("localstore: restart: %w", ctx.Err())
		case <-t.C:
		}
	}
	next, err := Start(cfg)
	if err != nil {
		return nil, fmt.Errorf("localstore: restart: %w", err)
	}
	return next, nil
}

// crash stops accepting connections, cuts every connection without a
// DISCONNECT, and closes the store.
func (s *Server) crash() {
	for _, l := range []*listener{s.plain, s.secure} {
		if l != nil {
			_ = l.ln.Close()
		}
	}
	s.connMu.Lock()
	for conn := range s.recs {
		_ = conn.Close()
	}
	s.connMu.Unlock()
	_ = s.Close()
}
