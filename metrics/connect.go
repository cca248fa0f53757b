package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Phases of one connect, in the order they happen: where the time of a
// login goes. A phase that does not happen (no DNS for an IP literal, no
// TLS for ws://) is not observed.
const (
	PhaseDNS     = "dns"     // resolving the target's host name
	PhaseTCP     = "tcp"     // TCP connect, every address tried
	PhaseTLS     = "tls"     // the TLS handshake (wss://)
	PhaseUpgrade = "upgrade" // the WebSocket upgrade: request to 101
	PhaseLogin   = "login"   // the protocol's login, after the upgrade
)

// ConnectPhases lists every value of the phase label of
// imcanary_connect_duration_seconds.
var ConnectPhases = [...]string{DNS: PhaseDNS, TCP: PhaseTCP, TLS: PhaseTLS, Upgrade: PhaseUpgrade, Login: PhaseLogin}

// Phase indexes ConnectSet.Phase.
type Phase int

// The phases of a connect, in the order of ConnectPhases.
const (
	DNS Phase = iota
	TCP
	TLS
	Upgrade
	Login
)

// ConnectBuckets resolve 100 µs (a TCP connect on loopback) to 10 s (the
// default dial timeout, which bounds every phase).
var ConnectBuckets = []float64{
	0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
	0.1, 0.2, 0.5, 1, 2, 5, 10,
}

// newConnect creates the connect path's series.
func (m *Metrics) newConnect(f promauto.Factory) {
	m.ConnectDuration = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_connect_duration_seconds",
		Help:    "Time of each phase of a session's connect that completed: dns, tcp (connect), tls (handshake), upgrade (WebSocket request to 101), login (the protocol's login after the upgrade). A phase that did not happen, or failed, is not observed; failures are counted in imcanary_session_connect_failures_total.",
		Buckets: ConnectBuckets,
	}, []string{"target", "source", "phase"})
	m.TLSHandshakes = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_tls_handshakes_total",
		Help: "TLS handshakes of sessions' connects that completed, by resumed (true: an abbreviated handshake resuming an earlier session's ticket).",
	}, []string{"target", "source", "resumed"})
	m.TLSCertExpiry = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_tls_earliest_cert_expiry_timestamp_seconds",
		Help: "Unix time the earliest certificate of the chain the most recent TLS handshake to the target verified expires (blackbox_exporter's probe_ssl_earliest_cert_expiry); of several verified chains, the one that lasts longest. Absent for a target never reached over TLS.",
	}, []string{"target"})
}

// ConnectSet is the connect-path series of one (target, source) pair.
// Its methods are safe for concurrent use.
type ConnectSet struct {
	// Phase times each phase, indexed by Phase.
	Phase [len(ConnectPhases)]prometheus.Observer
	// Fresh and Resumed count full and resumed TLS handshakes.
	Fresh, Resumed prometheus.Counter
	expiry         *prometheus.GaugeVec
	target         string
}

func (m *Metrics) connectFor(target, source string) ConnectSet {
	s := ConnectSet{
		Fresh:   m.TLSHandshakes.WithLabelValues(target, source, "false"),
		Resumed: m.TLSHandshakes.WithLabelValues(target, source, "true"),
		expiry:  m.TLSCertExpiry,
		target:  target,
	}
	for i, p := range ConnectPhases {
		s.Phase[i] = m.ConnectDuration.WithLabelValues(target, source, p)
	}
	return s
}

// Handshake records a completed TLS handshake: whether it resumed, and
// notAfter, the earliest expiry of the chain it verified. The expiry
// series is made here, not at zero: a zero would read as a certificate
// that expired in 1970 to an expiry alert.
func (s *ConnectSet) Handshake(resumed bool, notAfter time.Time) {
	if resumed {
		s.Resumed.Inc()
	} else {
		s.Fresh.Inc()
	}
	if !notAfter.IsZero() {
		s.expiry.WithLabelValues(s.target).Set(float64(notAfter.Unix()))
	}
}
