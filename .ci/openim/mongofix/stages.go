package mongofix

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/bson"
)

// A stage is one step of a pipeline that mongofix runs itself: $addFields
// (and its alias $set), $unset and $project, each on one document.
type stage struct {
	name string
	spec any
}

// parseStages reads a pipeline of stages mongofix can run. It reports
// whether any uses an expression operator: a pipeline that uses none is
// one FerretDB runs itself.
func parseStages(raw bson.A) (stages []stage, uses bool, err error) {
	for _, x := range raw {
		d, ok := x.(bson.D)
		if !ok || len(d) != 1 {
			return nil, false, fmt.Errorf("%w: a stage that is not a one-field document", errUnsupported)
		}
		st := stage{name: d[0].Key, spec: d[0].Value}
		switch st.name {
		case "$addFields", "$set", "$project":
			spec, ok := st.spec.(bson.D)
			if !ok {
				return nil, false, fmt.Errorf("%s specification must be an object", st.name)
			}
			for _, f := range spec {
				if st.name == "$project" {
					if _, plain := truth(f.Value); plain {
						continue
					}
				}
				u, err := checkExpr(f.Value)
				if err != nil {
					return nil, false, err
				}
				uses = uses || u
			}
		case "$unset":
			if _, err := unsetPaths(st.spec); err != nil {
				return nil, false, err
			}
		default:
			return nil, false, fmt.Errorf("%w: stage %s", errUnsupported, st.name)
		}
		stages = append(stages, st)
	}
	return stages, uses, nil
}

func unsetPaths(spec any) ([]string, error) {
	switch v := spec.(type) {
	case string:
		return []string{v}, nil
	case bson.A:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("$unset specification must be a string or an array of strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("$unset specification must be a string or an array of strings")
}

// runStages passes doc through stages.
func runStages(doc bson.D, stages []stage) (bson.D, error) {
	for _, st := range stages {
		var err error
		switch st.name {
		case "$addFields", "$set":
			doc, err = addFields(doc, st.spec.(bson.D))
		case "$unset":
			paths, _ := unsetPaths(st.spec)
			t := pathTree{}
			for _, p := range paths {
				t.add(p)
			}
			doc = excludePaths(doc, t)
		case "$project":
			doc, err = project(doc, st.spec.(bson.D))
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", st.name, err)
		}
	}
	return doc, nil
}

// addFields evaluates every expression against the stage's input, then
// sets each field (a dotted path sets a field inside documents).
func addFields(doc bson.D, spec bson.D) (bson.D, error) {
	s := scope{root: doc}
	vals := make([]any, len(spec))
	for i, f := range spec {
		v, err := eval(f.Value, s)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	out := append(bson.D{}, doc...)
	for i, f := range spec {
		out = setPath(out, strings.Split(f.Key, "."), vals[i])
	}
	return out, nil
}

// setPath sets segs in doc to v (a missing v removes the field), keeping
// the field's place when it exists.
func setPath(doc bson.D, segs []string, v any) bson.D {
	i := index(doc, segs[0])
	if len(segs) > 1 {
		sub := bson.D{}
		if i >= 0 {
			if d, ok := doc[i].Value.(bson.D); ok {
				sub = append(bson.D{}, d...)
			}
		}
		v = setPath(sub, segs[1:], v)
	}
	_, gone := v.(missing)
	switch {
	case i >= 0 && gone:
		return append(doc[:i:i], doc[i+1:]...)
	case i >= 0:
		doc[i].Value = v
	case !gone:
		doc = append(doc, bson.E{Key: segs[0], Value: v})
	}
	return doc
}

// project is the $project stage: plain inclusions and exclusions as a find
// projection has them, and computed fields after the included ones.
func project(doc bson.D, spec bson.D) (bson.D, error) {
	var plain bson.D
	var computed bson.D
	for _, f := range spec {
		if _, ok := truth(f.Value); ok {
			plain = append(plain, f)
		} else {
			computed = append(computed, f)
		}
	}
	if len(computed) > 0 {
		// Computed fields make it an inclusion: listing _id alone (or
		// nothing) keeps _id and nothing else of the document.
		if index(plain, "_id") < 0 {
			plain = append(plain, bson.E{Key: "_id", Value: int32(1)})
		}
		for _, f := range plain {
			if on, _ := truth(f.Value); !on && f.Key != "_id" {
				return nil, fmt.Errorf("cannot do exclusion on field %s in inclusion projection", f.Key)
			}
		}
	}
	p, ok := parseProjection(plain)
	if !ok {
		return nil, fmt.Errorf("%w: projection %v", errUnsupported, plain)
	}
	if len(computed) > 0 && !p.include {
		// {_id: 0} and computed fields: an inclusion of nothing.
		p = projection{include: true, paths: pathTree{}}
	}
	out := p.apply(doc)
	s := scope{root: doc}
	for _, f := range computed {
		v, err := eval(f.Value, s)
		if err != nil {
			return nil, err
		}
		out = setPath(out, strings.Split(f.Key, "."), v)
	}
	return out, nil
}
