// Package grafana holds imcanary's Grafana dashboard, imcanary.json, and the
// test that keeps its queries honest: every metric a panel asks for must be
// one imcanary exports (or a recording rule it ships), and every query must
// follow the dashboard's target and shard selectors. It also keeps the
// dashboard saying what it shows: rates in per-second units, stats coloured
// as their descriptions say (the SLIs at the rules' objective), links to the
// runbook and to a process's status page, saturation and soak runs marked
// on every graph.
package grafana

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/collectors/version"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/imcanary/imcanary/metrics"
)

const (
	dashboardFile = "imcanary.json"
	// rulesFile is where the recording rules live; a path relative to this
	// package's directory, which is where go test runs.
	rulesFile = "../prometheus/imcanary-rules.yml"
	// objective is the SLO's one series: no labels, the same for every
	// target, so queries on it alone need not follow $target.
	objective = "imcanary:slo_objective:ratio"
)

// dashboard is the part of Grafana's dashboard model the checks need.
// Unknown fields are ignored on purpose (fieldConfig, options and the like
// are Grafana's business), but the fields named here must have these types.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Links         []link  `json:"links"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []annotation `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	GridPos     *gridPos    `json:"gridPos"`
	Datasource  *datasource `json:"datasource"`
	Targets     []target    `json:"targets"`
	FieldConfig fieldConfig `json:"fieldConfig"`
	Links       []link      `json:"links"`
	Collapsed   bool        `json:"collapsed"`
	// Panels are a collapsed row's: Grafana nests them only while the row
	// is collapsed, and lists them after the row otherwise.
	Panels []panel `json:"panels"`
}

// fieldConfig is how a panel shows its values: a unit and thresholds for
// every field, and overrides for the fields a matcher picks.
type fieldConfig struct {
	Defaults struct {
		Unit       string      `json:"unit"`
		Thresholds *thresholds `json:"thresholds"`
	} `json:"defaults"`
	Overrides []struct {
		Matcher struct {
			ID      string          `json:"id"`
			Options json.RawMessage `json:"options"`
		} `json:"matcher"`
		Properties []struct {
			ID    string          `json:"id"`
			Value json.RawMessage `json:"value"`
		} `json:"properties"`
	} `json:"overrides"`
}

type thresholds struct {
	Mode  string `json:"mode"`
	Steps []struct {
		Color string   `json:"color"`
		Value *float64 `json:"value"` // nil is the base, below every other step
	} `json:"steps"`
}

// link is a dashboard's or a panel's link.
type link struct {
	Title string `json:"title"`
	Type  string `json:"type"`
	URL   string `json:"url"`
}

type gridPos struct {
	H, W, X, Y int
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *datasource `json:"datasource"`
	// Exemplar asks Grafana to draw the query's exemplars.
	Exemplar bool `json:"exemplar"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *datasource     `json:"datasource"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
}

type annotation struct {
	Name       string      `json:"name"`
	BuiltIn    int         `json:"builtIn"`
	Enable     bool        `json:"enable"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// placed is a panel with the row it sits in ("" above the first row).
type placed struct {
	panel
	row string
}

// name says which panel a failure is about, as a reader finds it in
// Grafana: by row and title, with the id for the JSON.
func (p placed) name() string {
	return fmt.Sprintf("%q (id %d, row %q)", p.Title, p.ID, p.row)
}

// flatten lists every panel, rows included, in dashboard order. An open
// row's panels follow it at the top level; a collapsed row's are nested.
func flatten(d dashboard) []placed {
	var out []placed
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			out = append(out, placed{p, ""})
			for _, c := range p.Panels {
				out = append(out, placed{c, row})
			}
			continue
		}
		out = append(out, placed{p, row})
	}
	return out
}

// query is one PromQL expression of the dashboard and where it came from.
type query struct {
	where string
	expr  string
	// exempt are the variables the query cannot filter on: a variable's
	// query runs before it, and the variables after it, have a value.
	exempt []string
}

// labelValues matches a template variable's label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// queries lists every PromQL expression in the dashboard: panel targets,
// annotations, and the selectors of the variables' label_values queries.
func queries(t *testing.T, d dashboard) []query {
	t.Helper()
	var qs []query
	for _, p := range flatten(d) {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: fmt.Sprintf("panel %s query %s", p.name(), tg.RefID), expr: tg.Expr})
		}
	}
	for _, a := range d.Annotations.List {
		if a.BuiltIn == 0 {
			qs = append(qs, query{where: fmt.Sprintf("annotation %q", a.Name), expr: a.Expr})
		}
	}
	var later []string // the query variables from this one on
	for _, v := range slices.Backward(d.Templating.List) {
		if v.Type != "query" {
			continue
		}
		later = append(later, v.Name)
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %q: definition %q is not label_values(SELECTOR, LABEL)", v.Name, v.Definition)
			continue
		}
		qs = append(qs, query{where: fmt.Sprintf("variable %q", v.Name), expr: m[1], exempt: slices.Clone(later)})
	}
	return qs
}

// values stands in for what Grafana substitutes before a query reaches
// Prometheus: one plausible value per dashboard variable and built-in. A
// variable missing here is a typo or a variable the dashboard lacks.
var values = map[string]string{
	"target":          "x",
	"shard":           "0",
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__interval_ms":   "60000",
	"__range":         "6h",
	"__range_s":       "21600",
	"__range_ms":      "21600000",
}

// varRef matches $name, ${name} and ${name:format}; [[name]] is the
// deprecated form and is refused.
var varRef = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

func substitute(expr string) (string, error) {
	var errs []error
	out := varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		if m[3] != "" {
			errs = append(errs, fmt.Errorf("%s: use $%s, not the deprecated [[…]] form", ref, m[3]))
			return ref
		}
		name := m[1] + m[2]
		v, ok := values[name]
		if !ok {
			errs = append(errs, fmt.Errorf("%s is neither a dashboard variable nor a Grafana built-in this test knows", ref))
			return ref
		}
		return v
	})
	return out, errors.Join(errs...)
}

// kind is the type of a series, as far as the checks care.
type kind int

const (
	counter kind = iota // a counter, or a histogram's or summary's _bucket, _sum, _count
	gauge               // a gauge, untyped series, or a summary's quantiles
	rule                // a recording rule's output
)

// series is what the checks need to know of a name: its kind, and which of
// the variables' labels (target, shard) it carries.
type series struct {
	kind   kind
	labels []string
}

// Recording rules sum the shards of a target (the SLI is the service's, not
// one prober's) and keep target; the objective is one series without
// labels, the same for every target.
var (
	ruleSeries      = series{rule, []string{"target"}}
	objectiveSeries = series{rule, nil}
)

// exported returns every series name imcanary's /metrics serves, from a
// registry built as cmd/imcanary builds it, so that the dashboard is
// checked against the code rather than against a list kept by hand.
func exported(t *testing.T) map[string]series {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg)
	m.For("t", metrics.SourceBackground)
	p := m.Probe("t")
	// For and Probe create the population's and the prober's series; the
	// canary, the soak runner and the port monitor create theirs as they
	// start, so they are touched here as those do.
	p.PortUsage("127.0.0.1")
	m.CanaryRounds.WithLabelValues("t", metrics.KindDirect, metrics.ResultPass)
	m.CanaryFailures.WithLabelValues("t", metrics.KindDirect, metrics.CanaryNoAck)
	m.CanarySkipped.WithLabelValues("t")
	m.CanaryLastTimestamp.WithLabelValues("t")
	m.CanaryLastSuccess.WithLabelValues("t")
	m.CanaryNextRound.WithLabelValues("t")
	m.TargetReachable.WithLabelValues("t")
	m.SoakRuns.WithLabelValues("t", "p", metrics.ResultPass)
	m.SoakSkipped.WithLabelValues("t", "p")
	m.SoakLastSuccess.WithLabelValues("t", "p")
	m.SoakRunning.WithLabelValues("t", "p")
	m.SearchRuns.WithLabelValues("t", "p", "found")
	m.SearchKnee.WithLabelValues("t", "p")
	m.SearchBaselineKnee.WithLabelValues("t", "p")
	m.TLSCertExpiry.WithLabelValues("t")
	// The clock-offset gauges appear with a shard's first exchange.
	m.Clock.ClockPeer("t", metrics.SourceCanary, "1")
	m.Clock.Offset.WithLabelValues("t", "1")
	m.Clock.Uncertainty.WithLabelValues("t", "1")
	own, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// A vector with no series is not gathered: a series added to
	// metrics.Metrics and created elsewhere must be touched above, or
	// the dashboard could not be checked against it.
	if n := collectorFields(m); len(own) != n {
		t.Fatalf("metrics.Metrics has %d collectors but %d were gathered: create a series of the new one in exported()", n, len(own))
	}
	// The same collectors as cmd/imcanary/daemon.go, with the same runtime
	// metrics rule: the scheduler's latency and GC pauses are panels here,
	// and so is imcanary_build_info, the version collector's.
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/(latencies|pauses/total/gc):seconds$`)},
		)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		version.NewCollector("imcanary"),
	)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]series{}
	for _, f := range fams {
		n := f.GetName()
		// cmd/imcanary wraps every collector, its own and Go's, with
		// shard; target is only on the series that have it here.
		vars := []string{"shard"}
		if slices.ContainsFunc(f.GetMetric()[0].GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "target" }) {
			vars = append(vars, "target")
		}
		c, g := series{counter, vars}, series{gauge, vars}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			names[n] = c
		case dto.MetricType_HISTOGRAM:
			// The bare name selects nothing for a classic histogram: a
			// query on it is a mistake, so it is left out.
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = c, c, c
		case dto.MetricType_SUMMARY:
			names[n], names[n+"_sum"], names[n+"_count"] = g, c, c
		default:
			names[n] = g
		}
	}
	// up is written by Prometheus for every scrape, not by imcanary, and
	// carries neither label: panels join it to imcanary's series.
	names["up"] = series{gauge, nil}
	return names
}

// collectorFields counts the collectors metrics.Metrics holds.
func collectorFields(m *metrics.Metrics) int {
	v := reflect.ValueOf(m).Elem()
	n := 0
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanInterface() {
			continue
		}
		if _, ok := f.Interface().(prometheus.Collector); ok {
			n++
		} else if f.Kind() == reflect.Pointer && f.Elem().Kind() == reflect.Struct {
			// A group of series kept together (metrics.Clock).
			n += collectorsIn(f.Elem())
		}
	}
	return n
}

// collectorsIn counts the collector fields of the struct v.
func collectorsIn(v reflect.Value) int {
	n := 0
	for i := range v.NumField() {
		if f := v.Field(i); f.CanInterface() {
			if _, ok := f.Interface().(prometheus.Collector); ok {
				n++
			}
		}
	}
	return n
}

// recorded returns the recording rules' names from rulesFile, or nil with
// ok false when the file does not exist yet.
func recorded(t *testing.T) (names []string, ok bool) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				names = append(names, r.Record)
			}
		}
	}
	return names, true
}

// ruleName is what a recording rule of imcanary's is called, accepted for
// any name while rulesFile does not exist.
var ruleName = regexp.MustCompile(`^imcanary:`)

// known is every name a dashboard query may select.
type known struct {
	names map[string]series
	// rulesFromFile is false when rulesFile is missing and any name
	// matching ruleName is taken on trust.
	rulesFromFile bool
}

func (k known) lookup(name string) (series, bool) {
	if s, ok := k.names[name]; ok {
		return s, true
	}
	if !k.rulesFromFile && ruleName.MatchString(name) {
		if name == objective {
			return objectiveSeries, true
		}
		return ruleSeries, true
	}
	return series{}, false
}

func newKnown(t *testing.T) known {
	t.Helper()
	k := known{names: exported(t)}
	rules, ok := recorded(t)
	if !ok {
		t.Logf("%s does not exist yet: accepting any recording rule named %s without checking it is defined", rulesFile, ruleName)
	}
	k.rulesFromFile = ok
	for _, r := range rules {
		k.names[r] = ruleSeries
		if r == objective {
			k.names[r] = objectiveSeries
		}
	}
	return k
}

// Selectors follow the dashboard's variables through regex matchers (=~,
// so that multi-value and All selections work) on every variable label the
// series carries, and never match on one it lacks: a chosen value would
// select nothing. Series without target (Go's, the process's, up) are
// joined to imcanary's on instance and job instead.
func hasMatcher(ms []*labels.Matcher, label string) bool {
	return slices.ContainsFunc(ms, func(m *labels.Matcher) bool {
		return m.Name == label && m.Type == labels.MatchRegexp && m.Value == values[label]
	})
}

func metricName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// counterFuncs only make sense over counters: over a gauge they give
// nonsense that looks like data.
var counterFuncs = map[string]bool{"rate": true, "irate": true, "increase": true}

// check parses one query and returns what is wrong with it, and the metric
// names it selects. It need not filter on the variables in exempt.
func check(k known, expr string, exempt ...string) (names []string, errs []error) {
	s, err := substitute(expr)
	if err != nil {
		return nil, []error{err}
	}
	ast, err := parser.ParseExpr(s)
	if err != nil {
		return nil, []error{fmt.Errorf("does not parse: %w\n\t%s", err, s)}
	}
	followsTarget := false
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			name := metricName(n)
			if name == "" {
				errs = append(errs, fmt.Errorf("selector %s has no metric name", n))
				return nil
			}
			names = append(names, name)
			info, ok := k.lookup(name)
			if !ok {
				errs = append(errs, fmt.Errorf("selects %s, which imcanary does not export and no recording rule in %s records", name, rulesFile))
				return nil
			}
			for _, l := range []string{"target", "shard"} {
				carries := slices.Contains(info.labels, l)
				switch {
				case carries && !hasMatcher(n.LabelMatchers, l) && !slices.Contains(exempt, l):
					errs = append(errs, fmt.Errorf("selector %s lacks %s=~\"$%s\"", n, l, l))
				case !carries && slices.ContainsFunc(n.LabelMatchers, func(m *labels.Matcher) bool { return m.Name == l }):
					errs = append(errs, fmt.Errorf("selector %s matches on %s, which %s does not carry: a chosen $%s selects nothing", n, l, name, l))
				}
			}
			if hasMatcher(n.LabelMatchers, "target") {
				followsTarget = true
			}
		case *parser.Call:
			if counterFuncs[n.Func.Name] {
				parser.Inspect(n, func(c parser.Node, _ []parser.Node) error {
					if vs, ok := c.(*parser.VectorSelector); ok {
						if info, ok := k.lookup(metricName(vs)); ok && info.kind != counter {
							errs = append(errs, fmt.Errorf("%s() over %s, which is not a counter", n.Func.Name, metricName(vs)))
						}
					}
					return nil
				})
			}
			if n.Func.Name == "histogram_quantile" {
				for _, a := range outermost(n.Args[1]) {
					if !a.Without && !slices.Contains(a.Grouping, "le") || a.Without && slices.Contains(a.Grouping, "le") {
						errs = append(errs, fmt.Errorf("histogram_quantile over %s, which drops le", a))
					}
				}
			}
		}
		return nil
	})
	// A query on the objective alone is the same for every target; every
	// other query must narrow to $target somewhere (a join counts), or it
	// shows every target whatever the selector says.
	onlyObjective := len(names) > 0 && !slices.ContainsFunc(names, func(n string) bool { return n != objective })
	if !followsTarget && !onlyObjective && !slices.Contains(exempt, "target") {
		errs = append(errs, fmt.Errorf("never selects target=~\"$target\", so it ignores the target selector"))
	}
	return names, errs
}

// outermost returns the aggregations in n that are not inside another one:
// those decide which labels reach histogram_quantile. An aggregation inside
// them (the group by of a join) may drop le.
func outermost(n parser.Node) []*parser.AggregateExpr {
	if a, ok := n.(*parser.AggregateExpr); ok {
		return []*parser.AggregateExpr{a}
	}
	var out []*parser.AggregateExpr
	for _, c := range parser.Children(n) {
		out = append(out, outermost(c)...)
	}
	return out
}

// TestQueries parses every query of the dashboard and checks the names it
// selects against a real registry and the recording rules.
func TestQueries(t *testing.T) {
	d := load(t)
	k := newKnown(t)
	for _, q := range queries(t, d) {
		t.Run(q.where, func(t *testing.T) {
			if strings.TrimSpace(q.expr) == "" {
				t.Fatalf("%s: empty query", q.where)
			}
			_, errs := check(k, q.expr, q.exempt...)
			for _, err := range errs {
				t.Errorf("%s: %v\n\tquery: %s", q.where, err, q.expr)
			}
		})
	}
}

// TestCheck proves the checks catch what they are for, so that a green
// TestQueries means something.
func TestCheck(t *testing.T) {
	both := []string{"target", "shard"}
	k := known{names: map[string]series{
		"imcanary_sessions_online":                 {gauge, both},
		"imcanary_deliveries_total":                {counter, both},
		"imcanary_delivery_latency_seconds_bucket": {counter, both},
		"go_goroutines":                            {gauge, []string{"shard"}},
		"up":                                       {gauge, nil},
		"imcanary:realtime_completeness_errors:ratio_rate5m": ruleSeries,
		objective: objectiveSeries,
	}, rulesFromFile: true}
	sel := `{target=~"$target", shard=~"$shard"}`
	tests := []struct {
		expr string
		want string // substring of the first error; "" for none
	}{
		{`sum(imcanary_sessions_online` + sel + `)`, ""},
		{`rate(imcanary_deliveries_total` + sel + `[$__rate_interval])`, ""},
		{`imcanary:realtime_completeness_errors:ratio_rate5m{target=~"$target"}`, ""},
		{objective, ""},
		{`go_goroutines{shard=~"$shard"} * on (instance) group_left (target) group by (instance, target) (imcanary_sessions_online` + sel + `)`, ""},
		{`histogram_quantile(0.99, sum by (le) (rate(imcanary_delivery_latency_seconds_bucket` + sel + `[5m])))`, ""},
		{`imcanary_sesions_online` + sel, "does not export"},
		{`imcanary:realtime_completeness_errors:ratio_rate7m{target=~"$target"}`, "does not export"},
		{`imcanary_sessions_online{target=~"$target"}`, `lacks shard=~"$shard"`},
		{`imcanary_sessions_online{target="$target", shard=~"$shard"}`, `lacks target=~"$target"`},
		{`go_goroutines{shard=~"$shard"}`, "ignores the target selector"},
		{`go_goroutines{target=~"$target", shard=~"$shard"}`, "which go_goroutines does not carry"},
		{`up{shard=~"$shard"} * on (instance) group_left () group by (instance) (imcanary_sessions_online` + sel + `)`, "which up does not carry"},
		{`imcanary:realtime_completeness_errors:ratio_rate5m{target=~"$target", shard=~"$shard"}`, "does not carry"},
		{`rate(imcanary_sessions_online` + sel + `[5m])`, "not a counter"},
		{`histogram_quantile(0.99, sum by (kind) (rate(imcanary_delivery_latency_seconds_bucket` + sel + `[5m])))`, "drops le"},
		{`histogram_quantile(0.99, sum without (le) (rate(imcanary_delivery_latency_seconds_bucket` + sel + `[5m])))`, "drops le"},
		{`histogram_quantile(0.99, sum by (le, target) (rate(imcanary_delivery_latency_seconds_bucket` + sel + `[5m]) * on (instance) group_left (target) group by (instance, target) (imcanary_sessions_online` + sel + `)))`, ""},
		{`imcanary_sessions_online{target=~"$targt", shard=~"$shard"}`, "$targt is neither"},
		{`imcanary_sessions_online{target=~"[[target]]", shard=~"$shard"}`, "deprecated"},
		{`sum(imcanary_sessions_online` + sel, "does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			_, errs := check(k, tt.expr)
			got := ""
			if len(errs) > 0 {
				got = errs[0].Error()
			}
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("check(%q) = %q, want an error containing %q", tt.expr, got, tt.want)
			}
		})
	}
}

// TestCheckWithoutRules checks the fallback while the rules file is
// missing: any imcanary: name passes, anything else is still checked.
func TestCheckWithoutRules(t *testing.T) {
	k := known{names: map[string]series{}}
	for _, tt := range []struct {
		expr string
		ok   bool
	}{
		{`imcanary:anything:ratio_rate5m{target=~"$target"}`, true},
		{`imcanary_anything{target=~"$target", shard=~"$shard"}`, false},
	} {
		if _, errs := check(k, tt.expr); (len(errs) == 0) != tt.ok {
			t.Errorf("check(%q) = %v, want ok %v", tt.expr, errs, tt.ok)
		}
	}
}

// TestPanels checks what every panel needs to render and to be understood.
func TestPanels(t *testing.T) {
	d := load(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: want both set (uid keeps links stable across imports)", d.UID, d.Title)
	}
	// 36 is where panels name their datasource as an object, which the
	// ${datasource} variable relies on.
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion = %d, want at least 36", d.SchemaVersion)
	}
	ids := map[int]string{}
	titles := map[string]bool{}
	for _, p := range flatten(d) {
		t.Run(fmt.Sprintf("%d %s", p.ID, p.Title), func(t *testing.T) {
			if p.ID <= 0 {
				t.Errorf("panel %s: id must be positive", p.name())
			} else if other, dup := ids[p.ID]; dup {
				t.Errorf("panel %s: id %d is also panel %s's", p.name(), p.ID, other)
			}
			ids[p.ID] = p.name()
			if p.Title == "" {
				t.Errorf("panel %s: no title", p.name())
			} else if titles[p.Title] {
				t.Errorf("panel %s: title used twice", p.name())
			}
			titles[p.Title] = true
			if strings.TrimSpace(p.Description) == "" {
				t.Errorf("panel %s: no description (say what it shows and how it is measured)", p.name())
			}
			if g := p.GridPos; g == nil {
				t.Errorf("panel %s: no gridPos", p.name())
			} else if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				t.Errorf("panel %s: gridPos %+v, want a positive size within 24 columns", p.name(), *g)
			}
			if p.Type == "row" {
				if len(p.Targets) != 0 {
					t.Errorf("row %s has queries", p.name())
				}
				return
			}
			if !promDS(p.Datasource) {
				t.Errorf("panel %s: datasource %+v, want the ${datasource} variable", p.name(), p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %s: no queries", p.name())
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("panel %s: query refId %q empty or repeated", p.name(), tg.RefID)
				}
				refs[tg.RefID] = true
				if !promDS(tg.Datasource) {
					t.Errorf("panel %s query %s: datasource %+v, want the ${datasource} variable", p.name(), tg.RefID, tg.Datasource)
				}
			}
		})
	}
}

// promDS reports whether ds is the dashboard's datasource variable, so that
// an import picks the operator's Prometheus instead of a uid from the
// author's Grafana.
func promDS(ds *datasource) bool {
	return ds != nil && ds.Type == "prometheus" && ds.UID == "${datasource}"
}

// TestTemplating checks the variables every query relies on.
func TestTemplating(t *testing.T) {
	d := load(t)
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("variable datasource = %+v, want type datasource, query prometheus", v)
	}
	for _, name := range []string{"target", "shard"} {
		t.Run(name, func(t *testing.T) {
			v, ok := vars[name]
			if !ok {
				t.Fatalf("variable %q missing", name)
			}
			if v.Type != "query" || !promDS(v.Datasource) {
				t.Errorf("variable %q: type %q datasource %+v, want a query on ${datasource}", name, v.Type, v.Datasource)
			}
			if m := labelValues.FindStringSubmatch(v.Definition); m == nil || m[2] != name {
				t.Errorf("variable %q: definition %q, want label_values(…, %s)", name, v.Definition, name)
			}
			// The query also lives in an object the editor writes; it
			// must say the same as the definition.
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q); err != nil || q.Query != v.Definition {
				t.Errorf("variable %q: query %s, want {\"query\": %q}", name, v.Query, v.Definition)
			}
			if !v.Multi || !v.IncludeAll {
				t.Errorf("variable %q: multi %v includeAll %v, want both", name, v.Multi, v.IncludeAll)
			}
			// With All as .*, a series without the label (exported
			// before shard existed) still matches; Grafana's default
			// All, a list of the values, would drop it.
			if v.AllValue != ".*" {
				t.Errorf("variable %q: allValue %q, want .*", name, v.AllValue)
			}
		})
	}
}

// required is what the dashboard must show: each row, its panels, and the
// series each panel must query. A panel may query more.
var required = []struct {
	row, title, typ string
	names           []string
}{
	// The two completeness SLIs side by side: real-time (pushed on time)
	// and eventual (had at all), each as a stat, a budget, a time series
	// and a burn rate, beside latency.
	{"SLIs and error budget", "Real-time completeness SLI (1h)", "stat", []string{"imcanary:realtime_completeness_errors:ratio_rate1h"}},
	{"SLIs and error budget", "Eventual completeness SLI (1h)", "stat", []string{"imcanary:eventual_completeness_errors:ratio_rate1h"}},
	{"SLIs and error budget", "Latency SLI (1h)", "stat", []string{"imcanary:latency_errors:ratio_rate1h"}},
	{"SLIs and error budget", "Error budget remaining (real-time completeness, 30d)", "stat", []string{"imcanary:realtime_completeness_errors:ratio_rate1h", objective}},
	{"SLIs and error budget", "Error budget remaining (eventual completeness, 30d)", "stat", []string{"imcanary:eventual_completeness_errors:ratio_rate1h", objective}},
	{"SLIs and error budget", "Error budget remaining (latency, 30d)", "stat", []string{"imcanary:latency_errors:ratio_rate1h", objective}},
	{"SLIs and error budget", "Target reachable", "stat", []string{"imcanary_target_reachable"}},
	{"SLIs and error budget", "Prober saturated", "stat", []string{"imcanary_probe_saturated"}},
	{"SLIs and error budget", "Real-time completeness SLI", "timeseries", []string{"imcanary:realtime_completeness_errors:ratio_rate5m", "imcanary:realtime_completeness_errors:ratio_rate1h", objective}},
	{"SLIs and error budget", "Eventual completeness SLI", "timeseries", []string{"imcanary:eventual_completeness_errors:ratio_rate5m", "imcanary:eventual_completeness_errors:ratio_rate1h", objective}},
	{"SLIs and error budget", "Latency SLI", "timeseries", []string{"imcanary:latency_errors:ratio_rate5m", "imcanary:latency_errors:ratio_rate1h", objective}},
	{"SLIs and error budget", "Real-time completeness burn rate", "timeseries", []string{"imcanary:realtime_completeness_errors:ratio_rate1h", "imcanary:realtime_completeness_errors:ratio_rate6h", "imcanary:realtime_completeness_errors:ratio_rate1d", "imcanary:realtime_completeness_errors:ratio_rate3d", objective}},
	{"SLIs and error budget", "Eventual completeness burn rate", "timeseries", []string{"imcanary:eventual_completeness_errors:ratio_rate1h", "imcanary:eventual_completeness_errors:ratio_rate6h", "imcanary:eventual_completeness_errors:ratio_rate1d", "imcanary:eventual_completeness_errors:ratio_rate3d", objective}},
	{"SLIs and error budget", "Latency burn rate", "timeseries", []string{"imcanary:latency_errors:ratio_rate1h", "imcanary:latency_errors:ratio_rate6h", "imcanary:latency_errors:ratio_rate1d", "imcanary:latency_errors:ratio_rate3d", objective}},
	{"SLIs and error budget", "Burn rate by window", "table", slices.Concat(windows("realtime_completeness"), windows("eventual_completeness"), windows("latency"))},

	{"Latency", "Delivery latency distribution (normal cohort)", "heatmap", []string{"imcanary_delivery_latency_seconds_bucket"}},
	{"Latency", "Delivery latency p50 / p95 / p99 by kind", "timeseries", []string{"imcanary_delivery_latency_seconds_bucket"}},
	{"Latency", "Ack latency p50 / p95 / p99 by kind", "timeseries", []string{"imcanary_ack_latency_seconds_bucket"}},
	{"Latency", "Group fan-out time p50 / p99 by size class", "timeseries", []string{"imcanary_group_fanout_seconds_bucket"}},

	{"Completeness", "Deliveries: expected, pushed, recovered, lost, late (normal cohort)", "timeseries", []string{"imcanary_deliveries_expected_total", "imcanary_deliveries_total", "imcanary_deliveries_recovered_total", "imcanary_deliveries_lost_total", "imcanary_deliveries_late_total"}},
	{"Completeness", "Lost, late and recovered ratio by kind (normal cohort)", "timeseries", []string{"imcanary_deliveries_lost_total", "imcanary_deliveries_late_total", "imcanary_deliveries_recovered_total", "imcanary_deliveries_expected_total"}},
	{"Completeness", "Recovered deliveries and late pushes by kind and source (normal cohort)", "timeseries", []string{"imcanary_deliveries_recovered_total", "imcanary_deliveries_late_push_total"}},
	{"Completeness", "Recovery latency p50 / p95 / p99 by kind", "timeseries", []string{"imcanary_recovery_latency_seconds_bucket"}},
	{"Completeness", "Duplicates and reordered (normal cohort)", "timeseries", []string{"imcanary_deliveries_duplicate_total", "imcanary_deliveries_reordered_total"}},
	{"Completeness", "Cohorts: lost and late ratio, normal vs slow_reader", "timeseries", []string{"imcanary_deliveries_lost_total", "imcanary_deliveries_expected_total"}},

	{"Population", "Sessions online vs target by source", "timeseries", []string{"imcanary_sessions_online", "imcanary_sessions_wanted"}},
	{"Population", "Connects by result", "timeseries", []string{"imcanary_session_connects_total"}},
	{"Population", "Connect failures by reason", "timeseries", []string{"imcanary_session_connect_failures_total"}},
	{"Population", "Connect failure share", "timeseries", []string{"imcanary_session_connect_failures_total", "imcanary_session_connects_total"}},
	{"Population", "Disconnects by reason", "timeseries", []string{"imcanary_session_disconnects_total"}},
	{"Population", "Conflict disconnects (another login of the same user)", "timeseries", []string{"imcanary_session_disconnects_total"}},
	{"Population", "Sessions lagging (silent stalls)", "timeseries", []string{"imcanary_sessions_lagging"}},
	{"Population", "Delivery lag per session (messages behind)", "heatmap", []string{"imcanary_session_delivery_lag_messages_bucket"}},

	{"Canary", "Canary rounds by result (per hour)", "timeseries", []string{"imcanary_canary_rounds_total"}},
	{"Canary", "Last canary round", "stat", []string{"imcanary_canary_last_round_success"}},
	{"Canary", "Next canary round due in", "stat", []string{"imcanary_canary_next_round_timestamp_seconds"}},
	{"Canary", "Canary failures by reason (per hour)", "timeseries", []string{"imcanary_canary_failures_total"}},

	{"Soak", "Soak runs by result", "table", []string{"imcanary_soak_runs_total"}},
	{"Soak", "Last soak run by profile", "stat", []string{"imcanary_soak_last_run_success"}},
	{"Soak", "Soak running", "timeseries", []string{"imcanary_soak_running"}},

	{"Probe self-health", "Prober saturated and causes", "timeseries", []string{"imcanary_probe_saturated", "imcanary_probe_saturation_cause"}},
	{"Probe self-health", "Prober send and receive lag p50 / p99", "timeseries", []string{"imcanary_probe_send_lag_seconds_bucket", "imcanary_probe_receive_lag_seconds_bucket"}},
	{"Probe self-health", "Prober CPU usage", "timeseries", []string{"imcanary_probe_cpu_usage_ratio"}},
	{"Probe self-health", "Ephemeral port usage", "timeseries", []string{"imcanary_probe_ephemeral_port_usage_ratio"}},
	{"Probe self-health", "Go scheduler latency p99 and GC pauses", "timeseries", []string{"go_sched_latencies_seconds_bucket", "go_sched_pauses_total_gc_seconds_bucket"}},
	{"Probe self-health", "Open files", "timeseries", []string{"process_open_fds", "process_max_fds"}},
	{"Probe self-health", "Resident memory", "timeseries", []string{"process_resident_memory_bytes"}},
	{"Probe self-health", "Goroutines", "timeseries", []string{"go_goroutines"}},
	{"Probe self-health", "Deliveries recorded while saturated", "timeseries", []string{"imcanary_deliveries_saturated_total"}},
	{"Probe self-health", "imcanary version by shard", "table", []string{"imcanary_build_info"}},

	{"Connect path", "Connect phase time p50 / p99 by phase", "timeseries", []string{"imcanary_connect_duration_seconds_bucket"}},
	{"Connect path", "Mean connect time by phase (stacked)", "timeseries", []string{"imcanary_connect_duration_seconds_sum", "imcanary_connect_duration_seconds_count"}},
	{"Connect path", "TLS session resumption", "timeseries", []string{"imcanary_tls_handshakes_total"}},
	{"Connect path", "TLS certificate expires in", "stat", []string{"imcanary_tls_earliest_cert_expiry_timestamp_seconds"}},
	// Across shards and exactness: the clock offsets the cross-shard ring
	// measures, the latencies left out for want of one, and deliveries of
	// messages never owed.
	{"Across shards and exactness", "Clock offset of each peer shard, with its uncertainty", "timeseries", []string{"imcanary_clock_offset_seconds", "imcanary_clock_offset_uncertainty_seconds"}},
	{"Across shards and exactness", "Cross-shard latencies left out (untrusted clock)", "timeseries", []string{"imcanary_cross_shard_latency_untrusted_total"}},
	{"Across shards and exactness", "Unowed deliveries by kind (acks that never came back)", "timeseries", []string{"imcanary_deliveries_unowed_total"}},
}

// windows names one SLI's error-ratio rules over every window the rules
// keep.
func windows(sli string) []string {
	var out []string
	for _, w := range []string{"5m", "30m", "1h", "2h", "6h", "1d", "3d"} {
		out = append(out, "imcanary:"+sli+"_errors:ratio_rate"+w)
	}
	return out
}

// TestRequired checks the dashboard has every row and panel operators rely
// on, in its row, and that each queries what its title promises.
func TestRequired(t *testing.T) {
	d := load(t)
	k := newKnown(t)
	byTitle := map[string]placed{}
	for _, p := range flatten(d) {
		byTitle[p.Title] = p
	}
	for _, r := range required {
		t.Run(r.title, func(t *testing.T) {
			if row, ok := byTitle[r.row]; !ok || row.Type != "row" {
				t.Fatalf("row %q missing", r.row)
			}
			p, ok := byTitle[r.title]
			if !ok {
				t.Fatalf("panel %q missing from row %q", r.title, r.row)
			}
			if p.row != r.row || p.Type != r.typ {
				t.Errorf("panel %s is a %s, want a %s in row %q", p.name(), p.Type, r.typ, r.row)
			}
			got := map[string]bool{}
			for _, tg := range p.Targets {
				names, _ := check(k, tg.Expr) // TestQueries reports the errors
				for _, n := range names {
					got[n] = true
				}
			}
			for _, n := range r.names {
				if !got[n] {
					t.Errorf("panel %s does not query %s", p.name(), n)
				}
			}
		})
	}
}

// parsed returns a panel's queries parsed, with the variables substituted;
// a query that does not parse is TestQueries' to report and is left out.
func parsed(p placed) []parser.Expr {
	var out []parser.Expr
	for _, tg := range p.Targets {
		s, err := substitute(tg.Expr)
		if err != nil {
			continue
		}
		if e, err := parser.ParseExpr(s); err == nil {
			out = append(out, e)
		}
	}
	return out
}

// selects reports whether e selects name with every label=value of eq as
// an equality matcher.
func selects(e parser.Node, name string, eq map[string]string) bool {
	found := false
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok || metricName(vs) != name {
			return nil
		}
		for l, v := range eq {
			if !slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
				return m.Name == l && m.Type == labels.MatchEqual && m.Value == v
			}) {
				return nil
			}
		}
		found = true
		return nil
	})
	return found
}

// quantileBy reports whether e has a histogram_quantile over name whose
// buckets are summed by label (and le): one line per value of label.
func quantileBy(e parser.Node, name, label string) bool {
	found := false
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		c, ok := n.(*parser.Call)
		if !ok || c.Func.Name != "histogram_quantile" || !selects(c.Args[1], name, nil) {
			return nil
		}
		aggs := outermost(c.Args[1])
		if len(aggs) > 0 && !slices.ContainsFunc(aggs, func(a *parser.AggregateExpr) bool {
			return a.Without || !slices.Contains(a.Grouping, label)
		}) {
			found = true
		}
		return nil
	})
	return found
}

// wantQuery is what one of a panel's queries must do, beyond the names
// TestRequired checks: the matcher that makes the panel what its title
// says, or the label its quantiles are split by.
type wantQuery struct {
	what  string
	match func(parser.Expr) bool
}

func selecting(name string, eq map[string]string) wantQuery {
	return wantQuery{fmt.Sprintf("select %s with %v", name, eq), func(e parser.Expr) bool { return selects(e, name, eq) }}
}

func quantilesBy(name, label string) wantQuery {
	return wantQuery{fmt.Sprintf("take histogram_quantile of %s summed by (le, %s)", name, label), func(e parser.Expr) bool { return quantileBy(e, name, label) }}
}

// requiredQueries are, by panel title, what some query of the panel must
// do. The completeness SLIs must not be mixed up: the real-time panels
// read the real-time rules and the eventual ones the eventual rules (the
// names checked by TestRequired), and the raw panels keep catch-up apart.
var requiredQueries = map[string][]wantQuery{
	"Deliveries: expected, pushed, recovered, lost, late (normal cohort)": {
		selecting("imcanary_deliveries_recovered_total", map[string]string{"cohort": "normal"}),
	},
	"Lost, late and recovered ratio by kind (normal cohort)": {
		selecting("imcanary_deliveries_recovered_total", map[string]string{"cohort": "normal"}),
	},
	"Recovered deliveries and late pushes by kind and source (normal cohort)": {
		selecting("imcanary_deliveries_recovered_total", map[string]string{"cohort": "normal"}),
		selecting("imcanary_deliveries_late_push_total", map[string]string{"cohort": "normal"}),
	},
	"Recovery latency p50 / p95 / p99 by kind": {
		quantilesBy("imcanary_recovery_latency_seconds_bucket", "kind"),
	},
	"Group fan-out time p50 / p99 by size class": {
		quantilesBy("imcanary_group_fanout_seconds_bucket", "size_class"),
	},
	"Conflict disconnects (another login of the same user)": {
		selecting("imcanary_session_disconnects_total", map[string]string{"reason": "conflict"}),
	},
	"Connect phase time p50 / p99 by phase": {
		quantilesBy("imcanary_connect_duration_seconds_bucket", "phase"),
	},
	"TLS session resumption": {
		selecting("imcanary_tls_handshakes_total", map[string]string{"resumed": "true"}),
	},
}

// TestRequiredQueries checks the queries of requiredQueries' panels.
func TestRequiredQueries(t *testing.T) {
	byTitle := map[string]placed{}
	for _, p := range flatten(load(t)) {
		byTitle[p.Title] = p
	}
	for _, title := range slices.Sorted(maps.Keys(requiredQueries)) {
		t.Run(title, func(t *testing.T) {
			p, ok := byTitle[title]
			if !ok {
				t.Fatalf("panel %q missing", title)
			}
			for _, w := range requiredQueries[title] {
				if !slices.ContainsFunc(parsed(p), w.match) {
					t.Errorf("panel %s: no query does %s", p.name(), w.what)
				}
			}
		})
	}
}

// TestWantQuery proves the helpers of requiredQueries catch the mistakes
// they are for.
func TestWantQuery(t *testing.T) {
	sel := `{target=~"$target", shard=~"$shard"}`
	conflict := selecting("imcanary_session_disconnects_total", map[string]string{"reason": "conflict"})
	fanout := quantilesBy("imcanary_group_fanout_seconds_bucket", "size_class")
	tests := []struct {
		w    wantQuery
		expr string
		want bool
	}{
		{conflict, `sum(rate(imcanary_session_disconnects_total{target=~"$target", shard=~"$shard", reason="conflict"}[5m]))`, true},
		{conflict, `sum by (reason) (rate(imcanary_session_disconnects_total` + sel + `[5m]))`, false},
		{conflict, `sum(rate(imcanary_session_disconnects_total{target=~"$target", shard=~"$shard", reason=~"conflict|churn"}[5m]))`, false},
		{conflict, `sum(rate(imcanary_session_connects_total{target=~"$target", shard=~"$shard", reason="conflict"}[5m]))`, false},
		{fanout, `histogram_quantile(0.99, sum by (le, size_class) (rate(imcanary_group_fanout_seconds_bucket` + sel + `[5m])))`, true},
		{fanout, `histogram_quantile(0.99, sum by (le) (rate(imcanary_group_fanout_seconds_bucket` + sel + `[5m])))`, false},
		{fanout, `histogram_quantile(0.99, sum by (le, size_class) (rate(imcanary_delivery_latency_seconds_bucket` + sel + `[5m])))`, false},
		{fanout, `histogram_quantile(0.99, rate(imcanary_group_fanout_seconds_bucket` + sel + `[5m]))`, false},
		{fanout, `sum by (size_class) (rate(imcanary_group_fanout_seconds_bucket` + sel + `[5m]))`, false},
	}
	for _, tt := range tests {
		s, err := substitute(tt.expr)
		if err != nil {
			t.Fatal(err)
		}
		e, err := parser.ParseExpr(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := tt.w.match(e); got != tt.want {
			t.Errorf("%s on %q = %v, want %v", tt.w.what, tt.expr, got, tt.want)
		}
	}
}

// sideBySide are the panels of the two completeness SLIs that must stand
// next to each other, real-time on the left, eventual on the right, in one
// line of the same height: the gap between them is what was late or
// recovered rather than lost.
var sideBySide = [][2]string{
	{"Real-time completeness SLI (1h)", "Eventual completeness SLI (1h)"},
	{"Error budget remaining (real-time completeness, 30d)", "Error budget remaining (eventual completeness, 30d)"},
	{"Real-time completeness SLI", "Eventual completeness SLI"},
	{"Real-time completeness burn rate", "Eventual completeness burn rate"},
}

// TestCompletenessSideBySide checks the layout sideBySide asks for.
func TestCompletenessSideBySide(t *testing.T) {
	byTitle := map[string]placed{}
	for _, p := range flatten(load(t)) {
		byTitle[p.Title] = p
	}
	for _, pair := range sideBySide {
		l, r := byTitle[pair[0]], byTitle[pair[1]]
		if l.GridPos == nil || r.GridPos == nil {
			t.Errorf("panels %q and %q: want both, with a gridPos", pair[0], pair[1])
			continue
		}
		a, b := *l.GridPos, *r.GridPos
		if l.row != r.row || l.Type != r.Type || a.Y != b.Y || a.H != b.H || a.X+a.W != b.X {
			t.Errorf("panels %s %+v and %s %+v: want the same type side by side, the real-time one just left of the eventual one", l.name(), a, r.name(), b)
		}
	}
}

// TestAnnotations checks the periods marked on every graph: when imcanary
// was saturated (the first thing to ask of a bad number is whether imcanary
// itself was starved), and when a soak run loaded the target on purpose.
func TestAnnotations(t *testing.T) {
	d := load(t)
	k := newKnown(t)
	for _, name := range []string{"imcanary_probe_saturated", "imcanary_soak_running"} {
		found := false
		for _, a := range d.Annotations.List {
			if a.BuiltIn != 0 || !a.Enable || !promDS(a.Datasource) {
				continue
			}
			if names, _ := check(k, a.Expr); slices.Contains(names, name) {
				found = true
			}
		}
		if !found {
			t.Errorf("no enabled annotation on %s from the ${datasource} variable", name)
		}
	}
}

// Per-second units: Grafana's throughput units, and custom ones ("count:",
// "suffix:", "si:") whose text ends in /s.
var perSecondUnits = []string{"cps", "ops", "reqps", "rps", "wps", "iops", "Bps", "bps", "binBps", "binbps"}

func perSecondUnit(u string) bool {
	if slices.Contains(perSecondUnits, u) {
		return true
	}
	kind, text, ok := strings.Cut(u, ":")
	return ok && (kind == "count" || kind == "suffix" || kind == "si") && strings.HasSuffix(strings.TrimSpace(text), "/s")
}

// perSecond reports whether a query's value is a rate per second: rate()
// or irate(), through what keeps the value (sum, min, max, avg, topk,
// bottomk and quantile; a filter, a comparison or and, or, unless, keeps
// its vector side; a sum of rates; a join that multiplies by group()'s 1).
// Divided by anything it is a ratio or another unit; multiplied by a
// number, per minute or per hour.
func perSecond(n parser.Node) bool {
	switch n := n.(type) {
	case *parser.ParenExpr:
		return perSecond(n.Expr)
	case *parser.UnaryExpr:
		return perSecond(n.Expr)
	case *parser.Call:
		return n.Func.Name == "rate" || n.Func.Name == "irate"
	case *parser.AggregateExpr:
		switch n.Op {
		case parser.SUM, parser.MIN, parser.MAX, parser.AVG, parser.TOPK, parser.BOTTOMK, parser.QUANTILE:
			return perSecond(n.Expr)
		}
	case *parser.BinaryExpr:
		switch {
		case n.Op.IsComparisonOperator():
			if _, lit := n.LHS.(*parser.NumberLiteral); lit {
				return !n.ReturnBool && perSecond(n.RHS)
			}
			return !n.ReturnBool && perSecond(n.LHS)
		case n.Op.IsSetOperator():
			return perSecond(n.LHS)
		case n.Op == parser.ADD || n.Op == parser.SUB:
			return perSecond(n.LHS) && perSecond(n.RHS)
		case n.Op == parser.MUL:
			return perSecond(n.LHS) && isGroup(n.RHS) || isGroup(n.LHS) && perSecond(n.RHS)
		}
	}
	return false
}

// isGroup reports whether n is a group() aggregation, whose value is 1.
func isGroup(n parser.Node) bool {
	for {
		p, ok := n.(*parser.ParenExpr)
		if !ok {
			break
		}
		n = p.Expr
	}
	a, ok := n.(*parser.AggregateExpr)
	return ok && a.Op == parser.GROUP
}

func TestPerSecond(t *testing.T) {
	tests := []struct {
		expr string
		want bool
	}{
		{`rate(x[5m])`, true},
		{`irate(x[5m])`, true},
		{`sum by (kind) (rate(x[5m]))`, true},
		{`max by (shard) (rate(x[5m])) > 0`, true},
		{`0 < sum(rate(x[5m]))`, true},
		{`rate(x[5m]) unless y`, true},
		{`rate(x[5m]) + rate(y[5m])`, true},
		{`rate(x[5m]) * on (instance) group_left (target) group by (instance, target) (y)`, true},
		{`rate(x[5m]) / rate(y[5m])`, false},
		{`rate(x[5m]) * 60`, false},
		{`rate(x[5m]) > bool 0`, false},
		{`count(rate(x[5m]))`, false},
		{`increase(x[1h])`, false},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))`, false},
		{`x`, false},
		{`time() - x`, false},
	}
	for _, tt := range tests {
		e, err := parser.ParseExpr(tt.expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := perSecond(e); got != tt.want {
			t.Errorf("perSecond(%q) = %v, want %v", tt.expr, got, tt.want)
		}
	}
	for u, want := range map[string]bool{"reqps": true, "ops": true, "count:msg/s": true, "suffix: msg/s": true, "short": false, "percentunit": false, "count:msg": false, "s": false, "cpm": false} {
		if got := perSecondUnit(u); got != want {
			t.Errorf("perSecondUnit(%q) = %v, want %v", u, got, want)
		}
	}
}

// legendRef matches a legend's {{label}} references.
var legendRef = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// unitOf returns the unit Grafana shows a query's series in: the panel's
// default, unless an override that picks the query (by its refId, or by
// the series' display name, its legend, by name or regexp) sets one. A
// legend's {{label}} stands for some value of the label.
func unitOf(t *testing.T, p panel, tg target) string {
	t.Helper()
	unit := p.FieldConfig.Defaults.Unit
	name := legendRef.ReplaceAllString(tg.LegendFormat, "v")
	for _, o := range p.FieldConfig.Overrides {
		var opt string
		if err := json.Unmarshal(o.Matcher.Options, &opt); err != nil {
			continue // not a matcher on a name
		}
		var picks bool
		switch o.Matcher.ID {
		case "byFrameRefID":
			picks = opt == tg.RefID
		case "byName":
			picks = opt == name
		case "byRegexp":
			re, err := regexp.Compile("^(?:" + opt + ")$")
			if err != nil {
				t.Errorf("panel %q: override regexp %q: %v", p.Title, opt, err)
				continue
			}
			picks = re.MatchString(name)
		}
		if !picks {
			continue
		}
		for _, pr := range o.Properties {
			if pr.ID == "unit" {
				if err := json.Unmarshal(pr.Value, &unit); err != nil {
					t.Errorf("panel %q: override unit %s: %v", p.Title, pr.Value, err)
				}
			}
		}
	}
	return unit
}

// TestUnits checks that every series showing a rate per second carries a
// per-second unit, and that no other series does: "short" on a rate
// leaves the reader to guess whether it is per second, per minute or per
// scrape, and a per-second unit on a ratio is wrong.
func TestUnits(t *testing.T) {
	rates := 0
	for _, p := range flatten(load(t)) {
		for _, tg := range p.Targets {
			s, err := substitute(tg.Expr)
			if err != nil {
				continue // TestQueries reports it
			}
			e, err := parser.ParseExpr(s)
			if err != nil {
				continue
			}
			unit := unitOf(t, p.panel, tg)
			switch rate := perSecond(e); {
			case rate && !perSecondUnit(unit):
				t.Errorf("panel %s query %s shows a rate per second in unit %q; want a per-second unit (%s, or count:…/s)", p.name(), tg.RefID, unit, strings.Join(perSecondUnits, ", "))
			case !rate && perSecondUnit(unit):
				t.Errorf("panel %s query %s is not a rate per second, but its unit is %q", p.name(), tg.RefID, unit)
			}
			if perSecond(e) {
				rates++
			}
		}
	}
	if rates == 0 {
		t.Errorf("no query of the dashboard is a rate: the check checked nothing")
	}
}

// objectiveValue returns the SLO objective the rules file records.
func objectiveValue(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != objective {
				continue
			}
			m := regexp.MustCompile(`^\s*vector\(([0-9.]+)\)\s*$`).FindStringSubmatch(r.Expr)
			if m == nil {
				t.Fatalf("%s = %q, want vector(number)", objective, r.Expr)
			}
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s records no %s", rulesFile, objective)
	return 0
}

// redBelow finds a description's promise of when a stat turns red.
var redBelow = regexp.MustCompile(`(?i)\bred below (?:the )?(\d+(?:\.\d+)?)%`)

// TestThresholds checks that a stat whose description says when it turns
// red has the thresholds that do so (red below the value, green from it),
// and that the SLI stats say it, at the objective of the rules.
func TestThresholds(t *testing.T) {
	obj := objectiveValue(t)
	slis := 0
	for _, p := range flatten(load(t)) {
		if p.Type != "stat" {
			continue
		}
		m := redBelow.FindStringSubmatch(p.Description)
		if strings.Contains(p.Title, "SLI") {
			slis++
			if m == nil {
				t.Errorf("stat %s: description does not say it is red below the %g%% objective", p.name(), obj*100)
				continue
			}
			if v, _ := strconv.ParseFloat(m[1], 64); math.Abs(v/100-obj) > 1e-9 {
				t.Errorf("stat %s: description says red below %s%%, the objective in %s is %g", p.name(), m[1], rulesFile, obj)
			}
		}
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		th := p.FieldConfig.Defaults.Thresholds
		if th == nil || th.Mode != "absolute" || len(th.Steps) != 2 ||
			th.Steps[0].Value != nil || th.Steps[0].Color != "red" ||
			th.Steps[1].Value == nil || math.Abs(*th.Steps[1].Value-v/100) > 1e-9 || th.Steps[1].Color != "green" {
			t.Errorf("stat %s: description says %q, want absolute thresholds red below %g and green from it, got %+v", p.name(), m[0], v/100, th)
		}
	}
	if slis == 0 {
		t.Errorf("no SLI stat found")
	}
}

// runbookBase returns the runbook's URL every alert's runbook_url starts
// with, and checks that it is this repository's docs/runbook.md.
func runbookBase(t *testing.T) (base string, alerts []string) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			u, _, _ := strings.Cut(r.Annotations["runbook_url"], "#")
			if base == "" {
				base = u
			} else if u != base {
				t.Errorf("%s: runbook_url starts %q, others %q", r.Alert, u, base)
			}
		}
	}
	const local = "docs/runbook.md"
	if !strings.HasSuffix(base, "/blob/main/"+local) {
		t.Fatalf("runbook URL %q is not the repository's %s", base, local)
	}
	if _, err := os.Stat("../../" + local); err != nil {
		t.Fatalf("runbook URL %q: %v", base, err)
	}
	return base, alerts
}

// statusLink matches the status page link: a scheme and a host variable.
var statusLink = regexp.MustCompile(`^\$\{?(\w+)\}?://\$\{?(\w+)\}?/$`)

// TestLinks checks the dashboard's links to the runbook and to a
// process's status page, and that every panel link into the runbook names
// an alert's section.
func TestLinks(t *testing.T) {
	d := load(t)
	base, alerts := runbookBase(t)
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	var runbook, status bool
	for _, l := range d.Links {
		if l.Type != "link" {
			continue
		}
		if l.URL == base {
			runbook = true
		}
		m := statusLink.FindStringSubmatch(l.URL)
		if m == nil {
			continue
		}
		status = true
		scheme, host := vars[m[1]], vars[m[2]]
		var opts string // a custom variable's query is its options, comma-separated
		json.Unmarshal(scheme.Query, &opts)
		if scheme.Type != "custom" || !slices.Equal(strings.Split(opts, ","), []string{"http", "https"}) {
			t.Errorf("status page link %q: variable %q is %+v, want a custom variable of http,https", l.URL, m[1], scheme)
		}
		// The status page is served at / on the address Prometheus
		// scrapes /metrics from, so the host is an instance, one.
		if lv := labelValues.FindStringSubmatch(host.Definition); host.Type != "query" || lv == nil || lv[2] != "instance" || host.Multi || host.IncludeAll {
			t.Errorf("status page link %q: variable %q is %+v, want a single-valued label_values(…, instance)", l.URL, m[2], host)
		}
	}
	if !runbook {
		t.Errorf("no dashboard link to the runbook %s", base)
	}
	if !status {
		t.Errorf("no dashboard link to a status page, ${scheme}://${instance}/")
	}
	for _, p := range flatten(d) {
		for _, l := range p.Links {
			u, frag, ok := strings.Cut(l.URL, "#")
			if u != base {
				continue
			}
			if !ok || !slices.ContainsFunc(alerts, func(a string) bool { return strings.ToLower(a) == frag }) {
				t.Errorf("panel %s: link %q is to no alert's section of the runbook", p.name(), l.URL)
			}
		}
	}
}

// TestLayout checks that no two panels overlap: Grafana would push one
// down, away from the row it was put in. A collapsed row's panels are laid
// out as they will be when it opens, apart from the rest.
func TestLayout(t *testing.T) {
	overlap := func(a, b *gridPos) bool {
		return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
	}
	var layout func(ps []panel)
	layout = func(ps []panel) {
		for i, a := range ps {
			for _, b := range ps[i+1:] {
				if a.GridPos != nil && b.GridPos != nil && overlap(a.GridPos, b.GridPos) {
					t.Errorf("panels %q %+v and %q %+v overlap", a.Title, *a.GridPos, b.Title, *b.GridPos)
				}
			}
			if a.Type == "row" && a.Collapsed {
				layout(a.Panels)
			}
		}
	}
	layout(load(t).Panels)
}

// exemplarHistograms are the histograms whose slow observations carry an
// exemplar naming their message (probe's ledger).
var exemplarHistograms = []string{"imcanary_delivery_latency_seconds_bucket", "imcanary_group_fanout_seconds_bucket"}

// TestExemplars: every query of a histogram that carries exemplars asks
// Grafana to draw them, so that a slow bucket leads to its messages from
// the panel, and no other query does (it would have none to draw).
func TestExemplars(t *testing.T) {
	d := load(t)
	k := newKnown(t)
	n := 0
	for _, p := range flatten(d) {
		for _, tg := range p.Targets {
			names, _ := check(k, tg.Expr)
			want := slices.ContainsFunc(names, func(n string) bool { return slices.Contains(exemplarHistograms, n) })
			if want {
				n++
			}
			if tg.Exemplar != want {
				t.Errorf("panel %s query %s: exemplar %v, want %v (exemplars are carried by %v)", p.name(), tg.RefID, tg.Exemplar, want, exemplarHistograms)
			}
		}
	}
	if n == 0 {
		t.Errorf("no panel queries %v", exemplarHistograms)
	}
}
