package leader

import (
	"log/slog"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// An Option configures [Campaign], [NewElector], [NewGroup] and [Observe].
// Options that do not apply to a call are ignored by it.
type Option func(*options)

type options struct {
	ttl, renewInterval, renewDeadline time.Duration
	maxHold                           time.Duration
	candidateID                       string
	logger                            *slog.Logger
	metrics                           Metrics
	onStarted                         func(*Term)
	onStopped                         func(error)
	onNewLeader                       func(State)
	healthTolerance                   time.Duration
	maxMembers                        int
	priority                          int
	prioritySet                       bool
	// endTime: the terms record when they end, for Elector.Check. Only an
	// Elector reads it, so a plain campaign spares its terms the cost.
	endTime bool
}

// WithTTL sets the lease of a term: a crashed leader is replaced about TTL
// after its last renewal. Default 10 s. TTL, renew interval and renew
// deadline follow the rules of [lock.Config].
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithRenewInterval sets how often a leader renews its term. Default TTL/3.
func WithRenewInterval(d time.Duration) Option {
	return func(o *options) { o.renewInterval = d }
}

// WithRenewDeadline sets how long after the last successful renewal was
// sent a leader gives up its term, on its own clock, before the store can
// expire it. Default 2/3 TTL.
func WithRenewDeadline(d time.Duration) Option {
	return func(o *options) { o.renewDeadline = d }
}

// WithMaxHold caps how long one term lasts, as [lock.Config.MaxHold] does
// a holding: at d after it was elected, on its own clock, the term ends as
// lost (its error wraps [lock.ErrMaxHold]) even while its renewals succeed,
// and its key is released once the work has returned. An [Elector]
// campaigns again; the other candidates, already waiting, are usually
// first. Default: no cap.
func WithMaxHold(d time.Duration) Option { return func(o *options) { o.maxHold = d } }

// WithCandidateID sets the id a candidate writes in the election's key,
// which observers see as [State.ID]. It must be unique among the
// candidates and contain no newline. Default: the sskv client id, "/" and
// 16 random hex digits, new for each campaign. For a [Group] it is the
// member's id, also the candidate id of each of its terms.
func WithCandidateID(id string) Option { return func(o *options) { o.candidateID = id } }

// WithPriority makes the candidate take part in the priority protocol
// with priority p (0 or more; higher wins). While a candidate of a higher
// priority than the leader's campaigns, the leader's work context ends
// (cause [ErrTransferred]) and, once the work has returned, the term goes
// to that candidate at once, as [Term.Transfer] gives it ([Elector.Run]
// does so, and so does [Term.Resign]). Only candidates with this option
// take part: a leader without it neither publishes a priority nor hears
// challenges (a plain election costs nothing more). The candidate id,
// unless given, is fixed for the campaign (an Elector's for all of them):
// the handover names it. A [Group] member's priority applies to every
// election of the group and works through the group's assignment, not
// this protocol: see [Group].
func WithPriority(p int) Option {
	return func(o *options) { o.priority, o.prioritySet = p, true }
}

// WithLogger sets the logger of campaigns and terms (elected, lost,
// resigned at Info). Default: discarded.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithMetrics sets hooks for metrics; see [Metrics].
func WithMetrics(m Metrics) Option { return func(o *options) { o.metrics = m } }

// OnStartedLeading sets a function that [Elector.Run] calls when this
// candidate is elected, before it runs the work with the term.
func OnStartedLeading(f func(*Term)) Option { return func(o *options) { o.onStarted = f } }

// OnStoppedLeading sets a function that [Elector.Run] calls after the work
// of a term has returned and the term was given up; its argument is why
// the term ended: an error wrapping [ErrLost], or [ErrResigned].
func OnStoppedLeading(f func(error)) Option { return func(o *options) { o.onStopped = f } }

// OnNewLeader sets a function that [Elector.Run] calls for each change of
// leadership it observes (this candidate or another, or nobody), as
// [Observe] reports them, from one goroutine, in order.
func OnNewLeader(f func(State)) Option { return func(o *options) { o.onNewLeader = f } }

// WithHealthTolerance sets how long [Elector.Check] tolerates the work of a
// term that has ended and has not returned yet before it reports the
// process unhealthy. Default: TTL - RenewDeadline, the time after which
// another candidate can have taken over.
func WithHealthTolerance(d time.Duration) Option {
	return func(o *options) { o.healthTolerance = d }
}

// WithMaxMembers sets how many members a [Group] has room for: the number
// of its member slots, which every member watches. Every member of a group
// must use the same. Default [DefaultMaxMembers]; at most 1024.
func WithMaxMembers(n int) Option { return func(o *options) { o.maxMembers = n } }

// Metrics are hooks for metrics, to bridge to Prometheus, OpenTelemetry or
// anything else without this package depending on them. Nil fields are
// skipped. They must not block for long: Leading and Leaderless are called
// synchronously, Renewal in order on a goroutine of its own.
type Metrics struct {
	// Leading is called with true when this candidate starts leading and
	// with false when its term ends: a gauge, and a count of transitions.
	Leading func(leading bool)
	// Renewal is called after each renewal of a term, with its latency and
	// error, in order, on a goroutine of its own (it may call Resign).
	Renewal func(latency time.Duration, err error)
	// Leaderless is called by an Elector when it observes a leader after a
	// time without one, with the length of that time as it observed it.
	Leaderless func(d time.Duration)
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// lockConfig is the configuration of the lock of a candidate's term.
func (o *options) lockConfig(election string, value []byte) lock.Config {
	return lock.Config{
		Name:          election,
		HolderID:      o.candidateID,
		TTL:           o.ttl,
		RenewInterval: o.renewInterval,
		RenewDeadline: o.renewDeadline,
		MaxHold:       o.maxHold,
		FenceKey:      true,
		// Candidates race for a free election, as before: an election has
		// a few candidates, which need no order, and a queue would cost
		// each follower a second watch.
		Race:      true,
		Value:     value,
		OnRenewal: o.metrics.Renewal,
		Logger:    o.logger,
	}
}
