package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"

	"github.com/imcanary/imcanary/internal/testwait"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "imcanary test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestWebConfig serves the endpoints with TLS and basic authentication from
// a --web.config.file: plain HTTP is refused, and every endpoint wants the
// password.
func TestWebConfig(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret-pass"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webFile := filepath.Join(dir, "web.yml")
	body := "tls_server_config:\n  cert_file: " + certFile + "\n  key_file: " + keyFile +
		"\nbasic_auth_users:\n  prom: " + string(hash) + "\n"
	if err := os.WriteFile(webFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(testConfig(t), slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry(), WithWebConfig(webFile))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	status := func(scheme, path, user, pass string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, scheme+"://"+d.HTTPAddr()+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testwait.For(t, 10*time.Second, "the TLS server", func() bool { return status("https", "/healthz", "prom", "s3cret-pass") == 200 })
	for _, tc := range []struct {
		scheme, path, user, pass string
		want                     int
	}{
		{"https", "/metrics", "prom", "s3cret-pass", 200},
		{"https", "/metrics", "", "", 401},
		{"https", "/metrics", "prom", "wrong", 401},
		{"https", "/healthz", "", "", 401},
		{"https", "/debug/pprof/", "", "", 401},
		{"https", "/api/v1/status", "other", "s3cret-pass", 401},
		// Plain HTTP to the TLS listener gets a 400 from Go's server,
		// never the page.
		{"http", "/metrics", "prom", "s3cret-pass", 400},
	} {
		if got := status(tc.scheme, tc.path, tc.user, tc.pass); got != tc.want {
			t.Errorf("%s %s as %q: %d, want %d", tc.scheme, tc.path, tc.user, got, tc.want)
		}
	}
}

// A bad web configuration is refused before anything runs, naming the file.
func TestWebConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"missing certificate": "tls_server_config:\n  cert_file: " + dir + "/nope.pem\n  key_file: " + dir + "/nope.key\n",
		"unknown key":         "tls_server_config: {}\nbasic_auth: {}\n",
		"not yaml":            "{{{",
	} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yml")
			if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := New(testConfig(t), slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry(), WithWebConfig(f))
			if err == nil || !strings.Contains(err.Error(), "--web.config.file "+f) {
				t.Errorf("New = %v, want an error naming --web.config.file %s", err, f)
			}
		})
	}
	if _, err := New(testConfig(t), slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry(), WithWebConfig(dir+"/absent.yml")); err == nil {
		t.Error("New with a missing web config file succeeded")
	}
}
