package rules

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

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

// matcherRE parses the only matcher form the configuration uses,
// name="value".
var matcherRE = regexp.MustCompile(`^(\w+)="([^"]*)"$`)

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

	// Every label set each alert was seen firing with.
	var fired []map[string]string
	for _, pt := range loadTests(t) {
		for _, tc := range pt.Tests {
			for _, a := range tc.AlertRuleTest {
				for _, e := range a.ExpAlerts {
					ls := map[string]string{"alertname": a.Alertname}
					for k, v := range e.ExpLabels {
						ls[k] = v
					}
					fired = append(fired, ls)
				}
			}
		}
	}
	matches := func(ls map[string]string, ms []string) bool {
		for _, m := range ms {
			sub := matcherRE.FindStringSubmatch(m)
			if sub == nil {
				t.Fatalf("matcher %q: only name=\"value\" is understood here", m)
			}
			if ls[sub[1]] != sub[2] {
				return false
			}
		}
		return true
	}

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
