// Package dsslockprom bridges the metrics hooks of dsslock's packages sskv,
// lock and leader to Prometheus collectors (client_golang), so that a
// service exports its client's connections and requests, its elections and
// its locks with a few lines:
//
//	reg := prometheus.NewRegistry()
//	m, err := dsslockprom.New(reg)
//	if err != nil { ... }
//	c, err := sskv.Dial(ctx, sskv.Config{Addr: addr, Metrics: m.Client()})
//	e, err := leader.NewElector(c, "orders/leader", value, leader.WithMetrics(m.Election("orders/leader")))
//	l, err := lock.New(c, lock.Config{Name: "jobs/nightly", OnRenewal: m.LockRenewal("jobs/nightly")})
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// It lives in a module of its own, so that the dsslock module itself does
// not depend on Prometheus. Its metrics:
//
//	dsslock_sskv_connected                           gauge: clients connected now
//	dsslock_sskv_connections_total                   counter: connections made (reconnects included)
//	dsslock_sskv_connection_losses_total             counter: connections lost
//	dsslock_sskv_connect_failures_total              counter: failed connection attempts
//	dsslock_sskv_requests_total{verb,outcome}        counter: requests, by verb and outcome (see below)
//	dsslock_sskv_request_duration_seconds{verb}      histogram: request latency
//	dsslock_sskv_watch_resyncs_total                 counter: watches that resynced after a reconnect
//	dsslock_leader_leading{election}                 gauge: 1 while this process leads
//	dsslock_leader_terms_total{election}             counter: terms this process began
//	dsslock_leader_renewal_duration_seconds{election} histogram: renewal latency
//	dsslock_leader_renewal_failures_total{election}  counter: failed renewals
//	dsslock_leader_leaderless_seconds{election}      histogram: time without a leader, as observed
//	dsslock_lock_renewal_duration_seconds{lock}      histogram: a lock's renewal latency
//	dsslock_lock_renewal_failures_total{lock}        counter: a lock's failed renewals
//
// Label values are the election and lock names a caller passes, and the
// fixed sets of verbs and outcomes: keys never become labels.
//
// The outcome label is one of the sskv.Outcome constants. "ok" and
// "refused" are a healthy store's answers: "refused" is the store declining
// a write because of the key's state (a condition not met, a VDEL of
// another value, a key fenced by another holder), which a follower's
// campaign meets, and a resign after a lost term. It is contention, not an
// error: alert on the others (but "canceled", which the caller asked for),
// e.g.
//
//	sum by (verb, outcome) (rate(dsslock_sskv_requests_total{outcome!~"ok|refused|canceled"}[5m])) > 0
//
// "service_error" is any other refusal of the store (a clock more than a
// minute ahead, a quota, not authorized); "timeout" a request whose
// deadline passed first, "canceled" one its caller cancelled (a shutdown,
// say); "connection_lost" and "not_sent" a
// connection lost under a request; "too_large", "closed" and "error" the
// client's own refusals and failures.
package dsslockprom
