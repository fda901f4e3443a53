package dsslockprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// Collectors are the Prometheus collectors the hooks feed. Make one with
// New for each registry; its hooks may be given to any number of clients,
// elections and locks.
type Collectors struct {
	connected       prometheus.Gauge
	connections     prometheus.Counter
	losses          prometheus.Counter
	connectFailures prometheus.Counter
	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	resyncs         prometheus.Counter

	leading         *prometheus.GaugeVec
	terms           *prometheus.CounterVec
	renewals        *prometheus.HistogramVec
	renewalFailures *prometheus.CounterVec
	leaderless      *prometheus.HistogramVec

	lockRenewals        *prometheus.HistogramVec
	lockRenewalFailures *prometheus.CounterVec
}

// Latency buckets, from a local store's fraction of a millisecond to a
// request timeout.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer) (*Collectors, error) {
	m := &Collectors{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dsslock_sskv_connected", Help: "Clients connected to the broker now."}),
		connections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dsslock_sskv_connections_total", Help: "Connections made to the broker, reconnects included."}),
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dsslock_sskv_connection_losses_total", Help: "Connections to the broker lost."}),
		connectFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dsslock_sskv_connect_failures_total", Help: "Failed connection attempts."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsslock_sskv_requests_total", Help: "State store requests, by verb and outcome (ok and refused are answers of a healthy store; refused is contention)."}, []string{"verb", "outcome"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsslock_sskv_request_duration_seconds", Help: "State store request latency.", Buckets: latencyBuckets}, []string{"verb"}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dsslock_sskv_watch_resyncs_total", Help: "Watches that found their key changed across a reconnect."}),
		leading: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dsslock_leader_leading", Help: "1 while this process leads the election."}, []string{"election"}),
		terms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsslock_leader_terms_total", Help: "Terms this process began as leader."}, []string{"election"}),
		renewals: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsslock_leader_renewal_duration_seconds", Help: "Renewal latency of this process's terms.", Buckets: latencyBuckets}, []string{"election"}),
		renewalFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsslock_leader_renewal_failures_total", Help: "Failed renewals of this process's terms."}, []string{"election"}),
		leaderless: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsslock_leader_leaderless_seconds", Help: "Time without a leader, as this process observed it.",
			Buckets: []float64{.001, .01, .1, .5, 1, 2, 5, 10, 30, 60}}, []string{"election"}),
		lockRenewals: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsslock_lock_renewal_duration_seconds", Help: "Renewal latency of a lock.", Buckets: latencyBuckets}, []string{"lock"}),
		lockRenewalFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsslock_lock_renewal_failures_total", Help: "Failed renewals of a lock."}, []string{"lock"}),
	}
	for _, c := range []prometheus.Collector{m.connected, m.connections, m.losses, m.connectFailures, m.requests,
		m.requestDuration, m.resyncs, m.leading, m.terms, m.renewals, m.renewalFailures, m.leaderless,
		m.lockRenewals, m.lockRenewalFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Client returns the hooks for an sskv.Client (sskv.Config.Metrics).
func (m *Collectors) Client() sskv.Metrics {
	return sskv.Metrics{
		ConnectionUp: func(uint64) {
			m.connected.Inc()
			m.connections.Inc()
		},
		ConnectionDown: func(uint64, error) {
			m.connected.Dec()
			m.losses.Inc()
		},
		ConnectFailed: func(error) { m.connectFailures.Inc() },
		Request: func(verb string, d time.Duration, outcome string) {
			m.requests.WithLabelValues(verb, outcome).Inc()
			m.requestDuration.WithLabelValues(verb).Observe(d.Seconds())
		},
		WatchResync: func(string) { m.resyncs.Inc() },
	}
}

// Election returns the hooks for a candidate of election (leader.WithMetrics).
func (m *Collectors) Election(election string) leader.Metrics {
	leading := m.leading.WithLabelValues(election)
	terms := m.terms.WithLabelValues(election)
	renewals := m.renewals.WithLabelValues(election)
	failures := m.renewalFailures.WithLabelValues(election)
	leaderless := m.leaderless.WithLabelValues(election)
	return leader.Metrics{
		Leading: func(on bool) {
			if on {
				leading.Set(1)
				terms.Inc()
			} else {
				leading.Set(0)
			}
		},
		Renewal: func(d time.Duration, err error) {
			renewals.Observe(d.Seconds())
			if err != nil {
				failures.Inc()
			}
		},
		Leaderless: func(d time.Duration) { leaderless.Observe(d.Seconds()) },
	}
}

// LockRenewal returns the hook for the renewals of the lock name
// (lock.Config.OnRenewal).
func (m *Collectors) LockRenewal(name string) func(time.Duration, error) {
	renewals := m.lockRenewals.WithLabelValues(name)
	failures := m.lockRenewalFailures.WithLabelValues(name)
	return func(d time.Duration, err error) {
		renewals.Observe(d.Seconds())
		if err != nil {
			failures.Inc()
		}
	}
}
