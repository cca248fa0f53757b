package rules

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite "+prometheusRuleFile+" from "+rulesFile)

const prometheusRuleFile = "../kubernetes/prometheusrule.yaml"

// prometheusRuleHeader opens the generated manifest.
const prometheusRuleHeader = `# Generated from deploy/prometheus/imcanary-rules.yml; do not edit. Change
# that file and run: (cd deploy && go test ./prometheus -run TestPrometheusRule -update)
#
# For the Prometheus Operator. The Prometheus must select this object: many
# installations only pick up rules carrying their own labels (kube-prometheus:
# prometheus: k8s and role: alert-rules; kube-prometheus-stack: its release
# label); add them under metadata.labels in your overlay.
`

// prometheusRule wraps the groups of a rules file in a PrometheusRule
// (monitoring.coreos.com/v1). It works on the YAML node tree, so the
// groups keep their comments, order and string styles: the manifest reads
// like the file it comes from.
func prometheusRule(src []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("rules: not a YAML mapping")
	}
	var groups *yaml.Node
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "groups" {
			groups = root.Content[i+1]
		} else {
			return nil, fmt.Errorf("rules: unexpected key %q", root.Content[i].Value)
		}
	}
	if groups == nil {
		return nil, fmt.Errorf("rules: no groups")
	}
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
	mapping := func(kv ...*yaml.Node) *yaml.Node {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: kv}
	}
	out := mapping(
		str("apiVersion"), str("monitoring.coreos.com/v1"),
		str("kind"), str("PrometheusRule"),
		str("metadata"), mapping(
			str("name"), str("imcanary"),
			str("labels"), mapping(
				str("app.kubernetes.io/name"), str("imcanary"),
			),
		),
		str("spec"), mapping(str("groups"), groups),
	)
	var b bytes.Buffer
	b.WriteString(prometheusRuleHeader)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// TestPrometheusRule keeps deploy/kubernetes/prometheusrule.yaml what the
// generator makes of the rules file: a golden file, rewritten with
// -update.
func TestPrometheusRule(t *testing.T) {
	got, err := prometheusRule(readRulesFile(t))
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(prometheusRuleFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatalf("%v (generate it: (cd deploy && go test ./prometheus -run TestPrometheusRule -update))", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what %s generates; run: (cd deploy && go test ./prometheus -run TestPrometheusRule -update)", prometheusRuleFile, rulesFile)
	}

	// Whatever the formatting, the manifest must hold exactly the rules.
	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec ruleFile `yaml:"spec"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(got))
	dec.KnownFields(true)
	if err := dec.Decode(&pr); err != nil {
		t.Fatalf("generated PrometheusRule: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Name == "" {
		t.Errorf("generated manifest is %s %s %q, want a named monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind, pr.Metadata.Name)
	}
	if src := loadRules(t); !reflect.DeepEqual(pr.Spec, src) {
		t.Errorf("generated PrometheusRule's groups differ from %s", rulesFile)
	}
}
