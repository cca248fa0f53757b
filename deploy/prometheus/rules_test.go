// Package rules tests imcanary's Prometheus rules (imcanary-rules.yml):
// with promtool, against the runbook and the Alertmanager configuration,
// as a generated PrometheusRule, and end to end against a real imcanary
// and a real Prometheus. It holds only tests: the rules are YAML, and what
// operators apply lives beside this file.
package rules

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	rulesFile   = "imcanary-rules.yml"
	runbookFile = "../../docs/runbook.md"
	// runbookURL starts every alert's runbook_url; the anchor follows.
	runbookURL = "https://github.com/imcanary/imcanary/blob/main/docs/runbook.md#"
	objective  = "imcanary:slo_objective:ratio"
)

// ruleFile is a Prometheus rules file. Decoding is strict, so a field
// this package does not know (and would drop when it rewrites the file)
// is an error rather than a silent loss.
type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Record        string            `yaml:"record,omitempty"`
	Alert         string            `yaml:"alert,omitempty"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for,omitempty"`
	KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
	Labels        map[string]string `yaml:"labels,omitempty"`
	Annotations   map[string]string `yaml:"annotations,omitempty"`
}

func decodeRules(src []byte) (ruleFile, error) {
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("rules: %w", err)
	}
	return f, nil
}

func readRulesFile(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	f, err := decodeRules(readRulesFile(t))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// alerts returns the alerting rules in file order; an alert name may
// appear more than once (one rule per burn-rate window pair).
func (f ruleFile) alerts() []rule {
	var out []rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

func (f ruleFile) alertNames() []string {
	var names []string
	for _, r := range f.alerts() {
		names = append(names, r.Alert)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// lookPath finds a tool the test needs or skips the test, saying how to
// get it. .ci/run installs both packages, so CI never skips.
func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		pkg := map[string]string{"promtool": "prometheus", "prometheus": "prometheus", "amtool": "prometheus-alertmanager", "prometheus-alertmanager": "prometheus-alertmanager"}[name]
		t.Skipf("%s is not installed (Debian: apt-get install %s; .ci/run installs it)", name, pkg)
	}
	return p
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool := lookPath(t, "promtool")
	if b, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesFile, err, b)
	}
}

func testFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("tests/*.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in tests/*.yml (%v)", err)
	}
	return files
}

func TestPromtoolTestRules(t *testing.T) {
	promtool := lookPath(t, "promtool")
	for _, f := range testFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			if b, err := exec.Command(promtool, "test", "rules", f).CombinedOutput(); err != nil {
				t.Errorf("promtool test rules %s: %v\n%s", f, err, b)
			}
		})
	}
}

// promtoolTests is the part of a promtool test file this package checks.
type promtoolTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func loadTests(t *testing.T) map[string]promtoolTests {
	t.Helper()
	out := map[string]promtoolTests{}
	for _, f := range testFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pt promtoolTests
		if err := yaml.Unmarshal(b, &pt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = pt
	}
	return out
}

// TestEveryAlertTested checks that the promtool tests run against this
// file and show every alert both firing and silent.
func TestEveryAlertTested(t *testing.T) {
	fires, silent := map[string]bool{}, map[string]bool{}
	for f, pt := range loadTests(t) {
		if !slices.Equal(pt.RuleFiles, []string{"../" + rulesFile}) {
			t.Errorf("%s: rule_files %v, want [../%s]", f, pt.RuleFiles, rulesFile)
		}
		for _, tc := range pt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
	}
	names := loadRules(t).alertNames()
	for _, n := range names {
		if !fires[n] {
			t.Errorf("alert %s: no promtool test shows it firing", n)
		}
		if !silent[n] {
			t.Errorf("alert %s: no promtool test shows it silent", n)
		}
	}
	for n := range fires {
		if !slices.Contains(names, n) {
			t.Errorf("promtool tests expect alert %s, which the rules do not have", n)
		}
	}
}

// TestAlertsComplete checks what every alert must carry (house style:
// for, severity, summary, description, runbook_url) and that its runbook
// section exists.
func TestAlertsComplete(t *testing.T) {
	anchors := runbookAnchors(t)
	for _, r := range loadRules(t).alerts() {
		if r.For == "" {
			t.Errorf("%s: no for", r.Alert)
		}
		if s := r.Labels["severity"]; s != "page" && s != "ticket" {
			t.Errorf("%s: severity %q, want page or ticket", r.Alert, s)
		}
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[k]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, k)
			}
		}
		// The description carries the numbers.
		if d := r.Annotations["description"]; !strings.Contains(d, "$value") && !strings.Contains(d, "query") && !strings.Contains(r.Expr, "up{") {
			t.Errorf("%s: description %q shows no value", r.Alert, d)
		}
		want := runbookURL + anchor(r.Alert)
		if got := r.Annotations["runbook_url"]; got != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, want)
		}
		if !anchors[anchor(r.Alert)] {
			t.Errorf("%s: docs/runbook.md has no section %q (anchor #%s)", r.Alert, "## "+r.Alert, anchor(r.Alert))
		}
	}
}

// TestRunbookSections checks the converse: every section of the runbook
// is an alert's.
func TestRunbookSections(t *testing.T) {
	names := loadRules(t).alertNames()
	for a := range runbookAnchors(t) {
		found := false
		for _, n := range names {
			if anchor(n) == a {
				found = true
			}
		}
		if !found {
			t.Errorf("docs/runbook.md: section #%s belongs to no alert in %s", a, rulesFile)
		}
	}
}

// anchor is GitHub's anchor of a Markdown heading: lower case, spaces to
// hyphens, punctuation other than "-" and "_" dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// runbookAnchors returns the anchors of the runbook's sections: its "## "
// headings, one per alert. Headings inside code blocks do not count.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	code := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			code = !code
		}
		if h, ok := strings.CutPrefix(line, "## "); ok && !code {
			a := anchor(h)
			if out[a] {
				t.Errorf("docs/runbook.md: section #%s twice", a)
			}
			out[a] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var windows = []string{"5m", "30m", "1h", "2h", "6h", "1d", "3d"}

// TestRecordingRules checks the names a dashboard is written against, and
// that each ratio is computed over the window its name says.
func TestRecordingRules(t *testing.T) {
	recorded := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				if _, dup := recorded[r.Record]; dup {
					t.Errorf("%s recorded twice", r.Record)
				}
				recorded[r.Record] = r.Expr
			}
		}
	}
	rangeSel := regexp.MustCompile(`\[([^\]]*)\]`)
	counterSel := regexp.MustCompile(`\b(imcanary_\w+)\{`)
	for _, sli := range slis {
		for _, w := range windows {
			name := "imcanary:" + sli.name + "_errors:ratio_rate" + w
			expr, ok := recorded[name]
			if !ok {
				t.Errorf("no recording rule %s", name)
				continue
			}
			for _, m := range rangeSel.FindAllStringSubmatch(expr, -1) {
				if m[1] != w {
					t.Errorf("%s: range [%s], want [%s]", name, m[1], w)
				}
			}
			// The SLIs leave out soak runs and slow readers, and sum
			// shards and instances away.
			for _, s := range []string{`source!="soak"`, `cohort="normal"`, `sum by (target, kind)`} {
				if !strings.Contains(expr, s) {
					t.Errorf("%s: expression lacks %s", name, s)
				}
			}
			// Each SLI counts exactly its errors: a recovered delivery
			// in the eventual SLI, or one left out of the real-time SLI,
			// would page for the wrong thing or not at all.
			var got []string
			for _, m := range counterSel.FindAllStringSubmatch(expr, -1) {
				got = append(got, m[1])
			}
			slices.Sort(got)
			if got = slices.Compact(got); !slices.Equal(got, sli.series) {
				t.Errorf("%s selects %v, want %v", name, got, sli.series)
			}
		}
	}
	if _, ok := recorded[objective]; !ok {
		t.Errorf("no recording rule %s", objective)
	}
}

// slis are the SLIs the rules record over every window, each with the
// series its ratio is computed from (sorted) and the alert that burns its
// budget, with the severity of each pair of windows.
var slis = []struct {
	name   string
	series []string
	alert  string
	sev    [3]string // of the 1h/5m, 6h/30m and 3d/6h pairs
}{
	// Late, lost or only recovered by catch-up: not pushed in time. Pages
	// only when it burns fast; a store that still has the messages makes
	// the rest something to fix by day.
	{"realtime_completeness", []string{"imcanary_deliveries_expected_total", "imcanary_deliveries_late_total", "imcanary_deliveries_lost_total", "imcanary_deliveries_recovered_total"},
		"ImcanaryRealtimeBudgetBurn", [3]string{"page", "ticket", "ticket"}},
	// Lost for good: never pushed nor recovered within lost_after.
	{"eventual_completeness", []string{"imcanary_deliveries_expected_total", "imcanary_deliveries_lost_total"},
		"ImcanaryMessagesLostBudgetBurn", [3]string{"page", "page", "ticket"}},
	{"latency", []string{"imcanary_delivery_latency_seconds_bucket", "imcanary_delivery_latency_seconds_count"},
		"ImcanaryLatencyBudgetBurn", [3]string{"page", "page", "ticket"}},
}

// TestObjectiveCannotGoAbsent checks the arrangement the rules file's
// comment explains: the objective is a vector() (always one sample),
// recorded first in the group that holds every rule using it, so no alert
// ever compares with an absent objective (scalar() would make that NaN and
// the alert silent).
func TestObjectiveCannotGoAbsent(t *testing.T) {
	users := 0
	for _, g := range loadRules(t).Groups {
		for i, r := range g.Rules {
			if r.Record == objective {
				if i != 0 {
					t.Errorf("group %s: %s is rule %d, want the first", g.Name, objective, i)
				}
				if !regexp.MustCompile(`^\s*vector\(0\.\d+\)\s*$`).MatchString(r.Expr) {
					t.Errorf("%s = %q, want vector(objective)", objective, r.Expr)
				}
				continue
			}
			if r.Alert == "" || !strings.Contains(r.Expr, objective) {
				continue
			}
			users++
			if g.Rules[0].Record != objective {
				t.Errorf("%s uses %s but group %s does not record it first", r.Alert, objective, g.Name)
			}
		}
	}
	if users == 0 {
		t.Errorf("no alert uses %s: the objective is not in one place", objective)
	}
}

// TestSLOAlerts checks the labels Alertmanager routes and inhibits on: the
// burn-rate alerts are page or ticket with slo="true" and the pair of
// windows they compare.
func TestSLOAlerts(t *testing.T) {
	type pair struct{ sev, long, short string }
	// The workbook's burn-rate factor of each pair of windows.
	factor := map[string]string{"1h": "14.4", "6h": "6", "3d": "1"}
	for _, sli := range slis {
		name := sli.alert
		want := []pair{{sli.sev[0], "1h", "5m"}, {sli.sev[1], "6h", "30m"}, {sli.sev[2], "3d", "6h"}}
		var got []pair
		for _, r := range loadRules(t).alerts() {
			if r.Alert != name {
				continue
			}
			got = append(got, pair{r.Labels["severity"], r.Labels["long"], r.Labels["short"]})
			if r.Labels["slo"] != "true" {
				t.Errorf("%s %s/%s: slo=%q, want \"true\"", name, r.Labels["long"], r.Labels["short"], r.Labels["slo"])
			}
			rec := "imcanary:" + sli.name + "_errors:ratio_rate"
			for _, w := range []string{r.Labels["long"], r.Labels["short"]} {
				use := rec + w + " > " + factor[r.Labels["long"]] + " * (1 - scalar(" + objective + "))"
				if !strings.Contains(r.Expr, use) {
					t.Errorf("%s %s/%s: expression does not compare %s", name, r.Labels["long"], r.Labels["short"], use)
				}
			}
			if other := regexp.MustCompile(`imcanary:\w+_errors:`).FindAllString(r.Expr, -1); slices.ContainsFunc(other, func(s string) bool { return s != "imcanary:"+sli.name+"_errors:" }) {
				t.Errorf("%s %s/%s: expression uses another SLI's ratios: %v", name, r.Labels["long"], r.Labels["short"], other)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: (severity, long, short) %v, want %v", name, got, want)
		}
	}
}

// sloAlerts are the alerts that judge the server by imcanary's own timing,
// which a saturated prober cannot be trusted with: Alertmanager holds back
// exactly those labelled slo="true" while ImcanaryProberSaturated fires. An
// alert about imcanary itself, or about what the server refuses (logins,
// duplicates), must not be held back with them.
var sloAlerts = []string{"ImcanaryRealtimeBudgetBurn", "ImcanaryMessagesLostBudgetBurn", "ImcanaryLatencyBudgetBurn", "ImcanaryCanaryFailing"}

// TestSLOLabel checks that slo="true" is on the alerts in sloAlerts and on
// no other.
func TestSLOLabel(t *testing.T) {
	for _, r := range loadRules(t).alerts() {
		v, ok := r.Labels["slo"]
		if ok && v != "true" {
			t.Errorf("%s: slo=%q, want \"true\" or no slo label", r.Alert, v)
		}
		if want := slices.Contains(sloAlerts, r.Alert); ok != want {
			t.Errorf("%s: has slo label %v, want %v (sloAlerts lists the alerts saturation holds back)", r.Alert, ok, want)
		}
	}
}

// TestObjectiveIsConfigurable changes the one objective in the rules file
// to 99.99% and runs testdata/four-nines.yml against that copy: the alerts
// must follow the objective they read, not a number written into them. It
// also shows the two classic cases at a budget where they are exact: 1%
// lost pages within 5 minutes, 0.05% lost only tickets.
func TestObjectiveIsConfigurable(t *testing.T) {
	promtool := lookPath(t, "promtool")
	src := string(readRulesFile(t))
	const from, to = "expr: vector(0.999)\n", "expr: vector(0.9999)\n"
	if n := strings.Count(src, from); n != 1 {
		t.Fatalf("%s has %d objectives %q, want exactly 1", rulesFile, n, strings.TrimSpace(from))
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "imcanary-rules-99.99.yml"), []byte(strings.Replace(src, from, to, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "four-nines.yml"))
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "four-nines.yml")
	if err := os.WriteFile(f, tests, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(promtool, "test", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules %s: %v\n%s", f, err, b)
	}
}
