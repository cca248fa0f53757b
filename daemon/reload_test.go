package daemon

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
)

// TestReload reloads a running daemon through POST /-/reload: growing the
// population logs in only the new users, shrinking it logs out only the
// removed ones, a new soak schedule runs without reconnecting anyone, and
// a bad or fixed-key change is refused with the error, the old
// configuration running on and the reload gauge saying so.
func TestReload(t *testing.T) {
	var mu sync.Mutex
	cfg := testConfig(t)
	cfg.Population.Users = 10
	cfg.Population.Rate = 2
	next, loadErr := cfg, error(nil)
	load := func() (config.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		return next, loadErr
	}
	set := func(edit func(*config.Config), err error) {
		mu.Lock()
		defer mu.Unlock()
		edit(&next)
		loadErr = err
	}
	var logs syncBuf
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewPedanticRegistry(), WithReload(load))
	if err != nil {
		t.Fatal(err)
	}
	base, _ := runDaemon(t, d)
	testwait.For(t, 10*time.Second, "10 users ready", func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })

	post := func() (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/-/reload", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}
	const (
		connects    = `imcanary_session_connects_total{source="background"}`
		disconnects = `imcanary_session_disconnects_total{source="background"}`
		online      = `imcanary_sessions_online{source="background"}`
		target      = `imcanary_sessions_wanted{source="background"}`
	)
	reloaded := func(users int, wantConnects, wantDisconnects float64) {
		t.Helper()
		if code, body := post(); code != 200 {
			t.Fatalf("reload to %d users = %d %q, want 200", users, code, body)
		}
		testwait.For(t, 10*time.Second, "the new size online", func() bool {
			m := scrape(t, base)
			return m[online] == float64(users) && m[target] == float64(users) && d.Ready()
		})
		m := scrape(t, base)
		if m[connects] != wantConnects || m[disconnects] != wantDisconnects {
			t.Errorf("at %d users: %v connects, %v disconnects; want %v and %v: only the users added or removed log in or out",
				users, m[connects], m[disconnects], wantConnects, wantDisconnects)
		}
		if m["imcanary_config_last_reload_successful"] != 1 {
			t.Errorf("last_reload_successful = %v after a good reload, want 1", m["imcanary_config_last_reload_successful"])
		}
	}
	stamp0 := scrape(t, base)["imcanary_config_last_reload_success_timestamp_seconds"]
	time.Sleep(1100 * time.Millisecond) // the timestamp has a resolution of a second in the text format's value

	set(func(c *config.Config) { c.Population.Users = 16 }, nil)
	reloaded(16, 16, 0)
	if st := d.Status(); st.Population.Configured != 16 {
		t.Errorf("status: %d users configured, want 16", st.Population.Configured)
	}
	if s := scrape(t, base)["imcanary_config_last_reload_success_timestamp_seconds"]; s <= stamp0 {
		t.Errorf("last_reload_success_timestamp %v, want later than %v", s, stamp0)
	}
	set(func(c *config.Config) { c.Population.Users = 10 }, nil)
	reloaded(10, 16, 6)
	set(func(c *config.Config) { c.Population.Users = 13 }, nil)
	reloaded(13, 19, 6)
	// Cutting through the last block replaces it: its one kept user logs
	// in again, nobody else.
	set(func(c *config.Config) { c.Population.Users = 11 }, nil)
	reloaded(11, 20, 9)

	// A soak schedule added: it runs, and nobody reconnects.
	set(func(c *config.Config) {
		c.Soak.Profiles = []config.Profile{{
			Name: "tiny", Schedule: "@every 1s", Users: 4, GroupSize: 2, Rate: 2,
			Ramp: 100 * time.Millisecond, Duration: time.Second, Drain: time.Second,
			Deadline: time.Second, LostAfter: 2 * time.Second,
			Thresholds: config.Thresholds{MaxLoss: 0.01, MaxLate: 0.01, P99Ack: time.Second, P99Delivery: time.Second, MinOnlineRatio: 1},
		}}
	}, nil)
	if code, body := post(); code != 200 {
		t.Fatalf("reload with a soak schedule = %d %q", code, body)
	}
	var st Status
	testwait.For(t, 15*time.Second, "a soak run of the new profile", func() bool {
		getJSON(t, base+"/api/v1/status", &st)
		return len(st.Soak.Runs) > 0
	})
	if m := scrape(t, base); m[connects] != 20 || m[disconnects] != 9 {
		t.Errorf("after the schedule change: %v connects, %v disconnects, want 20 and 9", m[connects], m[disconnects])
	}

	// Refused: a file that does not load, and a key fixed at start.
	for _, tc := range []struct {
		name string
		edit func(*config.Config)
		err  error
		want string
	}{
		{"bad file", func(*config.Config) {}, errors.New("imcanary.yaml: population.users: \"lots\": not a number"), "population.users: \"lots\""},
		{"fixed key", func(c *config.Config) { c.Population.Rate = 9; c.Population.Users = 30 }, nil, "population.rate changed"},
		{"invalid value", func(c *config.Config) { c.Population.Users = 0 }, nil, "population.users"},
		{"canary turned off", func(c *config.Config) { c.Canary.Schedule = "" }, nil, "turning the canary on or off"},
	} {
		mu.Lock()
		saved := next
		mu.Unlock()
		set(tc.edit, tc.err)
		code, body := post()
		if code != http.StatusInternalServerError || !strings.Contains(body, tc.want) {
			t.Errorf("%s: reload = %d %q, want 500 naming %q", tc.name, code, body, tc.want)
		}
		m := scrape(t, base)
		if m["imcanary_config_last_reload_successful"] != 0 {
			t.Errorf("%s: last_reload_successful = %v, want 0", tc.name, m["imcanary_config_last_reload_successful"])
		}
		if m[online] != 11 || d.Status().Population.Configured != 11 {
			t.Errorf("%s: %v online, %d configured, want the running 11", tc.name, m[online], d.Status().Population.Configured)
		}
		// The text handler quotes the error, escaping its quotes.
		if !strings.Contains(strings.ReplaceAll(logs.String(), `\"`, `"`), tc.want) {
			t.Errorf("%s: the log does not give the error", tc.name)
		}
		set(func(c *config.Config) { *c = saved }, nil)
	}
	if code, _ := post(); code != 200 || scrape(t, base)["imcanary_config_last_reload_successful"] != 1 {
		t.Errorf("a good reload after the refused ones = %d, want 200 and the gauge back to 1", code)
	}

	// Only POST, and the endpoint can be turned off.
	if code, _ := get(t, base+"/-/reload"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /-/reload = %d, want 405", code)
	}
	d.noReloadEndpoint = true
	if code, _ := post(); code != http.StatusForbidden {
		t.Errorf("POST /-/reload with the endpoint off = %d, want 403", code)
	}
}
