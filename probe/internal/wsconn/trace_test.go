package wsconn

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
)

// selfSigned makes a certificate for localhost and 127.0.0.1 that
// expires at notAfter, and the pool that trusts it.
func selfSigned(t testing.TB, notAfter time.Time) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "imcanary test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              notAfter,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// referenceTarget serves the reference server on a loopback port, over
// TLS with cert if it is given, and returns its port.
func referenceTarget(t *testing.T, cert *tls.Certificate) string {
	t.Helper()
	srv, err := refserver.New(refserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return port
}

// refLogin is the reference protocol's login, without a secret.
func refLogin(user string) func(c *Conn) error {
	return func(c *Conn) error {
		if err := c.Write([]byte(`{"type":"login","id":"login","user":"` + user + `","token":"open"}`)); err != nil {
			return err
		}
		bp, _, err := c.Read(5 * time.Second)
		if err != nil {
			return err
		}
		defer Release(bp)
		if !bytes.Contains(*bp, []byte(`"login_ok"`)) {
			return &probe.Disconnect{Reason: metrics.ReasonError, Text: string(*bp)}
		}
		return nil
	}
}

// TestConnectPhases logs in to the reference server, over wss:// by name
// and over ws:// by address, twice each, and checks which phases were
// timed, that the second TLS handshake resumed the first's session, and
// that the expiry gauge holds the certificate's NotAfter. With a Poller,
// the wss connection's TLS is made inside wsframe, where the reactor can
// watch it, and must be timed and resumed the same.
func TestConnectPhases(t *testing.T) {
	notAfter := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Second)
	cert, pool := selfSigned(t, notAfter)
	tlsPort := referenceTarget(t, &cert)
	plainPort := referenceTarget(t, nil)

	tests := []struct {
		name, url string
		// phases are those a connect goes through.
		phases []metrics.Phase
		tls    bool
		// watched dials with a Poller, for a connection it can watch.
		watched bool
	}{
		{"wss by name", "wss://localhost:" + tlsPort + "/ws",
			[]metrics.Phase{metrics.DNS, metrics.TCP, metrics.TLS, metrics.Upgrade, metrics.Login}, true, false},
		{"wss by name, watchable", "wss://localhost:" + tlsPort + "/ws",
			[]metrics.Phase{metrics.DNS, metrics.TCP, metrics.TLS, metrics.Upgrade, metrics.Login}, true, true},
		{"ws by address", "ws://127.0.0.1:" + plainPort + "/ws",
			[]metrics.Phase{metrics.TCP, metrics.Upgrade, metrics.Login}, false, false},
	}
	poller, err := netpoll.New()
	if err == nil {
		t.Cleanup(func() { poller.Close() })
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			set := metrics.New(reg).For("t", metrics.SourceBackground)
			s := NewSettings(Settings{URL: tt.url, TLS: &tls.Config{RootCAs: pool}})
			link := probe.Link{Connect: &set.Connect}
			if tt.watched {
				if poller == nil {
					t.Skip("no epoll here: nothing is watched")
				}
				link.Poller = poller
			}
			const connects = 2
			for i := range connects {
				c, err := Open(context.Background(), s, link, "u1", refLogin("u1"))
				if err != nil {
					t.Fatalf("Open(%s) #%d = %v", tt.url, i, err)
				}
				if c.Watchable() != tt.watched {
					t.Errorf("Open(%s) #%d: Watchable() = %v, want %v", tt.url, i, c.Watchable(), tt.watched)
				}
				c.Abort()
			}
			want := map[metrics.Phase]uint64{}
			for _, p := range tt.phases {
				want[p] = connects
			}
			for i, name := range metrics.ConnectPhases {
				if got := metrics.Count(set.Connect.Phase[i]); got != want[metrics.Phase(i)] {
					t.Errorf("phase %s observed %d times, want %d", name, got, want[metrics.Phase(i)])
				}
			}
			fresh, resumed := metrics.Value(set.Connect.Fresh), metrics.Value(set.Connect.Resumed)
			var wantFresh, wantResumed float64
			if tt.tls {
				// The first handshake is full, the second resumes
				// the ticket the first one got.
				wantFresh, wantResumed = 1, 1
			}
			if fresh != wantFresh || resumed != wantResumed {
				t.Errorf("TLS handshakes: %v full, %v resumed, want %v and %v", fresh, resumed, wantFresh, wantResumed)
			}
			expiry := gaugeValues(t, reg, "imcanary_tls_earliest_cert_expiry_timestamp_seconds")
			switch {
			case tt.tls && (len(expiry) != 1 || expiry[0] != float64(notAfter.Unix())):
				t.Errorf("expiry gauge = %v, want [%d] (the certificate's NotAfter)", expiry, notAfter.Unix())
			case !tt.tls && len(expiry) != 0:
				t.Errorf("expiry gauge = %v without TLS, want no series", expiry)
			}
		})
	}
}

// TestConnectPhasesUntraced checks a link without series (provisioning)
// dials as before and records nothing.
func TestConnectPhasesUntraced(t *testing.T) {
	port := referenceTarget(t, nil)
	reg := prometheus.NewPedanticRegistry()
	set := metrics.New(reg).For("t", metrics.SourceBackground)
	c, err := Open(context.Background(), NewSettings(Settings{URL: "ws://127.0.0.1:" + port + "/ws"}), probe.Link{}, "u1", refLogin("u1"))
	if err != nil {
		t.Fatal(err)
	}
	c.Abort()
	for i, name := range metrics.ConnectPhases {
		if got := metrics.Count(set.Connect.Phase[i]); got != 0 {
			t.Errorf("phase %s observed %d times without Link.Connect, want 0", name, got)
		}
	}
}

func gaugeValues(t *testing.T, reg *prometheus.Registry, name string) []float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				out = append(out, m.GetGauge().GetValue())
			}
		}
	}
	return out
}

// TestEarliestExpiry checks which certificate's expiry counts.
func TestEarliestExpiry(t *testing.T) {
	at := func(days int) *x509.Certificate {
		return &x509.Certificate{NotAfter: time.Unix(0, 0).AddDate(0, 0, days)}
	}
	leaf, inter, root, oldCross := at(90), at(400), at(3000), at(10)
	tests := []struct {
		name string
		cs   tls.ConnectionState
		want *x509.Certificate
	}{
		{"one verified chain", tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf, inter}, VerifiedChains: [][]*x509.Certificate{{leaf, inter, root}}}, leaf},
		// An expired cross-sign the server still sends, that the
		// chain verification did not need: no alarm.
		{"unused cross-sign", tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf, inter, oldCross},
			VerifiedChains: [][]*x509.Certificate{{leaf, inter, oldCross}, {leaf, inter, root}}}, leaf},
		{"unverified", tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf, inter, oldCross}}, oldCross},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := earliestExpiry(&tt.cs); !got.Equal(tt.want.NotAfter) {
				t.Errorf("earliestExpiry() = %v, want %v", got, tt.want.NotAfter)
			}
		})
	}
}

// BenchmarkDial compares a connect timed phase by phase with one that is
// not (Link.Connect nil: the path before phases were timed), over ws://
// and wss:// on loopback.
func BenchmarkDial(b *testing.B) {
	cert, pool := selfSigned(b, time.Now().Add(24*time.Hour))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_, _, _ = c.ReadMessage()
	})
	plain := httptest.NewServer(h)
	defer plain.Close()
	secure := httptest.NewUnstartedServer(h)
	secure.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	secure.StartTLS()
	defer secure.Close()
	set := metrics.New(prometheus.NewRegistry()).For("t", metrics.SourceBackground)
	for _, u := range []string{"ws" + strings.TrimPrefix(plain.URL, "http"), "wss" + strings.TrimPrefix(secure.URL, "https")} {
		s := NewSettings(Settings{URL: u, TLS: &tls.Config{RootCAs: pool}})
		for _, traced := range []bool{false, true} {
			link := probe.Link{}
			name := strings.SplitN(u, ":", 2)[0] + "/untraced"
			if traced {
				link.Connect = &set.Connect
				name = strings.SplitN(u, ":", 2)[0] + "/traced"
			}
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					c, err := Dial(context.Background(), s, link)
					if err != nil {
						b.Fatal(err)
					}
					c.Abort()
				}
			})
		}
	}
}

// BenchmarkTrace measures what timing the phases adds to one connect,
// apart from the network: the trace's context and hooks, the hooks'
// calls as a wss:// dial by name makes them, and the observations.
func BenchmarkTrace(b *testing.B) {
	cert, _ := selfSigned(b, time.Now().Add(24*time.Hour))
	cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert.Leaf}, VerifiedChains: [][]*x509.Certificate{{cert.Leaf}}}
	set := metrics.New(prometheus.NewRegistry()).For("t", metrics.SourceBackground)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		tr := &connectTrace{start: time.Now()}
		h := httptrace.ContextClientTrace(httptrace.WithClientTrace(ctx, tr.hooks()))
		h.DNSStart(httptrace.DNSStartInfo{})
		h.DNSDone(httptrace.DNSDoneInfo{})
		h.GotConn(httptrace.GotConnInfo{})
		h.TLSHandshakeStart()
		h.TLSHandshakeDone(cs, nil)
		tr.record(&set.Connect, time.Now())
		set.Connect.Phase[metrics.Login].Observe(0.001)
	}
}
