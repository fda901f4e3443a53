package lease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"
)

// Config is lock.Config, valid and with its defaults filled in: see there
// for what each field means. The two have the same fields, so that one
// converts to the other.
type Config struct {
	Name          string
	HolderID      string
	TTL           time.Duration
	RenewInterval time.Duration
	RenewDeadline time.Duration
	FenceKey      bool
	Race          bool
	Value         []byte
	MaxHold       time.Duration
	OnRenewal     func(latency time.Duration, err error)
	Logger        *slog.Logger
}

// nonce is 8 random bytes, written in hex: kept as the bytes, it costs a
// Lease no allocation of its own.
type nonce [8]byte

func newNonce() (n nonce) {
	_, _ = rand.Read(n[:])
	return n
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ConfigErr is an error wrapping ErrConfig.
func ConfigErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

// DefaultHolderID returns a new HolderID for a Lock of the client with id
// clientID: the id, a slash and 16 random hex digits.
func DefaultHolderID(clientID string) string { return clientID + "/" + RandomHex(8) }

// Logger returns cfg's Logger with the lock's name and holder id (if any
// yet), or the Logger itself when it discards everything: a Lease's logger
// then costs nothing.
func Logger(cfg *Config) *slog.Logger {
	switch {
	case cfg.Logger.Handler() == slog.DiscardHandler:
		return cfg.Logger
	case cfg.HolderID == "":
		return cfg.Logger.With("lock", cfg.Name)
	}
	return cfg.Logger.With("lock", cfg.Name, "holder", cfg.HolderID)
}
