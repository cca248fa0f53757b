package daemon

import (
	"bufio"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// latencyExemplar matches an exemplar on a delivery latency bucket of the
// OpenMetrics exposition, e.g.
// imcanary_delivery_latency_seconds_bucket{…,le="2.0"} 7 # {sender="…",seq="…",stream="…"} 1.5 1.7e+09
var latencyExemplar = regexp.MustCompile(`^imcanary_delivery_latency_seconds_bucket\{.*\} \S+ # \{(.*)\} (\S+) \S+$`)

type scrapedExemplar struct {
	labels map[string]string
	value  float64
}

// openMetrics scrapes base's /metrics as Prometheus does with exemplar
// storage on, and returns the delivery latency exemplars.
func openMetrics(t *testing.T, base string) []scrapedExemplar {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("/metrics asked for OpenMetrics answered Content-Type %q", ct)
	}
	var out []scrapedExemplar
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := latencyExemplar.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		e := scrapedExemplar{labels: map[string]string{}}
		for _, kv := range strings.Split(m[1], ",") {
			k, v, _ := strings.Cut(kv, "=")
			e.labels[k] = strings.Trim(v, `"`)
		}
		e.value, _ = strconv.ParseFloat(m[2], 64)
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOpenMetricsExemplars scrapes /metrics in OpenMetrics: fast
// deliveries carry no exemplar; once the target delays every delivery by
// 1.5 s, the delivery latency histogram shows one naming the sender,
// stream and seq of a delayed message. The classic text format is still
// served to a scraper that does not ask for OpenMetrics.
func TestOpenMetricsExemplars(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("exemplar-secret")
	srv, _ := serveTarget(t, ln, secret)
	cfg := testConfig(t)
	cfg.Target.URL = "ws://" + ln.Addr().String() + "/ws"
	cfg.Canary.Schedule = ""
	cfg.Target.SecretFile = filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(cfg.Target.SecretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, _ := runDaemon(t, d)
	testwait.For(t, 10*time.Second, "deliveries on /metrics", func() bool {
		return scrape(t, base)["imcanary_deliveries_total"] >= 50
	})
	// The slow threshold is min(deadline, 1 s): 1 s here.
	for _, e := range openMetrics(t, base) {
		if e.value <= 1 {
			t.Errorf("exemplar %v on a delivery of %v s, want none under 1 s", e.labels, e.value)
		}
	}

	srv.SetFaults(refserver.Faults{Delay: 1500 * time.Millisecond})
	user := regexp.MustCompile(`^` + regexp.QuoteMeta(cfg.Population.Prefix) + `-\S*u\d+$`)
	var found []scrapedExemplar
	testwait.For(t, 20*time.Second, "an exemplar of a delayed delivery", func() bool {
		found = nil
		for _, e := range openMetrics(t, base) {
			if e.value >= 1.5 {
				found = append(found, e)
			}
		}
		return len(found) > 0
	})
	for _, e := range found {
		seq, err := strconv.ParseUint(e.labels["seq"], 10, 64)
		st := e.labels["stream"]
		if !user.MatchString(e.labels["sender"]) || err != nil || seq == 0 || !(strings.HasPrefix(st, "d.") || strings.HasPrefix(st, "g.")) || len(e.labels) != 3 {
			t.Errorf("exemplar %v (%v s), want the sender, stream and seq of a population message", e.labels, e.value)
		}
	}
	t.Logf("exemplars of delayed deliveries: %v", found)
	// The text format, for scrapers that do not ask for OpenMetrics.
	if m := scrape(t, base); m["imcanary_deliveries_total"] == 0 {
		t.Errorf("text scrape: no deliveries")
	}
}
