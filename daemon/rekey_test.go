package daemon

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
)

// postReload asks the daemon at base to reload and returns the answer.
func postReload(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/-/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestReloadRotatedSecret runs the daemon against a reference server that
// accepts only the new secret while the secret file still holds the old
// one: every login is refused. A reload with the file unchanged says
// nothing changed, and the logins stay refused; once the file holds the
// new secret, the reload says the secret changed (never what it is), and
// the users log in with it.
func TestReloadRotatedSecret(t *testing.T) {
	const oldSecret, newSecret = "imcanary-old-secret-5f1c", "imcanary-new-secret-9a3e"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveTarget(t, ln, []byte(newSecret))
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(oldSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Target.URL = "ws://" + ln.Addr().String() + "/ws"
	cfg.Target.SecretFile = secretFile
	cfg.Canary.Schedule = ""
	cfg.Population.Users = 4
	cfg.Population.Backoff = config.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}
	load := func() (config.Config, error) { return cfg, nil }
	var logs syncBuf
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewPedanticRegistry(), WithReload(load))
	if err != nil {
		t.Fatal(err)
	}
	base, _ := runDaemon(t, d)
	const (
		refused = `imcanary_session_connect_failures_total{reason="unauthorized"}`
		online  = `imcanary_sessions_online{source="background"}`
	)
	testwait.For(t, 10*time.Second, "logins refused with the old secret", func() bool { return scrape(t, base)[refused] >= 4 })

	// Nothing changed: the reload must not claim a new secret.
	if code, body := postReload(t, base); code != 200 || body != "configuration reloaded: nothing changed" {
		t.Errorf("reload with the secret file unchanged = %d %q, want 200 %q", code, body, "configuration reloaded: nothing changed")
	}
	before := scrape(t, base)[refused]
	testwait.For(t, 10*time.Second, "more refused logins", func() bool { return scrape(t, base)[refused] > before })
	if m := scrape(t, base); m[online] != 0 {
		t.Errorf("%s = %v with the old secret still in use, want 0", online, m[online])
	}
	if strings.Contains(logs.String(), "target secret changed") {
		t.Errorf("a reload with the secret file unchanged logged a secret change:\n%s", logs.String())
	}

	// Rotated.
	if err := os.WriteFile(secretFile, []byte(newSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, body := postReload(t, base)
	if code != 200 || !strings.Contains(body, "changed "+secretChanged) {
		t.Errorf("reload after rotating the secret file = %d %q, want 200 naming %q", code, body, secretChanged)
	}
	testwait.For(t, 10*time.Second, "every user logged in with the new secret", func() bool {
		return scrape(t, base)[online] == 4 && d.Ready()
	})
	if !strings.Contains(logs.String(), "target secret changed") || !strings.Contains(logs.String(), secretFile) {
		t.Errorf("logs after the rotation lack a line saying the secret in %s changed:\n%s", secretFile, logs.String())
	}

	// Unchanged again: no change claimed a second time.
	if code, body := postReload(t, base); code != 200 || body != "configuration reloaded: nothing changed" {
		t.Errorf("second reload with the new secret in place = %d %q, want 200 %q", code, body, "configuration reloaded: nothing changed")
	}
	if n := strings.Count(logs.String(), "target secret changed"); n != 1 {
		t.Errorf("logs say the target secret changed %d times, want once", n)
	}
	for _, s := range []string{oldSecret, newSecret} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the log holds a target secret")
		}
	}
}

// TestReloadSecretRefused rotates the secret file of a daemon running its
// reference server in-process, which keeps the secret it started with:
// the reload is refused, naming the file and never the secret, and the
// running configuration stays.
func TestReloadSecretRefused(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("imcanary-first-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Target.SecretFile = secretFile
	cfg.Canary.Schedule = ""
	cfg.Population.Users = 2
	load := func() (config.Config, error) { return cfg, nil }
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry(), WithReload(load))
	if err != nil {
		t.Fatal(err)
	}
	base, _ := runDaemon(t, d)
	if err := os.WriteFile(secretFile, []byte("imcanary-second-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, body := postReload(t, base)
	if code != 500 || !strings.Contains(body, "target.secret_file "+secretFile+" changed") || !strings.Contains(body, "restart") ||
		strings.Contains(body, "second-secret") {
		t.Errorf("reload of a rotated secret with the reference server in-process = %d %q, want 500 naming the file and a restart", code, body)
	}
	if v := scrape(t, base)["imcanary_config_last_reload_successful"]; v != 0 {
		t.Errorf("last_reload_successful = %v after a refused reload, want 0", v)
	}
	if string(d.target.Secret) != "imcanary-first-secret" {
		t.Errorf("the refused reload changed the secret in use")
	}
}
