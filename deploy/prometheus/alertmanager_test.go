package rules

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const alertmanagerFile = "../alertmanager/alertmanager.yml"

func TestAlertmanagerCheckConfig(t *testing.T) {
	amtool := lookPath(t, "amtool")
	if b, err := exec.Command(amtool, "check-config", alertmanagerFile).CombinedOutput(); err != nil {
		t.Fatalf("amtool check-config %s: %v\n%s", alertmanagerFile, err, b)
	}
}

// alertmanagerConfig is the part of the configuration checked here.
type alertmanagerConfig struct {
	Route struct {
		Routes []struct {
			Matchers []string `yaml:"matchers"`
			Receiver string   `yaml:"receiver"`
		} `yaml:"routes"`
	} `yaml:"route"`
	InhibitRules []struct {
		SourceMatchers []string `yaml:"source_matchers"`
		TargetMatchers []string `yaml:"target_matchers"`
		Equal          []string `yaml:"equal"`
	} `yaml:"inhibit_rules"`
}

// matcherRE parses the matcher forms the configuration uses,
// name="value" and name=~"regexp".
var matcherRE = regexp.MustCompile(`^(\w+)(=~?)"([^"]*)"$`)

// matchesAll reports whether a label set satisfies every matcher, as
// Alertmanager does: an absent label is "", a regexp matches the whole
// value.
func matchesAll(t *testing.T, ls map[string]string, ms []string) bool {
	t.Helper()
	for _, m := range ms {
		sub := matcherRE.FindStringSubmatch(m)
		if sub == nil {
			t.Fatalf("matcher %q: only name=\"value\" and name=~\"regexp\" are understood here", m)
		}
		switch sub[2] {
		case "=":
			if ls[sub[1]] != sub[3] {
				return false
			}
		case "=~":
			re, err := regexp.Compile("^(?:" + sub[3] + ")$")
			if err != nil {
				t.Fatalf("matcher %q: %v", m, err)
			}
			if !re.MatchString(ls[sub[1]]) {
				return false
			}
		}
	}
	return true
}

// TestAlertmanagerMatchesRules checks the configuration against the
// alerts as they come out of Prometheus, taking their label sets from the
// promtool tests' expectations (which promtool has checked against the
// real rules): every severity has a route, and every inhibit rule's source
// and targets exist and carry every label it requires equal (an absent
// label is not equal to a present one, so a missing label silently
// disables the inhibition).
func TestAlertmanagerMatchesRules(t *testing.T) {
	b, err := os.ReadFile(alertmanagerFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg alertmanagerConfig
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}

	fired := firedLabelSets(t)
	matches := func(ls map[string]string, ms []string) bool { return matchesAll(t, ls, ms) }

	for _, r := range loadRules(t).alerts() {
		routed := slices.ContainsFunc(cfg.Route.Routes, func(rt struct {
			Matchers []string `yaml:"matchers"`
			Receiver string   `yaml:"receiver"`
		}) bool {
			return matches(r.Labels, rt.Matchers)
		})
		if !routed {
			t.Errorf("%s (severity %s): no route matches it", r.Alert, r.Labels["severity"])
		}
	}

	for i, ir := range cfg.InhibitRules {
		var sources, targets int
		for _, ls := range fired {
			src, tgt := matches(ls, ir.SourceMatchers), matches(ls, ir.TargetMatchers)
			if src {
				sources++
			}
			if tgt {
				targets++
			}
			if !src && !tgt {
				continue
			}
			for _, l := range ir.Equal {
				if _, ok := ls[l]; !ok {
					t.Errorf("inhibit rule %d: equal %v, but %v lacks %s", i, ir.Equal, ls, l)
				}
			}
		}
		if sources == 0 || targets == 0 {
			t.Errorf("inhibit rule %d: %d source and %d target alerts in the promtool tests, want some of each", i, sources, targets)
		}
	}
}

// firedLabelSets returns every label set an alert was seen firing with in
// the promtool tests, alertname included: what Prometheus sends
// Alertmanager, as promtool has checked against the real rules.
func firedLabelSets(t *testing.T) []map[string]string {
	t.Helper()
	var fired []map[string]string
	tests := loadTests(t)
	for _, f := range slices.Sorted(maps.Keys(tests)) {
		for _, tc := range tests[f].Tests {
			for _, a := range tc.AlertRuleTest {
				for _, e := range a.ExpAlerts {
					ls := map[string]string{"alertname": a.Alertname}
					maps.Copy(ls, e.ExpLabels)
					fired = append(fired, ls)
				}
			}
		}
	}
	return fired
}

// lookAlertmanager finds the Alertmanager binary: Debian names it
// prometheus-alertmanager, upstream alertmanager.
func lookAlertmanager(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("alertmanager"); err == nil {
		return p
	}
	return lookPath(t, "prometheus-alertmanager")
}

// amAlert is an alert as amtool alert query -o json shows it.
type amAlert struct {
	Labels map[string]string `json:"labels"`
	Status struct {
		State       string   `json:"state"`
		InhibitedBy []string `json:"inhibitedBy"`
	} `json:"status"`
}

// TestAlertmanagerInhibition runs a real Alertmanager on loopback with
// alertmanager.yml, fires alerts at it with amtool as Prometheus would
// send them (label sets from the promtool tests, each case moved to a
// target of its own), and asks amtool which it holds back: one outage must
// page once, and nothing may be held back that names a cause of its own.
func TestAlertmanagerInhibition(t *testing.T) {
	amtool := lookPath(t, "amtool")
	alertmanager := lookAlertmanager(t)
	if testing.Short() {
		t.Skip("runs Alertmanager (not with -short)")
	}

	// Each alert is an alertname and labels its promtool label set must
	// have, where the name alone is ambiguous.
	cases := []struct {
		name       string
		fire, held []string
	}{
		{
			// Nothing can log in: the unreachable page names the
			// cause; the share of failures, the population, the
			// canary and the retries follow from it. The credential
			// ticket and a burn of messages already sent do not.
			name: "target unreachable",
			fire: []string{"ImcanaryTargetUnreachable", "ImcanaryConnectFailuresHigh", "ImcanaryPopulationShort", "ImcanaryCanaryFailing", "ImcanaryReconnectStorm", "ImcanaryAuthenticationFailures", "ImcanaryMessagesLostBudgetBurn severity=page long=1h"},
			held: []string{"ImcanaryConnectFailuresHigh", "ImcanaryPopulationShort", "ImcanaryCanaryFailing", "ImcanaryReconnectStorm"},
		},
		{
			name: "some logins fail",
			fire: []string{"ImcanaryConnectFailuresHigh", "ImcanaryPopulationShort", "ImcanaryCanaryFailing", "ImcanaryReconnectStorm"},
			held: []string{"ImcanaryPopulationShort", "ImcanaryCanaryFailing", "ImcanaryReconnectStorm"},
		},
		{
			// Logins work but sessions do not stay: every page is its
			// own, whatever other targets do meanwhile.
			name: "sessions dropped",
			fire: []string{"ImcanaryPopulationShort", "ImcanaryReconnectStorm", "ImcanaryCanaryFailing", "ImcanaryAuthenticationFailures"},
		},
		{
			// Saturation holds back the alerts that judge the server
			// by imcanary's timing (slo="true"), and nothing else:
			// not what the server refused, not imcanary's own state.
			name: "prober saturated",
			fire: []string{"ImcanaryProberSaturated", "ImcanaryMessagesLostBudgetBurn severity=page long=1h", "ImcanaryRealtimeBudgetBurn severity=ticket long=6h", "ImcanaryLatencyBudgetBurn severity=page long=1h", "ImcanaryCanaryFailing", "ImcanaryTargetUnreachable", "ImcanaryCanaryStopped", "ImcanaryDuplicateDeliveries"},
			held: []string{"ImcanaryMessagesLostBudgetBurn severity=page long=1h", "ImcanaryRealtimeBudgetBurn severity=ticket long=6h", "ImcanaryLatencyBudgetBurn severity=page long=1h", "ImcanaryCanaryFailing"},
		},
		{
			// Saturation alone: a real-time page (pushes dropped,
			// messages recovered) is held back like the others.
			name: "prober saturated, real-time page",
			fire: []string{"ImcanaryProberSaturated", "ImcanaryRealtimeBudgetBurn severity=page long=1h"},
			held: []string{"ImcanaryRealtimeBudgetBurn severity=page long=1h"},
		},
		{
			name: "page and ticket of one budget",
			fire: []string{"ImcanaryMessagesLostBudgetBurn severity=page long=6h", "ImcanaryMessagesLostBudgetBurn severity=ticket"},
			held: []string{"ImcanaryMessagesLostBudgetBurn severity=ticket"},
		},
		{
			// Real-time completeness pages only at 1h/5m; both its
			// tickets are redundant beside that page.
			name: "real-time page and tickets",
			fire: []string{"ImcanaryRealtimeBudgetBurn severity=page long=1h", "ImcanaryRealtimeBudgetBurn severity=ticket long=6h", "ImcanaryRealtimeBudgetBurn severity=ticket long=3d"},
			held: []string{"ImcanaryRealtimeBudgetBurn severity=ticket long=6h", "ImcanaryRealtimeBudgetBurn severity=ticket long=3d"},
		},
		{
			// Pushes dropped and recovered from the store: nothing lost,
			// so the real-time alerts are the news and reach someone.
			name: "pushes recovered, nothing lost",
			fire: []string{"ImcanaryRealtimeBudgetBurn severity=page long=1h", "ImcanaryLatencyBudgetBurn severity=page long=1h"},
		},
		{
			// Messages lost for good fire both completeness alerts; the
			// messages-lost page is the one that reaches someone.
			name: "messages lost",
			fire: []string{"ImcanaryMessagesLostBudgetBurn severity=page long=1h", "ImcanaryMessagesLostBudgetBurn severity=page long=6h", "ImcanaryRealtimeBudgetBurn severity=page long=1h", "ImcanaryRealtimeBudgetBurn severity=ticket long=6h"},
			held: []string{"ImcanaryRealtimeBudgetBurn severity=page long=1h", "ImcanaryRealtimeBudgetBurn severity=ticket long=6h"},
		},
		{
			// A slow loss that only tickets must not hide a real-time
			// page: only the messages-lost page holds real-time back.
			name: "messages-lost ticket, real-time page",
			fire: []string{"ImcanaryMessagesLostBudgetBurn severity=ticket", "ImcanaryRealtimeBudgetBurn severity=page long=1h"},
		},
	}

	fired := firedLabelSets(t)
	// labels returns the label set of spec ("Name k=v …") moved to target.
	labels := func(spec, target string) map[string]string {
		t.Helper()
		f := strings.Fields(spec)
		want := map[string]string{"alertname": f[0]}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			want[k] = v
		}
		for _, ls := range fired {
			if matchesAll(t, ls, matchers(want)) {
				out := maps.Clone(ls)
				if _, ok := out["target"]; !ok {
					t.Fatalf("%s: fired without a target label: %v", spec, ls)
				}
				out["target"] = target
				return out
			}
		}
		t.Fatalf("no promtool test shows %s firing", spec)
		return nil
	}

	dir := t.TempDir()
	addr := freeAddr(t)
	url := "http://" + addr
	am := start(t, dir, "alertmanager", alertmanager,
		"--config.file", mustAbs(t, alertmanagerFile), "--storage.path", dir,
		"--web.listen-address", addr, "--cluster.listen-address", "", "--log.level", "warn")
	waitFor(t, am, 20*time.Second, "Alertmanager to be ready", func() bool { return httpOK(url + "/-/ready") })

	add := func(ls map[string]string) {
		t.Helper()
		args := []string{"alert", "add", "--alertmanager.url", url}
		for _, k := range slices.Sorted(maps.Keys(ls)) {
			args = append(args, k+"="+ls[k])
		}
		if b, err := exec.Command(amtool, args...).CombinedOutput(); err != nil {
			t.Fatalf("amtool %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	want := map[string]bool{} // fingerprint-free key of each alert: held?
	key := func(ls map[string]string) string {
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(ls)) {
			fmt.Fprintf(&b, "%s=%q ", k, ls[k])
		}
		return b.String()
	}
	for i, c := range cases {
		target := fmt.Sprintf("case%d", i)
		for _, spec := range c.fire {
			ls := labels(spec, target)
			held := slices.ContainsFunc(c.held, func(h string) bool { return matchesAll(t, ls, matchers(labels(h, target))) })
			want[key(ls)] = held
			add(ls)
		}
	}
	// Alertmanager feeds its inhibitor the alerts in the order they came:
	// once the last source is seen holding its target back, every source
	// before it has been taken in as well.
	sentinel := labels("ImcanaryPopulationShort", "sentinel")
	add(sentinel)
	add(labels("ImcanaryTargetUnreachable", "sentinel"))

	query := func() []amAlert {
		t.Helper()
		b, err := exec.Command(amtool, "alert", "query", "--alertmanager.url", url, "--active", "--inhibited", "-o", "json").Output()
		if err != nil {
			t.Fatalf("amtool alert query: %v", err)
		}
		var as []amAlert
		if err := json.Unmarshal(b, &as); err != nil {
			t.Fatalf("amtool alert query: %v\n%s", err, b)
		}
		return as
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if slices.ContainsFunc(query(), func(a amAlert) bool { return key(a.Labels) == key(sentinel) && len(a.Status.InhibitedBy) > 0 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel's population alert was not held back within 10s: %+v", query())
		}
		time.Sleep(100 * time.Millisecond)
	}

	got := map[string]bool{}
	for _, a := range query() {
		if a.Labels["target"] == "sentinel" {
			continue
		}
		got[key(a.Labels)] = len(a.Status.InhibitedBy) > 0
		if held := len(a.Status.InhibitedBy) > 0; held != (a.Status.State == "suppressed") {
			t.Errorf("%s: state %q, inhibited by %v", key(a.Labels), a.Status.State, a.Status.InhibitedBy)
		}
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			target := fmt.Sprintf("case%d", i)
			for _, spec := range c.fire {
				k := key(labels(spec, target))
				held, ok := got[k]
				switch {
				case !ok:
					t.Errorf("%s: Alertmanager does not have it", spec)
				case held != want[k]:
					t.Errorf("%s held back = %v, want %v", spec, held, want[k])
				}
			}
		})
	}
}

// matchers turns a label set into name="value" matchers.
func matchers(ls map[string]string) []string {
	var ms []string
	for _, k := range slices.Sorted(maps.Keys(ls)) {
		ms = append(ms, fmt.Sprintf("%s=%q", k, ls[k]))
	}
	return ms
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	p, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
