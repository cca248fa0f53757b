package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// syncBuf is a log destination written by many goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecretsNeverShown runs the daemon with a known target secret, a
// canary and a soak run, logging at debug level, then looks for the secret
// and the login tokens made from it everywhere imcanary writes: the log,
// /metrics, the status page and API, the soak report in HTML and JSON, and
// every file of the data directory. None may hold them.
func TestSecretsNeverShown(t *testing.T) {
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	secret := "imcanary-test-secret-" + hex.EncodeToString(raw)
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Target.SecretFile = secretFile
	cfg.Canary = config.Canary{Schedule: "@every 1s", Deadline: time.Second, Users: 3, Messages: 1}
	cfg.Soak.Profiles = []config.Profile{{
		Name: "tiny", Schedule: "@every 2s", Users: 6, GroupSize: 3, Rate: 5,
		Ramp: 100 * time.Millisecond, Duration: time.Second, Drain: time.Second,
		Deadline: time.Second, LostAfter: 2 * time.Second,
		Thresholds: config.Thresholds{MaxLoss: 0.01, MaxLate: 0.01, P99Ack: time.Second, P99Delivery: time.Second, MinOnlineRatio: 1},
	}}
	var logs syncBuf
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := New(cfg, log, prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, stop := runDaemon(t, d)
	var st Status
	testwait.For(t, 20*time.Second, "a canary round and a soak run", func() bool {
		getJSON(t, base+"/api/v1/status", &st)
		return len(st.Canary.Rounds) > 0 && len(st.Soak.Runs) > 0
	})
	pages := map[string]string{}
	for _, path := range []string{"/metrics", "/", "/api/v1/status", "/api/v1/runs",
		"/api/v1/runs/" + st.Soak.Runs[0].ID, "/runs/" + st.Soak.Runs[0].ID + "/report.html"} {
		code, body := get(t, base+path)
		if code != 200 {
			t.Errorf("GET %s = %d", path, code)
		}
		pages["GET "+path] = body
	}
	stop()
	pages["the log"] = logs.String()
	err = filepath.WalkDir(cfg.DataDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		pages[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages["the log"]) == 0 || !strings.Contains(pages["GET /metrics"], "imcanary_deliveries_total") {
		t.Fatal("nothing logged or scraped: the search below would prove nothing")
	}

	// The secret, and what a reader could log in with: the tokens of
	// background users.
	needles := map[string]string{"the secret": secret}
	for _, user := range []string{cfg.Population.Prefix + "-u0", cfg.Population.Prefix + "-u1"} {
		needles["the token of "+user] = refserver.Token([]byte(secret), user)
	}
	for where, text := range pages {
		for what, needle := range needles {
			if strings.Contains(text, needle) {
				t.Errorf("%s shows %s", where, what)
			}
		}
	}
	t.Logf("searched %d places, %d bytes, for %d secrets", len(pages), func() (n int) {
		for _, p := range pages {
			n += len(p)
		}
		return n
	}(), len(needles))
}
