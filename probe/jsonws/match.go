package jsonws

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// A rule is a match rule of the mapping: paths and what each must hold,
// all of them. It is compiled once; a rule whose values are templates
// (a login step's "{{.ID}}") is bound to a request before it is used.

// Operators of a condition.
const (
	opPresent  = iota // "*": any value but null
	opEqual           // a literal
	opPrefix          // "abc*"
	opRange           // "200..299"
	opTemplate        // "{{.ID}}": equal to the rendered template
	opEmpty           // "{}" or "[]": an empty object or array
)

type cond struct {
	path   string
	slot   int
	op     int
	lit    []byte
	lo, hi uint64
	tmpl   *template
}

type rule struct {
	// key is where the rule is in the configuration, for traces.
	key   string
	conds []cond
}

// compileRule compiles the rule at key from its configuration: a mapping of
// paths to values, nested or dotted ({ctrl: {id: x}} and {ctrl.id: x} are
// the same rule). Templates are allowed only at a site that has one.
func compileRule(c *compiler, key string, v any, s site) *rule {
	m, ok := v.(map[string]any)
	if !ok {
		c.fail(key, v, "must be a mapping of paths to values")
		return nil
	}
	if len(m) == 0 {
		c.fail(key, v, "must name at least one path")
		return nil
	}
	r := &rule{key: key}
	flat := map[string]any{}
	flatten(flat, "", m)
	for _, p := range slices.Sorted(maps.Keys(flat)) {
		ckey := key + "." + p
		slot, err := c.dec.path(p)
		if err != nil {
			c.fail(ckey, p, "%v", err)
			continue
		}
		cd := cond{path: p, slot: slot}
		var val string
		switch x := flat[p].(type) {
		case string:
			val = x
		case bool:
			val = strconv.FormatBool(x)
		case nil:
			val = "null"
		case int, int64, uint64, float64:
			val = fmt.Sprint(x)
		case map[string]any:
			// {} in YAML: flatten keeps only an empty mapping.
			val = "{}"
		case []any:
			if len(x) > 0 {
				c.fail(ckey, x, "a list matches only as [] (empty): name an element's path, such as %s.0", p)
				continue
			}
			val = "[]"
		default:
			c.fail(ckey, x, "must be a string, a number or a boolean")
			continue
		}
		switch {
		case val == "*":
			cd.op = opPresent
		case val == "{}" || val == "[]":
			// An empty object or array, whatever spaces are in it:
			// as a string it would never equal a JSON value.
			cd.op, cd.lit = opEmpty, []byte(val)
		case strings.Contains(val, "{{"):
			if s == nil {
				c.fail(ckey, val, "templates are not allowed here: the rule is checked against every frame")
				continue
			}
			t, err := parseTemplate(val, s, c.attrs)
			if err != nil {
				c.fail(ckey, val, "%v", err)
				continue
			}
			cd.op, cd.tmpl = opTemplate, t
			// The value is compared as the field's content: a
			// template renders without the quotes of a JSON string.
			for i := range t.parts {
				if t.parts[i].act != nil {
					t.parts[i].act.inString = true
				}
			}
		case isRange(val):
			lo, hi, _ := parseRange(val)
			if lo > hi {
				c.fail(ckey, val, "range %s is empty", val)
				continue
			}
			cd.op, cd.lo, cd.hi = opRange, lo, hi
		case strings.HasSuffix(val, "*") && !strings.HasSuffix(val, `\*`):
			cd.op, cd.lit = opPrefix, []byte(strings.TrimSuffix(val, "*"))
		default:
			cd.op, cd.lit = opEqual, []byte(strings.ReplaceAll(val, `\*`, "*"))
		}
		r.conds = append(r.conds, cd)
	}
	return r
}

// flatten turns nested mappings into dotted paths.
func flatten(dst map[string]any, prefix string, m map[string]any) {
	for k, v := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			flatten(dst, p, sub)
			continue
		}
		dst[p] = v
	}
}

func isRange(s string) bool {
	_, _, ok := parseRange(s)
	return ok
}

func parseRange(s string) (lo, hi uint64, ok bool) {
	a, b, found := strings.Cut(s, "..")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(a, 10, 64)
	hi, err2 := strconv.ParseUint(b, 10, 64)
	return lo, hi, err1 == nil && err2 == nil
}

// match reports whether m satisfies every condition of r. A rule with
// templates must be bound first.
func (r *rule) match(m *msg) bool {
	if r == nil {
		return false
	}
	for i := range r.conds {
		if !r.conds[i].holds(m) {
			return false
		}
	}
	return true
}

func (cd *cond) holds(m *msg) bool {
	v := m.vals[cd.slot]
	if !v.present() {
		return false
	}
	switch cd.op {
	case opPresent:
		return true
	case opEqual, opTemplate:
		return (v.kind != kindObject && v.kind != kindArray) && bytes.Equal(v.b, cd.lit)
	case opPrefix:
		return v.kind == kindString && bytes.HasPrefix(v.b, cd.lit)
	case opRange:
		n, ok := v.uint()
		return ok && cd.lo <= n && n <= cd.hi
	case opEmpty:
		return (cd.lit[0] == '{' && v.kind == kindObject || cd.lit[0] == '[' && v.kind == kindArray) &&
			len(bytes.TrimSpace(v.b[1:len(v.b)-1])) == 0
	}
	return false
}

// bind returns r with its templates rendered with e: the rule one request
// waits for. A rule without templates is returned as it is.
func (r *rule) bind(e *env) (*rule, error) {
	if r == nil {
		return nil, nil
	}
	if !slices.ContainsFunc(r.conds, func(c cond) bool { return c.op == opTemplate }) {
		return r, nil
	}
	b := &rule{key: r.key, conds: slices.Clone(r.conds)}
	for i := range b.conds {
		cd := &b.conds[i]
		if cd.op != opTemplate {
			continue
		}
		lit, err := cd.tmpl.render(nil, e)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", r.key, cd.path, err)
		}
		cd.lit = lit
	}
	return b, nil
}

// String describes the rule for traces: "ctrl.id=7 ctrl.code=200..299".
func (r *rule) String() string {
	if r == nil {
		return "(none)"
	}
	var parts []string
	for _, cd := range r.conds {
		var v string
		switch cd.op {
		case opPresent:
			v = "*"
		case opRange:
			v = fmt.Sprintf("%d..%d", cd.lo, cd.hi)
		case opPrefix:
			v = string(cd.lit) + "*"
		case opTemplate:
			if cd.lit == nil {
				v = cd.tmpl.src
			} else {
				v = string(cd.lit)
			}
		default:
			v = string(cd.lit)
		}
		parts = append(parts, cd.path+"="+v)
	}
	return strings.Join(parts, " ")
}
