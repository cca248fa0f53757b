package centrifugo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// The wss:// test starts a Centrifugo of its own, over TLS with a
// certificate it makes, from the binary
//
//	IMCANARYTEST_CENTRIFUGO_BIN  .ci/centrifugo.sh bin prints its path
//
// rather than using the shared instances, which serve ws:// only.

// centrifugoBinary returns $IMCANARYTEST_CENTRIFUGO_BIN. It skips the test
// where it is unset, except in CI, where a missing binary is a broken
// .ci/run.
func centrifugoBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("IMCANARYTEST_CENTRIFUGO_BIN")
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("IMCANARYTEST_CENTRIFUGO_BIN unset: .ci/run must export it (.ci/centrifugo.sh bin)")
		}
		t.Skip("IMCANARYTEST_CENTRIFUGO_BIN unset: no Centrifugo binary to start over TLS " +
			"(.ci/centrifugo.sh build builds one, .ci/centrifugo.sh bin prints its path)")
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("IMCANARYTEST_CENTRIFUGO_BIN=%s: %v", bin, err)
	}
	return path
}

// testPKI is a CA of the test's own and a server certificate it signed
// for localhost and 127.0.0.1, in PEM files for the server.
type testPKI struct {
	roots             *x509.CertPool
	leaf              *x509.Certificate
	certFile, keyFile string
}

// newTestPKI makes the CA and a server certificate that expires at
// notAfter. The CA outlives the server certificate, so that the chain's
// earliest expiry is the server certificate's.
func newTestPKI(t *testing.T, notAfter time.Time) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "imcanary test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              notAfter.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := &testPKI{roots: x509.NewCertPool(), leaf: leaf,
		certFile: filepath.Join(dir, "server.crt"), keyFile: filepath.Join(dir, "server.key")}
	p.roots.AddCert(ca)
	if err := os.WriteFile(p.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startTLSCentrifugo runs bin on a loopback port over TLS with pki's
// server certificate and the token secret, and returns the port once its
// health endpoint answers. It is killed and waited for with the test.
func startTLSCentrifugo(t *testing.T, bin string, pki *testPKI, secret string) string {
	t.Helper()
	// The port is found free and then handed over: another process may
	// take it in between, which the start then reports. The kernel's
	// ephemeral range is far from CI's 18000-18999.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	portN, _ := strconv.Atoi(port)
	// As .ci/centrifugo.sh's config, loopback only, nothing sent out, no
	// HTTP API, but TLS on the one port, and only the group namespace
	// the test's logins subscribe in.
	cfg := map[string]any{
		"http_server": map[string]any{
			"address": "127.0.0.1", "port": portN,
			"tls": map[string]any{"enabled": true, "cert_pem": pki.certFile, "key_pem": pki.keyFile},
		},
		"log":         map[string]any{"level": "warn"},
		"health":      map[string]any{"enabled": true},
		"usage_stats": map[string]any{"disabled": true},
		"http_api":    map[string]any{"disabled": true},
		"client":      map[string]any{"token": map[string]any{"hmac_secret_key": secret}},
		"channel": map[string]any{"namespaces": []any{
			map[string]any{"name": "chat", "allow_subscribe_for_client": true, "allow_publish_for_subscriber": true},
		}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// A file, not a buffer: the log can be read while the server runs.
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	serverLog := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd := exec.Command(bin, "--config", cfgFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var wg sync.WaitGroup
	// Exits when the server does: at the cleanup's kill, or earlier if
	// it fails to start.
	wg.Go(func() { _ = cmd.Wait(); close(exited) })
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		wg.Wait()
		if t.Failed() {
			t.Logf("centrifugo's log:\n%s", serverLog())
		}
	})
	// The readiness check trusts the test's CA too, through a client of
	// its own: its handshakes are no session's and land in no series.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.roots}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	url := "https://127.0.0.1:" + port + "/health"
	// Ready when /health answers 200; the loop ends with the server or
	// the test, not after a guessed time.
	for {
		select {
		case <-exited:
			t.Fatalf("centrifugo exited before it was ready:\n%s", serverLog())
		case <-t.Context().Done():
			t.Fatal("test ended before centrifugo was ready")
		default:
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return port
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTLSConnectPhases logs two users in to a real Centrifugo over
// wss://localhost, one after the other, and checks every phase of both
// connects was timed (dns, for the name, and tls among them), that the
// first TLS handshake was full and the second resumed the ticket the
// first got, and that the expiry gauge holds the server certificate's
// NotAfter.
func TestTLSConnectPhases(t *testing.T) {
	bin := centrifugoBinary(t)
	notAfter := time.Now().Add(90 * 24 * time.Hour).Truncate(time.Second)
	pki := newTestPKI(t, notAfter)
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	secret := hex.EncodeToString(raw)
	port := startTLSCentrifugo(t, bin, pki, secret)

	url := "wss://localhost:" + port + "/connection/websocket"
	d, err := New(Config{}, Options{URL: url, Secret: []byte(secret), TLS: &tls.Config{RootCAs: pki.roots}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	set := metrics.New(reg).For("test", metrics.SourceBackground)
	users := []string{"tls-a", "tls-b"}
	// A group of both, so that each login subscribes as a population's
	// does, and the login phase spans the subscription.
	ctx := context.Background()
	if err := d.Provision(ctx, probe.Plan{Users: users, Groups: []probe.Group{{Name: "g", Members: users}}}); err != nil {
		t.Fatal(err)
	}
	for i, u := range users {
		s, err := d.Connect(ctx, u, probe.Device{Link: probe.Link{Connect: &set.Connect}})
		if err != nil {
			t.Fatalf("Connect(%s) over %s = %v", u, url, err)
		}
		s.(probe.Aborter).Abort()
		// The first connect has no ticket yet; the second has the one
		// the first got, from a server that issues them.
		wantFresh, wantResumed := 1.0, float64(i)
		if fresh, resumed := metrics.Value(set.Connect.Fresh), metrics.Value(set.Connect.Resumed); fresh != wantFresh || resumed != wantResumed {
			t.Errorf("after connect %d: TLS handshakes %v full, %v resumed, want %v and %v", i+1, fresh, resumed, wantFresh, wantResumed)
		}
	}
	for i, name := range metrics.ConnectPhases {
		if got := metrics.Count(set.Connect.Phase[i]); got != uint64(len(users)) {
			t.Errorf("phase %s observed %d times, want %d (once a connect)", name, got, len(users))
		}
	}
	expiry := gaugeSeries(t, reg, "imcanary_tls_earliest_cert_expiry_timestamp_seconds")
	want := float64(pki.leaf.NotAfter.Unix())
	if got, ok := expiry["test"]; len(expiry) != 1 || !ok || got != want {
		t.Errorf("expiry gauge = %.0f (%d series), want one series of target test at %.0f (the server certificate's NotAfter, %v)",
			got, len(expiry), want, pki.leaf.NotAfter)
	}
}

// gaugeSeries returns the values of gauge name in reg by their target.
func gaugeSeries(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}
