// Package metrics defines every Prometheus series imcanary exports. It owns
// names, help texts, labels and buckets, so that the rest of the code records
// facts and never spells a metric name.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"
)

// Label values. Sources and kinds are closed sets so that every series can be
// initialised at zero: alerts on rate() and absent() need the series to exist
// before the first event.
const (
	SourceBackground = "background"
	SourceCanary     = "canary"
	SourceSoak       = "soak"

	KindDirect = "direct"
	KindGroup  = "group"
)

// Cohorts of receiving users: the slow readers of a drill are counted
// apart, so that what the server does to them never blurs the SLIs of
// everyone else.
const (
	CohortNormal     = "normal"
	CohortSlowReader = "slow_reader"
)

// Sources, Kinds and Cohorts list every value of the source, kind and
// cohort labels.
var (
	Sources = []string{SourceBackground, SourceCanary, SourceSoak}
	Kinds   = [...]string{Direct: KindDirect, Group: KindGroup}
	Cohorts = [...]string{Normal: CohortNormal, SlowReader: CohortSlowReader}
)

// Causes of the prober's saturation: each is a reason its own numbers may
// be wrong.
const (
	CauseSendLag      = "send_lag"      // sends leave late against their schedule
	CauseReceiveLag   = "receive_lag"   // frames wait between the socket read and the ledger
	CauseSchedLatency = "sched_latency" // runnable goroutines wait for a CPU
	CauseGCPause      = "gc_pause"      // stop-the-world pauses
	CauseCPU          = "cpu"           // the process uses nearly all its cores
	CauseFDs          = "fds"           // open files near the limit
	CausePorts        = "ports"         // ephemeral ports of a source address nearly used up
)

// Causes lists every value of the cause label of
// imcanary_probe_saturation_cause.
var Causes = []string{CauseSendLag, CauseReceiveLag, CauseSchedLatency, CauseGCPause, CauseCPU, CauseFDs, CausePorts}

// Disconnect reasons: why a session ended.
const (
	ReasonServerClose  = "server_close"
	ReasonSlowConsumer = "slow_consumer"
	ReasonError        = "error"
	ReasonShutdown     = "shutdown"
	// ReasonChurn is a session the population ended itself, at the end
	// of its lifetime (population.session_lifetime), to log in again.
	ReasonChurn = "churn"
	// ReasonConflict is a session the server closed because its user
	// logged in elsewhere: another device, or one past the server's
	// device limit. It is the server's policy, never loss.
	ReasonConflict = "conflict"
)

// DisconnectReasons lists every value of the reason label of
// imcanary_session_disconnects_total.
var DisconnectReasons = []string{ReasonServerClose, ReasonSlowConsumer, ReasonError, ReasonShutdown, ReasonChurn, ReasonConflict}

// Connect failure reasons: why one connect-and-login attempt failed. The
// set is closed and small so that every series exists at zero, and each
// says where to look: the network (refused, timeout, dns, tls, network),
// what answered the WebSocket upgrade (http_4xx, http_5xx, http_other), the
// login (unauthorized, protocol), or setting up users and groups before any
// session (provisioning).
const (
	ConnectRefused      = "refused"      // nothing listens: TCP connection refused
	ConnectTimeout      = "timeout"      // no answer in time: dial, handshake or login
	ConnectDNS          = "dns"          // the host name does not resolve
	ConnectTLS          = "tls"          // the TLS handshake failed: certificate, protocol
	ConnectNetwork      = "network"      // any other network error: reset, unreachable, closed early
	ConnectHTTP4xx      = "http_4xx"     // the upgrade was answered 4xx (but 401 and 403)
	ConnectHTTP5xx      = "http_5xx"     // the upgrade was answered 5xx
	ConnectHTTPOther    = "http_other"   // the upgrade was answered with a status that is not 101
	ConnectUnauthorized = "unauthorized" // credentials refused: HTTP 401/403 or the protocol's own login refusal
	ConnectProtocol     = "protocol"     // the server spoke, but not the protocol as expected
	ConnectProvisioning = "provisioning" // creating users or groups failed for a reason of its own
)

// ConnectFailReasons lists every value of the reason label of
// imcanary_session_connect_failures_total.
var ConnectFailReasons = []string{
	ConnectRefused, ConnectTimeout, ConnectDNS, ConnectTLS, ConnectNetwork,
	ConnectHTTP4xx, ConnectHTTP5xx, ConnectHTTPOther, ConnectUnauthorized, ConnectProtocol, ConnectProvisioning,
}

// Send error reasons.
const (
	SendOffline      = "offline"      // the sender had no session at its intended send time
	SendWrite        = "write"        // writing the message failed
	SendAckTimeout   = "ack_timeout"  // no ack within the deadline
	SendDisconnected = "disconnected" // the session ended before the ack came
	SendRejected     = "rejected"     // the server answered with an error
)

// SendErrorReasons lists every value of the reason label of
// imcanary_send_errors_total.
var SendErrorReasons = []string{SendOffline, SendWrite, SendAckTimeout, SendDisconnected, SendRejected}

// Reasons a received frame is not counted as a delivery.
const (
	IgnoredMalformed = "malformed"  // not a probe message, or a corrupt one
	IgnoredStale     = "stale"      // intended before this ledger started: an earlier run's leftovers
	IgnoredAfterLost = "after_lost" // arrived after it had already been declared lost
	IgnoredTooOld    = "too_old"    // older than the window the ledger remembers
	// A new stream beyond the inbox's limit: only a server that invents
	// senders gets there.
	IgnoredStreamLimit = "stream_limit"
	// A message catch-up returned that the device already had: the
	// normal overlap of a history fetch with the pushes, which a real
	// client drops by id. (A push of one catch-up had already returned
	// is a late push, counted apart.)
	IgnoredCatchUp = "catch_up"
	// A message of the device's own user that is not owed to it: an echo
	// of what this device sent, or one the protocol does not sync to a
	// user's other devices.
	IgnoredOwn = "own"
	// A group message to a device whose user was not a member of the
	// group when the message was sent.
	IgnoredLeftGroup = "left_group"
)

// IgnoredReasons lists every value of the reason label of
// imcanary_deliveries_ignored_total.
var IgnoredReasons = []string{IgnoredMalformed, IgnoredStale, IgnoredAfterLost, IgnoredTooOld, IgnoredStreamLimit, IgnoredCatchUp, IgnoredOwn, IgnoredLeftGroup}

// Size classes of groups, by members, for the fan-out time: a group of
// 10,000 is felt differently from one of 5, and a handful of fixed classes
// keeps the series few whatever the layout.
var SizeClasses = []string{"2-9", "10-99", "100-999", "1000+"}

// SizeClassOf returns the index in SizeClasses of a group of members.
func SizeClassOf(members int) int {
	switch {
	case members < 10:
		return 0
	case members < 100:
		return 1
	case members < 1000:
		return 2
	}
	return 3
}

// LatencyBuckets resolve 1 ms to 30 s. 1 s is a boundary on purpose: the
// latency SLI counts deliveries under 1 s, and a ratio of histogram buckets
// is only exact on a boundary.
var LatencyBuckets = []float64{
	0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
	1, 2, 5, 10, 20, 30,
}

// LagBuckets resolve the prober's own lags, 100 µs to 5 s: its noise must
// be told apart from the server's latency well below a millisecond.
var LagBuckets = []float64{
	0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
	0.1, 0.2, 0.5, 1, 2, 5,
}

// DeliveryLagBuckets count messages a session is behind; 0 is a bucket of
// its own, the healthy case.
var DeliveryLagBuckets = []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}

// Metrics holds every imcanary series, registered on one registry.
type Metrics struct {
	SessionsOnline     *prometheus.GaugeVec
	SessionsWanted     *prometheus.GaugeVec
	SessionConnects    *prometheus.CounterVec
	ConnectFailures    *prometheus.CounterVec
	SessionDisconnects *prometheus.CounterVec
	TargetReachable    *prometheus.GaugeVec

	MessagesSent *prometheus.CounterVec
	SendErrors   *prometheus.CounterVec
	AckLatency   *prometheus.HistogramVec

	DeliveriesExpected  *prometheus.CounterVec
	Deliveries          *prometheus.CounterVec
	DeliveriesLost      *prometheus.CounterVec
	DeliveriesLate      *prometheus.CounterVec
	DeliveriesDuplicate *prometheus.CounterVec
	DeliveriesReordered *prometheus.CounterVec
	DeliveriesIgnored   *prometheus.CounterVec
	DeliveryLatency     *prometheus.HistogramVec
	DeliveriesRecovered *prometheus.CounterVec
	RecoveryLatency     *prometheus.HistogramVec
	DeliveriesLatePush  *prometheus.CounterVec
	GroupFanout         *prometheus.HistogramVec
	MembershipChanges   *prometheus.CounterVec

	DeliveriesSaturated *prometheus.CounterVec

	// DeliveriesUnowed counts apart the deliveries of messages the server
	// never acknowledged, so that delivered never exceeds expected.
	DeliveriesUnowed *prometheus.CounterVec

	StreamsTracked  *prometheus.GaugeVec
	Ready           *prometheus.GaugeVec
	DeliveryLag     *prometheus.HistogramVec
	SessionsLagging *prometheus.GaugeVec

	ProbeSendLag         *prometheus.HistogramVec
	ProbeReceiveLag      *prometheus.HistogramVec
	ProbeSaturated       *prometheus.GaugeVec
	ProbeSaturationCause *prometheus.GaugeVec
	ProbeCPUUsage        *prometheus.GaugeVec
	ProbePortUsage       *prometheus.GaugeVec

	CanaryRounds        *prometheus.CounterVec
	CanaryFailures      *prometheus.CounterVec
	CanarySkipped       *prometheus.CounterVec
	CanaryLastTimestamp *prometheus.GaugeVec
	CanaryLastSuccess   *prometheus.GaugeVec
	CanaryNextRound     *prometheus.GaugeVec

	ConfigLastReloadOK      prometheus.Gauge
	ConfigLastReloadSuccess prometheus.Gauge

	SoakRuns        *prometheus.CounterVec
	SoakSkipped     *prometheus.CounterVec
	SoakLastSuccess *prometheus.GaugeVec
	SoakRunning     *prometheus.GaugeVec
	// A search for the server's limit: its runs by result, the knee of
	// the last that found one, and the knee of its pinned baseline.
	SearchRuns         *prometheus.CounterVec
	SearchKnee         *prometheus.GaugeVec
	SearchBaselineKnee *prometheus.GaugeVec

	// Clock is the clock-offset estimates between shards (clock.go).
	Clock *Clock

	// The connect path's series (connect.go). TLSCertExpiry is created
	// by the first TLS handshake of a target, not at zero.
	ConnectDuration *prometheus.HistogramVec
	TLSHandshakes   *prometheus.CounterVec
	TLSCertExpiry   *prometheus.GaugeVec
}

// Canary failure reasons.
const (
	CanarySessionDown  = "session_down"
	CanaryNoAck        = "no_ack"
	CanaryNotDelivered = "not_delivered"
	CanaryLate         = "late"
	CanaryDuplicated   = "duplicated"
	// CanaryRecovered: a recipient had the message only by catch-up,
	// not pushed.
	CanaryRecovered = "recovered"
)

// CanaryReasons lists every value of the reason label of
// imcanary_canary_failures_total.
var CanaryReasons = []string{CanarySessionDown, CanaryNoAck, CanaryNotDelivered, CanaryLate, CanaryDuplicated, CanaryRecovered}

// Results of a canary round or a soak run.
const (
	ResultPass    = "pass"
	ResultFail    = "fail"
	ResultAborted = "aborted"
	// ResultInconclusive is a soak run that missed a threshold while the
	// prober was saturated: its numbers cannot tell the server's fault
	// from imcanary's own.
	ResultInconclusive = "inconclusive"
)

// New creates the series and registers them on reg. Tests pass a pedantic
// registry; main passes one that also carries the Go and process collectors.
func New(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{}
	m.newSessions(f)
	m.newSends(f)
	m.newDeliveries(f)
	m.newProbe(f)
	m.newRuns(f)
	m.Clock = newClock(f)
	m.newConnect(f)
	return m
}

// Value returns the current value of a counter or gauge.
func Value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return 0
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	return 0
}

// Count returns how many observations a histogram or summary holds, 0 for
// anything else.
func Count(o prometheus.Observer) uint64 {
	m, ok := o.(prometheus.Metric)
	if !ok {
		return 0
	}
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return 0
	}
	switch {
	case d.Histogram != nil:
		return d.Histogram.GetSampleCount()
	case d.Summary != nil:
		return d.Summary.GetSampleCount()
	}
	return 0
}

// Set is the series of one (target, source) pair with every label resolved,
// so that the delivery path records without a map lookup or an allocation.
type Set struct {
	Online, Wanted, Streams, Ready prometheus.Gauge
	SessionsLagging                prometheus.Gauge
	DeliveryLag                    prometheus.Observer

	ConnectOK, ConnectFail prometheus.Counter
	// ConnectFailures counts failed attempts by reason (one of
	// ConnectFailReasons); each also counts in ConnectFail.
	ConnectFailures map[string]prometheus.Counter
	Disconnects     map[string]prometheus.Counter
	SendErrors      map[string]prometheus.Counter
	Ignored         map[string]prometheus.Counter

	Kind [len(Kinds)]KindSet // indexed by Kind
	// Fanout is the group fan-out time, indexed like SizeClasses.
	Fanout []prometheus.Observer
	// MembershipChanges counts membership churn's leaves and rejoins.
	MembershipChanges prometheus.Counter

	// Connect times the phases of the sessions' connects (connect.go).
	Connect ConnectSet
}

// KindSet is the per-kind part of a Set: what the sender records, and what
// the receivers record by cohort.
type KindSet struct {
	Sent       prometheus.Counter
	AckLatency prometheus.Observer
	// Saturated counts deliveries recorded while the prober was saturated.
	Saturated prometheus.Counter
	Cohort    [len(Cohorts)]RecvSet // indexed by Cohort
}

// RecvSet is what the receivers of one cohort record for one kind.
type RecvSet struct {
	Expected, Delivered, Lost, Late, Duplicate, Reordered prometheus.Counter
	DeliveryLatency                                       prometheus.Observer
	// Recovered counts deliveries fetched by catch-up; RecoveryLatency
	// times them. LatePush counts pushes of what was already recovered.
	Recovered       prometheus.Counter
	RecoveryLatency prometheus.Observer
	LatePush        prometheus.Counter
	// Unowed counts first deliveries of messages never acknowledged to
	// their sender, which Expected does not owe.
	Unowed prometheus.Counter
}

// Kind indexes Set.Kind: a message's kind.
type Kind int

// The kinds of message, in the order of Kinds.
const (
	Direct Kind = iota
	Group
)

// KindOf returns the kind of a group message (group) or a direct one.
func KindOf(group bool) Kind {
	if group {
		return Group
	}
	return Direct
}

// Name returns the kind's label value.
func (k Kind) Name() string { return Kinds[k] }

// Cohort indexes KindSet.Cohort: who received.
type Cohort int

// The cohorts of receiving users, in the order of Cohorts.
const (
	Normal Cohort = iota
	SlowReader
)

// CohortOf returns the cohort of a slow reader (slow) or a normal user.
func CohortOf(slow bool) Cohort {
	if slow {
		return SlowReader
	}
	return Normal
}

// For resolves the series of target and source, creating them at zero.
func (m *Metrics) For(target, source string) *Set {
	s := &Set{
		Online:            m.SessionsOnline.WithLabelValues(target, source),
		Wanted:            m.SessionsWanted.WithLabelValues(target, source),
		Streams:           m.StreamsTracked.WithLabelValues(target, source),
		Ready:             m.Ready.WithLabelValues(target, source),
		SessionsLagging:   m.SessionsLagging.WithLabelValues(target, source),
		DeliveryLag:       m.DeliveryLag.WithLabelValues(target, source),
		ConnectOK:         m.SessionConnects.WithLabelValues(target, source, "success"),
		ConnectFail:       m.SessionConnects.WithLabelValues(target, source, "failure"),
		ConnectFailures:   map[string]prometheus.Counter{},
		Disconnects:       map[string]prometheus.Counter{},
		SendErrors:        map[string]prometheus.Counter{},
		Ignored:           map[string]prometheus.Counter{},
		MembershipChanges: m.MembershipChanges.WithLabelValues(target, source),
	}
	for _, r := range ConnectFailReasons {
		s.ConnectFailures[r] = m.ConnectFailures.WithLabelValues(target, source, r)
	}
	for _, r := range DisconnectReasons {
		s.Disconnects[r] = m.SessionDisconnects.WithLabelValues(target, source, r)
	}
	for _, r := range SendErrorReasons {
		s.SendErrors[r] = m.SendErrors.WithLabelValues(target, source, r)
	}
	for _, r := range IgnoredReasons {
		s.Ignored[r] = m.DeliveriesIgnored.WithLabelValues(target, source, r)
	}
	for i, k := range Kinds {
		ks := KindSet{
			Sent:       m.MessagesSent.WithLabelValues(target, source, k),
			AckLatency: m.AckLatency.WithLabelValues(target, source, k),
			Saturated:  m.DeliveriesSaturated.WithLabelValues(target, source, k),
		}
		for j, c := range Cohorts {
			ks.Cohort[j] = RecvSet{
				Expected:        m.DeliveriesExpected.WithLabelValues(target, source, k, c),
				Delivered:       m.Deliveries.WithLabelValues(target, source, k, c),
				Lost:            m.DeliveriesLost.WithLabelValues(target, source, k, c),
				Late:            m.DeliveriesLate.WithLabelValues(target, source, k, c),
				Duplicate:       m.DeliveriesDuplicate.WithLabelValues(target, source, k, c),
				Reordered:       m.DeliveriesReordered.WithLabelValues(target, source, k, c),
				DeliveryLatency: m.DeliveryLatency.WithLabelValues(target, source, k, c),
				Recovered:       m.DeliveriesRecovered.WithLabelValues(target, source, k, c),
				RecoveryLatency: m.RecoveryLatency.WithLabelValues(target, source, k, c),
				LatePush:        m.DeliveriesLatePush.WithLabelValues(target, source, k, c),
				Unowed:          m.DeliveriesUnowed.WithLabelValues(target, source, k, c),
			}
		}
		s.Kind[i] = ks
	}
	for _, c := range SizeClasses {
		s.Fanout = append(s.Fanout, m.GroupFanout.WithLabelValues(target, source, c))
	}
	s.Connect = m.connectFor(target, source)
	return s
}

// ProbeSet is the prober's own health series for one target: one per
// process, whatever the sources.
type ProbeSet struct {
	SendLag, ReceiveLag prometheus.Observer
	Saturated, CPU      prometheus.Gauge
	Cause               map[string]prometheus.Gauge
	m                   *Metrics
	target              string
}

// Probe resolves the prober's health series of target, creating them at
// zero.
func (m *Metrics) Probe(target string) *ProbeSet {
	p := &ProbeSet{
		SendLag:    m.ProbeSendLag.WithLabelValues(target),
		ReceiveLag: m.ProbeReceiveLag.WithLabelValues(target),
		Saturated:  m.ProbeSaturated.WithLabelValues(target),
		CPU:        m.ProbeCPUUsage.WithLabelValues(target),
		Cause:      map[string]prometheus.Gauge{},
		m:          m,
		target:     target,
	}
	for _, c := range Causes {
		p.Cause[c] = m.ProbeSaturationCause.WithLabelValues(target, c)
	}
	return p
}

// PortUsage returns the port-usage gauge of a local address. Addresses are
// the few the population dials from, so the series stay few.
func (p *ProbeSet) PortUsage(addr string) prometheus.Gauge {
	return p.m.ProbePortUsage.WithLabelValues(p.target, addr)
}

// Cumulative returns a histogram's cumulative bucket counts, its count
// last (the +Inf bucket), or nil if o is not a histogram.
func Cumulative(o prometheus.Observer) []float64 {
	m, ok := o.(prometheus.Metric)
	if !ok {
		return nil
	}
	var d dto.Metric
	if m.Write(&d) != nil || d.Histogram == nil {
		return nil
	}
	out := make([]float64, 0, len(d.Histogram.GetBucket())+1)
	for _, b := range d.Histogram.GetBucket() {
		out = append(out, float64(b.GetCumulativeCount()))
	}
	return append(out, float64(d.Histogram.GetSampleCount()))
}

// Below returns how many observations of a histogram were at most le, and
// how many there were in all. le must be a bucket boundary to be exact; the
// buckets include 1 s for the latency SLI.
func Below(o prometheus.Observer, le float64) (below, count float64) {
	m, ok := o.(prometheus.Metric)
	if !ok {
		return 0, 0
	}
	var d dto.Metric
	if err := m.Write(&d); err != nil || d.Histogram == nil {
		return 0, 0
	}
	for _, b := range d.Histogram.Bucket {
		if b.GetUpperBound() == le {
			below = float64(b.GetCumulativeCount())
		}
	}
	return below, float64(d.Histogram.GetSampleCount())
}

// Failed counts one failed connect, login or provisioning attempt under
// reason (one of ConnectFailReasons; anything else counts as protocol, so
// that no failure goes uncounted).
func (s *Set) Failed(reason string) {
	c, ok := s.ConnectFailures[reason]
	if !ok {
		c = s.ConnectFailures[ConnectProtocol]
	}
	c.Inc()
	s.ConnectFail.Inc()
}

// FrameCounts are a driver's counts of what its sessions read but could not
// use, and of the gaps the server's own sequence numbers showed (see
// probe.FrameCounter). They are read when scraped.
type FrameCounts struct {
	Unmatched func() uint64
	Gaps      func() (gaps, missed uint64)
}

// RegisterFrameCounts exports c for target: frames that matched no rule of
// the protocol's mapping as imcanary_frames_ignored_total{reason=
// "unmatched"}, and the server's sequence gaps. It is registered only for
// a driver that counts them.
func RegisterFrameCounts(reg prometheus.Registerer, target string, c FrameCounts) {
	labels := prometheus.Labels{"target": target}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "imcanary_frames_ignored_total",
			Help:        "Frames read from the server that imcanary did not use, by reason: unmatched frames matched no rule of the protocol's mapping.",
			ConstLabels: prometheus.Labels{"target": target, "reason": "unmatched"},
		}, func() float64 { return float64(c.Unmatched()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "imcanary_server_sequence_gaps_total",
			Help:        "Jumps in a conversation's server-assigned sequence numbers within a session: pushes the server's own numbering shows it skipped.",
			ConstLabels: labels,
		}, func() float64 { g, _ := c.Gaps(); return float64(g) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "imcanary_server_sequence_missed_total",
			Help:        "Sequence numbers the server's numbering skipped, over imcanary_server_sequence_gaps_total's gaps.",
			ConstLabels: labels,
		}, func() float64 { _, m := c.Gaps(); return float64(m) }),
	)
}

// RegisterRetries exports retries, a driver's count of sends tried again
// under an idempotency key (see probe.Retrier), for target as
// imcanary_send_retries_total. It is registered only for a driver that
// retries.
func RegisterRetries(reg prometheus.Registerer, target string, retries func() uint64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "imcanary_send_retries_total",
		Help:        "Sends tried again, under the same idempotency key, after they got no answer or a transient refusal; the server counts each once.",
		ConstLabels: prometheus.Labels{"target": target},
	}, func() float64 { return float64(retries()) }))
}
