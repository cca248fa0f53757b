package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Clock holds the series of the clock-offset estimates between shards,
// which the cross-shard canary ring measures through the target itself
// (see probe.Clock).
type Clock struct {
	Offset      *prometheus.GaugeVec
	Uncertainty *prometheus.GaugeVec
	Samples     *prometheus.CounterVec
	Untrusted   *prometheus.CounterVec
}

func newClock(f promauto.Factory) *Clock {
	return &Clock{
		Offset: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "imcanary_clock_offset_seconds",
			Help: "How far the clock of the peer shard is ahead of this shard's (negative: behind), estimated NTP-style through the target from the cross-shard canary ring's exchanges: the median of the last few. Present once an exchange has completed.",
		}, []string{"target", "peer_shard"}),
		Uncertainty: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "imcanary_clock_offset_uncertainty_seconds",
			Help: "Bound on the error of imcanary_clock_offset_seconds: half the round trip, less the peer's own time, of the exchange it comes from. Cross-shard delivery latencies are corrected by the offset only while this is at most canary.max_clock_uncertainty.",
		}, []string{"target", "peer_shard"}),
		Samples: f.NewCounterVec(prometheus.CounterOpts{
			Name: "imcanary_clock_offset_samples_total",
			Help: "Clock-offset exchanges with the peer shard that completed and were kept (four timestamps each).",
		}, []string{"target", "peer_shard"}),
		Untrusted: f.NewCounterVec(prometheus.CounterOpts{
			Name: "imcanary_cross_shard_latency_untrusted_total",
			Help: "Cross-shard deliveries whose latency was not observed in imcanary_delivery_latency_seconds (nor imcanary_recovery_latency_seconds) because the sender's clock offset was unknown, uncertain past canary.max_clock_uncertainty, or contradicted by the newest exchange. They still count in imcanary_deliveries_total.",
		}, []string{"target", "source"}),
	}
}

// ClockPeer is the clock series of one peer shard of a target.
type ClockPeer struct {
	// Samples counts the exchanges kept.
	Samples prometheus.Counter
	// Untrusted is the counter of cross-shard latencies not observed,
	// shared by every peer of the target and source.
	Untrusted         prometheus.Counter
	c                 *Clock
	target, peerShard string
}

// ClockPeer resolves the clock series of peer shard peerShard of target,
// as seen by source. The offset and uncertainty gauges are not created
// here: a gauge at zero would claim an offset known to be zero, so they
// appear with the first estimate (Estimate).
func (c *Clock) ClockPeer(target, source, peerShard string) *ClockPeer {
	return &ClockPeer{
		Samples:   c.Samples.WithLabelValues(target, peerShard),
		Untrusted: c.Untrusted.WithLabelValues(target, source),
		c:         c, target: target, peerShard: peerShard,
	}
}

// Estimate exports the peer's current offset estimate and its uncertainty,
// in seconds.
func (p *ClockPeer) Estimate(offset, uncertainty float64) {
	p.c.Offset.WithLabelValues(p.target, p.peerShard).Set(offset)
	p.c.Uncertainty.WithLabelValues(p.target, p.peerShard).Set(uncertainty)
}
