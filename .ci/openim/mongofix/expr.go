package mongofix

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"strings"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// This file evaluates the aggregation expressions and stages OpenIM v3.8.3
// sends that FerretDB v1 does not evaluate (its only expression operators
// are $sum and $type): those of its version logs' update pipeline and
// change-log query, and of its pull of messages by seq. An operator
// outside the list makes the command go to FerretDB as it came.

// missing is the value of a path that leads nowhere: unlike null, a field
// set to it is left out.
type missing struct{}

// operators are the expression operators evaluated here.
var operators = map[string]bool{
	"$add": true, "$and": true, "$arrayElemAt": true, "$concatArrays": true, "$cond": true,
	"$eq": true, "$filter": true, "$gt": true, "$gte": true, "$in": true, "$literal": true,
	"$lt": true, "$lte": true, "$map": true, "$ne": true, "$not": true, "$or": true, "$size": true,
}

// errUnsupported marks what is not evaluated here.
var errUnsupported = errors.New("not evaluated by mongofix")

// checkExpr reports whether every operator in e is one evaluated here,
// and whether e uses one at all.
func checkExpr(e any) (uses bool, err error) {
	switch v := e.(type) {
	case bson.D:
		if op, ok := operatorOf(v); ok {
			if !operators[op] {
				return false, fmt.Errorf("%w: operator %s", errUnsupported, op)
			}
			if op == "$literal" {
				return true, nil
			}
			_, err := checkExpr(v[0].Value)
			return true, err
		}
		for _, f := range v {
			u, err := checkExpr(f.Value)
			if err != nil {
				return false, err
			}
			uses = uses || u
		}
	case bson.A:
		for _, x := range v {
			u, err := checkExpr(x)
			if err != nil {
				return false, err
			}
			uses = uses || u
		}
	case string:
		// A field path or a variable is evaluated here too.
		return strings.HasPrefix(v, "$"), nil
	}
	return uses, nil
}

func operatorOf(d bson.D) (string, bool) {
	if len(d) == 1 && strings.HasPrefix(d[0].Key, "$") {
		return d[0].Key, true
	}
	return "", false
}

// scope is what an expression sees: the document and the variables bound
// by $filter and $map.
type scope struct {
	root bson.D
	vars map[string]any
}

func (s scope) with(name string, v any) scope {
	vars := make(map[string]any, len(s.vars)+1)
	for k, x := range s.vars {
		vars[k] = x
	}
	vars[name] = v
	return scope{root: s.root, vars: vars}
}

func eval(e any, s scope) (any, error) {
	switch v := e.(type) {
	case string:
		switch {
		case strings.HasPrefix(v, "$$"):
			name, rest, _ := strings.Cut(v[2:], ".")
			var x any
			switch name {
			case "ROOT", "CURRENT":
				x = s.root
			default:
				var ok bool
				if x, ok = s.vars[name]; !ok {
					return nil, fmt.Errorf("use of undefined variable: %s", name)
				}
			}
			if rest == "" {
				return x, nil
			}
			return path(x, rest), nil
		case strings.HasPrefix(v, "$"):
			return path(s.root, v[1:]), nil
		}
		return v, nil
	case bson.D:
		if op, ok := operatorOf(v); ok {
			return apply(op, v[0].Value, s)
		}
		out := bson.D{}
		for _, f := range v {
			x, err := eval(f.Value, s)
			if err != nil {
				return nil, err
			}
			if _, gone := x.(missing); !gone {
				out = append(out, bson.E{Key: f.Key, Value: x})
			}
		}
		return out, nil
	case bson.A:
		out := make(bson.A, 0, len(v))
		for _, x := range v {
			y, err := eval(x, s)
			if err != nil {
				return nil, err
			}
			if _, gone := y.(missing); gone {
				y = nil
			}
			out = append(out, y)
		}
		return out, nil
	}
	return e, nil
}

// path follows a dotted path from x; through an array it collects the
// path's value in each element, as MongoDB does.
func path(x any, p string) any {
	for _, seg := range strings.Split(p, ".") {
		switch v := x.(type) {
		case bson.D:
			i := index(v, seg)
			if i < 0 {
				return missing{}
			}
			x = v[i].Value
		case bson.A:
			out := bson.A{}
			for _, el := range v {
				if d, ok := el.(bson.D); ok {
					if y := path(d, seg); y != (missing{}) {
						out = append(out, y)
					}
				}
			}
			x = out
		default:
			return missing{}
		}
	}
	return x
}

// args evaluates an operator's argument list (a lone value is a list of
// one).
func args(raw any, s scope) ([]any, error) {
	list, ok := raw.(bson.A)
	if !ok {
		list = bson.A{raw}
	}
	out := make([]any, len(list))
	for i, x := range list {
		v, err := eval(x, s)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func nArgs(op string, raw any, s scope, n int) ([]any, error) {
	a, err := args(raw, s)
	if err == nil && len(a) != n {
		err = fmt.Errorf("expression %s takes exactly %d arguments. %d were passed in", op, n, len(a))
	}
	return a, err
}

// named reads an operator's document argument ({input, as, cond}, …).
func named(op string, raw any, known ...string) (map[string]any, error) {
	d, ok := raw.(bson.D)
	if !ok {
		return nil, fmt.Errorf("%s only supports an object as its argument", op)
	}
	m := map[string]any{}
	for _, f := range d {
		found := false
		for _, k := range known {
			found = found || k == f.Key
		}
		if !found {
			return nil, fmt.Errorf("%w: %s with argument %s", errUnsupported, op, f.Key)
		}
		m[f.Key] = f.Value
	}
	return m, nil
}

func apply(op string, raw any, s scope) (any, error) {
	switch op {
	case "$literal":
		return raw, nil
	case "$add":
		a, err := args(raw, s)
		if err != nil {
			return nil, err
		}
		return add(a)
	case "$and", "$or":
		a, err := args(raw, s)
		if err != nil {
			return nil, err
		}
		for _, x := range a {
			if truthy(x) == (op == "$or") {
				return op == "$or", nil
			}
		}
		return op == "$and", nil
	case "$not":
		a, err := nArgs(op, raw, s, 1)
		if err != nil {
			return nil, err
		}
		return !truthy(a[0]), nil
	case "$eq", "$ne", "$lt", "$lte", "$gt", "$gte":
		a, err := nArgs(op, raw, s, 2)
		if err != nil {
			return nil, err
		}
		c := compare(a[0], a[1])
		return map[string]bool{"$eq": c == 0, "$ne": c != 0, "$lt": c < 0, "$lte": c <= 0, "$gt": c > 0, "$gte": c >= 0}[op], nil
	case "$in":
		a, err := nArgs(op, raw, s, 2)
		if err != nil {
			return nil, err
		}
		arr, ok := a[1].(bson.A)
		if !ok {
			return nil, errors.New("$in requires an array as a second argument")
		}
		for _, x := range arr {
			if compare(a[0], x) == 0 {
				return true, nil
			}
		}
		return false, nil
	case "$size":
		a, err := nArgs(op, raw, s, 1)
		if err != nil {
			return nil, err
		}
		arr, ok := a[0].(bson.A)
		if !ok {
			return nil, errors.New("the argument to $size must be an array")
		}
		return int32(len(arr)), nil
	case "$arrayElemAt":
		a, err := nArgs(op, raw, s, 2)
		if err != nil {
			return nil, err
		}
		if isNullish(a[0]) || isNullish(a[1]) {
			return nil, nil
		}
		arr, ok := a[0].(bson.A)
		if !ok {
			return nil, errors.New("$arrayElemAt's first argument must be an array")
		}
		i, ok := integral(a[1])
		if !ok {
			return nil, errors.New("$arrayElemAt's second argument must be a 32-bit integer")
		}
		if i < 0 {
			i += int64(len(arr))
		}
		if i < 0 || i >= int64(len(arr)) {
			return missing{}, nil
		}
		return arr[i], nil
	case "$concatArrays":
		a, err := args(raw, s)
		if err != nil {
			return nil, err
		}
		out := bson.A{}
		for _, x := range a {
			if isNullish(x) {
				return nil, nil
			}
			arr, ok := x.(bson.A)
			if !ok {
				return nil, errors.New("$concatArrays only supports arrays")
			}
			out = append(out, arr...)
		}
		return out, nil
	case "$cond":
		var parts []any
		if list, ok := raw.(bson.A); ok && len(list) == 3 {
			parts = list
		} else {
			m, err := named(op, raw, "if", "then", "else")
			if err != nil {
				return nil, err
			}
			parts = []any{m["if"], m["then"], m["else"]}
		}
		c, err := eval(parts[0], s)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return eval(parts[1], s)
		}
		return eval(parts[2], s)
	case "$filter", "$map":
		body := "cond"
		if op == "$map" {
			body = "in"
		}
		m, err := named(op, raw, "input", "as", body)
		if err != nil {
			return nil, err
		}
		in, err := eval(m["input"], s)
		if err != nil {
			return nil, err
		}
		if isNullish(in) {
			return nil, nil
		}
		arr, ok := in.(bson.A)
		if !ok {
			return nil, fmt.Errorf("input to %s must be an array", op)
		}
		as, _ := m["as"].(string)
		if as == "" {
			as = "this"
		}
		out := bson.A{}
		for _, x := range arr {
			v, err := eval(m[body], s.with(as, x))
			if err != nil {
				return nil, err
			}
			switch {
			case op == "$map":
				if _, gone := v.(missing); gone {
					v = nil
				}
				out = append(out, v)
			case truthy(v):
				out = append(out, x)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: operator %s", errUnsupported, op)
}

func isNullish(x any) bool {
	switch x.(type) {
	case nil, missing, primitive.Undefined:
		return true
	}
	return false
}

func truthy(x any) bool {
	switch v := x.(type) {
	case nil, missing, primitive.Undefined:
		return false
	case bool:
		return v
	case int32:
		return v != 0
	case int64:
		return v != 0
	case float64:
		return v != 0
	}
	return true
}

func integral(x any) (int64, bool) {
	switch v := x.(type) {
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case float64:
		if v == math.Trunc(v) {
			return int64(v), true
		}
	}
	return 0, false
}

// add sums numbers, keeping the widest type of its arguments as MongoDB
// does (int32, then int64 on overflow or an int64 argument, then double);
// one date among them makes the sum a date, its milliseconds moved.
func add(a []any) (any, error) {
	var (
		i64    int64
		f64    float64
		wide   = 0 // 0 int32, 1 int64, 2 double
		date   bool
		nulled bool
	)
	for _, x := range a {
		switch v := x.(type) {
		case nil, missing, primitive.Undefined:
			nulled = true
		case int32:
			i64 += int64(v)
			f64 += float64(v)
		case int64:
			i64 += v
			f64 += float64(v)
			wide = max(wide, 1)
		case float64:
			f64 += v
			wide = 2
		case primitive.DateTime:
			if date {
				return nil, errors.New("only one date allowed in an $add expression")
			}
			date = true
			i64 += int64(v)
			f64 += float64(v)
		default:
			return nil, fmt.Errorf("$add only supports numeric or date types, not %T", x)
		}
	}
	switch {
	case nulled:
		return nil, nil
	case date:
		if wide == 2 {
			return primitive.DateTime(int64(math.Round(f64))), nil
		}
		return primitive.DateTime(i64), nil
	case wide == 2:
		return f64, nil
	case wide == 0 && i64 >= math.MinInt32 && i64 <= math.MaxInt32:
		return int32(i64), nil
	}
	return i64, nil
}

// rank orders BSON types as MongoDB compares them.
func rank(x any) int {
	switch x.(type) {
	case missing:
		return 0
	case nil, primitive.Undefined:
		return 1
	case int32, int64, float64, primitive.Decimal128:
		return 3
	case string, primitive.Symbol:
		return 4
	case bson.D:
		return 5
	case bson.A:
		return 6
	case primitive.Binary:
		return 7
	case primitive.ObjectID:
		return 8
	case bool:
		return 9
	case primitive.DateTime:
		return 10
	case primitive.Timestamp:
		return 11
	case primitive.Regex:
		return 12
	}
	return 13
}

// compare orders a and b as MongoDB's aggregation comparisons do, for the
// types OpenIM's documents hold.
func compare(a, b any) int {
	ra, rb := rank(a), rank(b)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch x := a.(type) {
	case int32, int64, float64:
		// Integers compare exactly: a seq past 2^53 still orders right.
		ia, aInt := a.(int64)
		ib, bInt := b.(int64)
		if x32, ok := a.(int32); ok {
			ia, aInt = int64(x32), true
		}
		if y32, ok := b.(int32); ok {
			ib, bInt = int64(y32), true
		}
		if aInt && bInt {
			return cmp.Compare(ia, ib)
		}
		fa, _ := number(a)
		fb, _ := number(b)
		switch {
		case fa < fb:
			return -1
		case fa > fb:
			return 1
		}
		return 0
	case string:
		return strings.Compare(x, b.(string))
	case bool:
		y := b.(bool)
		switch {
		case x == y:
			return 0
		case !x:
			return -1
		}
		return 1
	case primitive.DateTime:
		return cmp.Compare(int64(x), int64(b.(primitive.DateTime)))
	case primitive.ObjectID:
		return strings.Compare(x.Hex(), b.(primitive.ObjectID).Hex())
	case bson.A:
		y := b.(bson.A)
		for i := 0; i < len(x) && i < len(y); i++ {
			if c := compare(x[i], y[i]); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(x), len(y))
	case bson.D:
		y := b.(bson.D)
		for i := 0; i < len(x) && i < len(y); i++ {
			if c := strings.Compare(x[i].Key, y[i].Key); c != 0 {
				return c
			}
			if c := compare(x[i].Value, y[i].Value); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(x), len(y))
	case nil, missing, primitive.Undefined:
		return 0
	}
	ab, _ := bson.Marshal(bson.D{{Key: "v", Value: a}})
	bb, _ := bson.Marshal(bson.D{{Key: "v", Value: b}})
	return strings.Compare(string(ab), string(bb))
}

func number(x any) (float64, bool) {
	switch v := x.(type) {
	case int32:
		return float64(v), true
	case int64:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}
