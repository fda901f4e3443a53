package lock

import (
	"log/slog"
	"strings"
	"time"

	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/lock/internal/wait"
	"github.com/dsslock/dsslock/sskv"
)

// Defaults applied by [New] to zero fields of [Config].
const (
	DefaultTTL = 10 * time.Second
)

// Config configures a [Lock]. Only Name is required. TTL, RenewInterval and
// RenewDeadline are whole milliseconds with
//
//	0 < RenewInterval < RenewDeadline < TTL
//
// and default to 10 s, TTL/3 and 2/3 TTL.
type Config struct {
	Name string // the key that holds the lock; not empty
	// HolderID is the key's value while this Lock holds it; never shared
	// by two Locks. Default: the sskv client id, "/", 16 random hex digits.
	HolderID string
	// TTL is the lease: how long the key lives after each acquisition or
	// renewal (PX) if the holder stops renewing.
	TTL time.Duration
	// RenewInterval is the time from a successful renewal to the next, with
	// jitter; a failed renewal is retried sooner, until RenewDeadline.
	RenewInterval time.Duration
	// RenewDeadline is how long after sending the last successful renewal
	// the holder gives up (ErrRenewDeadline), and bounds the wait for an
	// acquisition's answers: over a path slower than half of it, a FenceKey
	// acquisition (two round trips) never succeeds.
	RenewDeadline time.Duration
	// FenceKey makes each holding fence its own key with its token and
	// record the token and Value in it ([Lock.Holder], [Lock.SetValue]).
	// An acquisition costs two requests. All holders of a lock must agree
	// on it (else ErrNotALock). Package leader sets it.
	FenceKey bool
	// Race makes waiters race for each release, as the SDK's do, instead
	// of queueing in the order they came. Package leader sets it.
	Race  bool
	Value []byte // published with the holding; needs FenceKey
	// MaxHold, if positive, caps how long one holding lasts: MaxHold after
	// the acquisition was sent, on the holder's own monotonic clock, the
	// holding ends as lost (Err wraps ErrLost and ErrMaxHold) even while
	// its renewals succeed. Its context is cancelled and it renews no
	// more; the key is deleted by Unlock once the work has returned, or
	// expires within TTL. Zero: no cap.
	MaxHold time.Duration
	// OnRenewal, if set, is called after every renewal with its latency
	// and error, in order, on a goroutine of its own: it may call any
	// method of the Lock, and may run after Unlock or Close has returned.
	OnRenewal func(latency time.Duration, err error)
	// Logger receives the lock's logs (acquired, lost, released at Info;
	// failed renewals at Debug). Default: discarded.
	Logger *slog.Logger
}

func configErr(format string, args ...any) error { return lease.ConfigErr(format, args...) }

// minDefaultTTL is the shortest TTL whose default RenewInterval and
// RenewDeadline (a third and two thirds of it, in whole milliseconds) satisfy
// 0 < RenewInterval < RenewDeadline < TTL. (A real network needs far more.)
const minDefaultTTL = 3 * time.Millisecond

// withDefaults validates cfg and fills in its defaults. clientID is the id of
// the sskv client, the prefix of the default HolderID.
func (cfg Config) withDefaults(clientID string) (Config, error) {
	if cfg.Name == "" {
		return cfg, configErr("empty Name")
	}
	if cfg.HolderID == "" {
		cfg.HolderID = lease.DefaultHolderID(clientID)
	}
	if strings.ContainsAny(cfg.HolderID, "\n") {
		return cfg, configErr("HolderID %q contains a newline", cfg.HolderID)
	}
	if len(cfg.Value) > 0 && !cfg.FenceKey {
		return cfg, configErr("Value needs FenceKey: only a fenced key can carry a value safely")
	}
	if cfg.TTL < 0 || cfg.RenewInterval < 0 || cfg.RenewDeadline < 0 {
		return cfg, configErr("negative TTL, RenewInterval or RenewDeadline")
	}
	if cfg.MaxHold < 0 {
		return cfg, configErr("negative MaxHold %v", cfg.MaxHold)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.RenewInterval == 0 && cfg.RenewDeadline == 0 && cfg.TTL%time.Millisecond == 0 && cfg.TTL < minDefaultTTL {
		// Only TTL was set: name it, not the fields derived from it.
		return cfg, configErr("TTL %v is too short: with the default RenewInterval (TTL/3) and RenewDeadline (2/3 TTL), in whole milliseconds, it must be at least %v", cfg.TTL, minDefaultTTL)
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = (cfg.TTL / 3).Truncate(time.Millisecond)
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = (cfg.TTL - cfg.TTL/3).Truncate(time.Millisecond) // 2/3 TTL, without overflow
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"TTL", cfg.TTL}, {"RenewInterval", cfg.RenewInterval}, {"RenewDeadline", cfg.RenewDeadline}} {
		if d.v < time.Millisecond || d.v%time.Millisecond != 0 {
			return cfg, configErr("%s %v is not a positive whole number of milliseconds", d.name, d.v)
		}
	}
	if cfg.RenewDeadline >= cfg.TTL {
		return cfg, configErr("RenewDeadline %v must be less than TTL %v: the holder must give up before the store can expire its key", cfg.RenewDeadline, cfg.TTL)
	}
	if cfg.RenewInterval >= cfg.RenewDeadline {
		return cfg, configErr("RenewInterval %v must be less than RenewDeadline %v: at least one renewal must be tried before the deadline", cfg.RenewInterval, cfg.RenewDeadline)
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger
	}
	return cfg, nil
}

// discardLogger is the Logger of a Config that has none, shared.
var discardLogger = slog.New(slog.DiscardHandler)

// checkWatchable returns an error wrapping ErrConfig if c cannot watch
// every key a Lock on name with holderID would: the longest are the inbox
// keys of its queue (name, inboxInfix, a HolderID). A notification's topic
// carries the key in hex (see sskv.Client.MaxWatchKey).
func checkWatchable(c *sskv.Client, name, holderID string) error {
	if n, max := len(name)+len(wait.InboxInfix)+len(holderID), c.MaxWatchKey(); n > max {
		return configErr("Name (%d bytes) and HolderID (%d bytes) too long: the lock watches keys of %d bytes, and this client can watch keys of at most %d (%w)",
			len(name), len(holderID), n, max, sskv.ErrKeyTooLong)
	}
	return nil
}
