package wsconn

import (
	"crypto/tls"
	"crypto/x509"
	"net/http/httptrace"
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// sessionCacheSize bounds the TLS sessions a Settings keeps for
// resumption. The cache is keyed by server name, so one target needs one
// entry; the margin covers a URL whose name resolves to a few servers
// that each issue their own tickets, and costs a few KiB at most.
const sessionCacheSize = 64

// connectTrace collects the instants of one dial from httptrace's hooks:
// net.Dialer calls the DNS ones, gorilla's Dialer the connection and TLS
// ones, all on the dialing goroutine, in order, before DialContext
// returns.
type connectTrace struct {
	start, dnsStart, dnsDone, conn, tlsStart, tlsDone time.Time
	dnsOK, tlsOK                                      bool
	tls                                               tls.ConnectionState
}

// hooks returns the ClientTrace that fills t.
func (t *connectTrace) hooks() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		DNSStart: func(httptrace.DNSStartInfo) { t.dnsStart = time.Now() },
		DNSDone: func(i httptrace.DNSDoneInfo) {
			t.dnsDone, t.dnsOK = time.Now(), i.Err == nil
		},
		// A watched wss connection's dial tells of the connection
		// before its TLS handshake, and gorilla again after it: the
		// first is when TCP connected.
		GotConn: func(httptrace.GotConnInfo) {
			if t.conn.IsZero() {
				t.conn = time.Now()
			}
		},
		TLSHandshakeStart: func() { t.tlsStart = time.Now() },
		TLSHandshakeDone: func(cs tls.ConnectionState, err error) {
			t.tlsDone, t.tlsOK, t.tls = time.Now(), err == nil, cs
		},
	}
}

// record observes the phases of a dial whose upgrade completed at end.
func (t *connectTrace) record(c *metrics.ConnectSet, end time.Time) {
	// The TCP phase starts once the name is resolved, or at once for
	// an IP literal, and spans every address the dialer tried.
	tcpStart := t.start
	if !t.dnsStart.IsZero() && t.dnsOK {
		c.Phase[metrics.DNS].Observe(t.dnsDone.Sub(t.dnsStart).Seconds())
		tcpStart = t.dnsDone
	}
	c.Phase[metrics.TCP].Observe(t.conn.Sub(tcpStart).Seconds())
	upStart := t.conn
	if t.tlsOK {
		c.Phase[metrics.TLS].Observe(t.tlsDone.Sub(t.tlsStart).Seconds())
		c.Handshake(t.tls.DidResume, earliestExpiry(&t.tls))
		upStart = t.tlsDone
	}
	c.Phase[metrics.Upgrade].Observe(end.Sub(upStart).Seconds())
}

// earliestExpiry returns when the certificates the handshake relied on
// start to expire: of each verified chain its earliest NotAfter, and of
// those the latest, since verification fails only once every chain has
// an expired certificate. A server that also sends an expired cross-sign
// that no verified chain uses (the 2021 Let's Encrypt root change) is
// then no false alarm. Without verified chains (InsecureSkipVerify) it
// is the earliest NotAfter of the peer's certificates, as
// blackbox_exporter's probe_ssl_earliest_cert_expiry is. The zero Time
// if there are none.
func earliestExpiry(cs *tls.ConnectionState) time.Time {
	var best time.Time
	for _, chain := range cs.VerifiedChains {
		if e := earliest(chain); e.After(best) {
			best = e
		}
	}
	if best.IsZero() {
		best = earliest(cs.PeerCertificates)
	}
	return best
}

func earliest(certs []*x509.Certificate) time.Time {
	var e time.Time
	for _, c := range certs {
		if e.IsZero() || c.NotAfter.Before(e) {
			e = c.NotAfter
		}
	}
	return e
}
