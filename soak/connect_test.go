package soak

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// testCert is a self-signed certificate for localhost and 127.0.0.1, and
// the pool that trusts it.
func testCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "imcanary soak test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
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

// serveTLS serves srv over TLS with cert on a loopback listener until the
// test ends, and returns its wss:// URL by the name localhost.
func serveTLS(t *testing.T, srv *refserver.Server, cert tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return "wss://localhost:" + port + "/ws"
}

// TestConnectPath runs a soak over ws:// to an address and over wss:// to
// a name, and checks the report's connect path counts the phases each
// connect went through, as many times as the run's logins: no dns or tls
// for the first, every phase for the second.
func TestConnectPath(t *testing.T) {
	cert, pool := testCert(t)
	tests := []struct {
		name   string
		url    func(*refserver.Server) string
		phases []metrics.Phase
	}{
		{"ws by address", func(srv *refserver.Server) string { return serveTarget(t, srv, 0) },
			[]metrics.Phase{metrics.TCP, metrics.Upgrade, metrics.Login}},
		{"wss by name", func(srv *refserver.Server) string { return serveTLS(t, srv, cert) },
			[]metrics.Phase{metrics.DNS, metrics.TCP, metrics.TLS, metrics.Upgrade, metrics.Login}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := tt.url(newTarget(t, refserver.Options{}))
			drv, err := reference.New(reference.Options{URL: url, Secret: testSecret, Heartbeat: time.Second, TLS: &tls.Config{RootCAs: pool}})
			if err != nil {
				t.Fatal(err)
			}
			r, _ := newTestRunnerWith(t, drv)
			p := testProfile()
			rep, err := r.Run(context.Background(), p, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := rep.ConnectPath
			if c == nil || len(c.Phases) != len(metrics.ConnectPhases) {
				t.Fatalf("ConnectPath = %+v, want every phase", c)
			}
			// Every successful connect went through each phase once;
			// the observer counts them apart, in its own histogram.
			logins := rep.Latency["login"].Count
			if logins < int64(p.Users) || c.Total.Count != logins {
				t.Fatalf("%d logins, total %d: want at least the %d users, and the total the logins", logins, c.Total.Count, p.Users)
			}
			want := map[metrics.Phase]bool{}
			for _, ph := range tt.phases {
				want[ph] = true
			}
			for i, ph := range c.Phases {
				if ph.Phase != metrics.ConnectPhases[i] {
					t.Errorf("phase %d = %s, want %s", i, ph.Phase, metrics.ConnectPhases[i])
				}
				if !want[metrics.Phase(i)] {
					if ph.Count != 0 {
						t.Errorf("%s: %d observed, want none over %s", ph.Phase, ph.Count, url)
					}
					continue
				}
				// A failed connect counts in the phases before its
				// failure; a clean run has none, a loaded machine may.
				if ph.Count < logins || ph.Count > logins+rep.Users.FailedLogins || (metrics.Phase(i) == metrics.Login && ph.Count != logins) {
					t.Errorf("%s: %d observed, want the %d logins (and at most the %d failed attempts)", ph.Phase, ph.Count, logins, rep.Users.FailedLogins)
				}
				if ph.P50 <= 0 || ph.P50 > ph.P99 || ph.Mean <= 0 {
					t.Errorf("%s: p50 %v, p99 %v, mean %v, want 0 < p50 ≤ p99 and a mean", ph.Phase, ph.P50, ph.P99, ph.Mean)
				}
			}
			// The phases make up the connect: their means sum to no
			// more than the total's mean, which the p99 bounds.
			var sum time.Duration
			for _, ph := range c.Phases {
				sum += ph.Mean
			}
			if sum > c.Total.Max {
				t.Errorf("phase means sum to %v, more than the longest connect %v", sum, c.Total.Max)
			}
		})
	}
}

// TestConnectPathRuns: each run's connect path is its own, though the
// histograms are shared by every run of the target.
func TestConnectPathRuns(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	var reps [2]*report.Soak
	for i := range reps {
		rep, err := r.Run(context.Background(), testProfile(), nil)
		if err != nil {
			t.Fatal(err)
		}
		reps[i] = rep
	}
	for i, rep := range reps {
		if got, want := rep.ConnectPath.Phases[metrics.Login].Count, rep.Latency["login"].Count; got != want {
			t.Errorf("run %d: %d logins in the connect path, want the run's own %d", i, got, want)
		}
	}
}
