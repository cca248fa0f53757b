package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// The Pushgateway jobs of the one-shot commands. A job and its grouping
// labels name one group on the gateway, which each push replaces: the
// grouping is what the result is of (the profile and the target), never
// the run, so that the gateway holds one group per profile rather than
// one per run, for ever.
const (
	pushJobSoak   = "imcanary_soak"
	pushJobCanary = "imcanary_canary"
)

// pushFailed is a push that did not reach the gateway: the command's own
// verdict stands, and it exits with exitPush.
type pushFailed struct{ err error }

func (e pushFailed) Error() string { return "push to the Pushgateway failed: " + e.err.Error() }
func (e pushFailed) Unwrap() error { return e.err }

// pushOptions are --push.gateway and --push.timeout.
type pushOptions struct {
	gateway string
	timeout time.Duration
}

// check refuses a gateway URL that would not work, or that carries a
// password, which the push library's errors would print.
func (o pushOptions) check() error {
	if o.gateway == "" {
		return nil
	}
	u, err := url.Parse(o.gateway)
	switch {
	case err != nil:
		// Not echoed: a value that does not parse cannot be redacted.
		return errors.New("--push.gateway: not a URL: want an http:// or https:// URL, such as http://HOST:9091")
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("--push.gateway: %q: want an http:// or https:// URL", u.Redacted())
	case u.Host == "":
		return fmt.Errorf("--push.gateway: %q: no host", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("--push.gateway: %q: credentials in the URL are refused, as errors would show them", u.Redacted())
	case o.timeout <= 0:
		return fmt.Errorf("--push.timeout: %s: must be positive", o.timeout)
	}
	return nil
}

// push sends what reg gathered to the gateway as job, grouped by the
// label pairs. A run that passed replaces its group whole (PUT), its
// last-success timestamp included; one that did not adds its series
// (POST), which replaces those of the same names and leaves the last
// success that an earlier run pushed, as the Pushgateway's documentation
// recommends for a batch job's last-success gauge.
func (o pushOptions) push(ctx context.Context, reg *prometheus.Registry, job string, passed bool, grouping ...string) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	p := push.New(o.gateway, job).Gatherer(reg).Client(&http.Client{Timeout: o.timeout})
	for i := 0; i+1 < len(grouping); i += 2 {
		p = p.Grouping(grouping[i], grouping[i+1])
	}
	var err error
	if passed {
		err = p.PushContext(ctx)
	} else {
		err = p.AddContext(ctx)
	}
	if err != nil {
		return pushFailed{err}
	}
	return nil
}

// gauge registers a gauge with labels on reg.
func gauge(reg *prometheus.Registry, name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	reg.MustRegister(g)
	return g
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// soakPushRegistry holds the final numbers of the soak run r as gauges:
// the run's outcome and headline numbers, which a pipeline's alert or
// dashboard reads from the gateway. The last-success timestamp is set
// only when r passed.
func soakPushRegistry(r *report.Soak) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	pass := r.Result == metrics.ResultPass
	gauge(reg, "imcanary_soak_last_run_success", "Whether the last soak run of this profile passed (1) or not (0).").
		WithLabelValues().Set(boolValue(pass))
	res := gauge(reg, "imcanary_soak_last_run_result", "The last soak run's result: 1 for the one it had, 0 for the others.", "result")
	for _, v := range []string{metrics.ResultPass, metrics.ResultFail, metrics.ResultInconclusive, metrics.ResultAborted} {
		res.WithLabelValues(v).Set(boolValue(r.Result == v))
	}
	gauge(reg, "imcanary_soak_last_run_timestamp_seconds", "When the last soak run ended, in seconds since the epoch.").
		WithLabelValues().Set(float64(r.End.UnixMilli()) / 1e3)
	if pass {
		gauge(reg, "imcanary_soak_last_success_timestamp_seconds", "When the last soak run that passed ended, in seconds since the epoch.").
			WithLabelValues().Set(float64(r.End.UnixMilli()) / 1e3)
	}
	gauge(reg, "imcanary_soak_last_run_duration_seconds", "How long the last soak run took, ramp, send and drain.").
		WithLabelValues().Set(r.End.Sub(r.Start).Seconds())
	gauge(reg, "imcanary_soak_last_run_sent_per_second", "Messages the last soak run sent per second of its send phase.").
		WithLabelValues().Set(r.Messages.SentPerSec)
	loss := gauge(reg, "imcanary_soak_last_run_loss_ratio", "The last soak run's lost and undelivered deliveries per expected, by kind.", "kind")
	late := gauge(reg, "imcanary_soak_last_run_late_ratio", "The last soak run's late deliveries per delivered, by kind.", "kind")
	dup := gauge(reg, "imcanary_soak_last_run_duplicate_deliveries", "The last soak run's duplicate deliveries, by kind.", "kind")
	for k, d := range r.Deliveries {
		loss.WithLabelValues(k).Set(d.LossRatio)
		late.WithLabelValues(k).Set(d.LateRatio)
		dup.WithLabelValues(k).Set(float64(d.Duplicate))
	}
	lat := gauge(reg, "imcanary_soak_last_run_latency_seconds",
		"The last soak run's latency percentiles (p50, p95, p99, max) by stage (login, ack, delivery_direct, delivery_group).",
		// Not "quantile": that label is a summary's, and these are gauges.
		"stage", "percentile")
	for stage, p := range r.Latency {
		if p.Count == 0 {
			continue // no observation, no percentile: absent rather than 0
		}
		for _, q := range []struct {
			q string
			d time.Duration
		}{{"p50", p.P50}, {"p95", p.P95}, {"p99", p.P99}, {"max", p.Max}} {
			lat.WithLabelValues(stage, q.q).Set(q.d.Seconds())
		}
	}
	return reg
}

// canaryPushRegistry holds the outcome of the canary round r as gauges.
func canaryPushRegistry(r *report.Round) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	pass := r.Result == metrics.ResultPass
	gauge(reg, "imcanary_canary_last_round_success", "Whether the last canary round passed (1) or not (0).").
		WithLabelValues().Set(boolValue(pass))
	gauge(reg, "imcanary_canary_last_round_timestamp_seconds", "When the last canary round ended, in seconds since the epoch.").
		WithLabelValues().Set(float64(r.End.UnixMilli()) / 1e3)
	if pass {
		gauge(reg, "imcanary_canary_last_success_timestamp_seconds", "When the last canary round that passed ended, in seconds since the epoch.").
			WithLabelValues().Set(float64(r.End.UnixMilli()) / 1e3)
	}
	check := gauge(reg, "imcanary_canary_last_round_check_success", "Whether the last round's check of each kind of message passed.", "kind")
	slowest := gauge(reg, "imcanary_canary_last_round_max_latency_seconds", "The last round's slowest delivery, by kind of message.", "kind")
	for _, c := range r.Checks {
		check.WithLabelValues(c.Kind).Set(boolValue(c.Pass))
		slowest.WithLabelValues(c.Kind).Set(c.MaxLatency.Seconds())
	}
	return reg
}

// verdictAndPush is a one-shot command's end: the verdict's error when it
// did not pass, else the push's. A failed verdict wins, as the more
// important news; the push error is then printed to warn of it.
func verdictAndPush(verdict, pushErr error, warn func(error)) error {
	if verdict != nil {
		if pushErr != nil {
			warn(pushErr)
		}
		return verdict
	}
	return pushErr
}
