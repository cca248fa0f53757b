package mongofix

import (
	"strings"

	"go.mongodb.org/mongo-driver/bson"
)

// projection is a find projection of plain paths, as MongoDB applies one
// to a document: inclusion ({a: 1, "b.c": 1}, _id kept unless excluded)
// or exclusion ({a: 0}). Operators ($slice, $elemMatch, $meta, the
// positional $) and expressions are not handled: parseProjection refuses
// them, and the command goes to FerretDB as it came.
type projection struct {
	include bool // else exclusion
	paths   pathTree
}

// pathTree maps a path's first segment to the rest; a nil subtree marks
// the end of a path.
type pathTree map[string]pathTree

func parseProjection(spec bson.D) (projection, bool) {
	paths := pathTree{}
	mode := 0 // 1 inclusion, -1 exclusion, 0 none but _id
	id := 0   // 1 _id listed on, -1 off, 0 not listed
	for _, e := range spec {
		on, ok := truth(e.Value)
		if !ok || e.Key == "" || strings.Contains(e.Key, "$") {
			return projection{}, false
		}
		m := -1
		if on {
			m = 1
		}
		if e.Key == "_id" {
			id = m
			continue
		}
		if mode != 0 && m != mode {
			return projection{}, false // MongoDB refuses a mix; FerretDB will say so
		}
		mode = m
		paths.add(e.Key)
	}
	if mode == 1 || (mode == 0 && id == 1) {
		if id != -1 {
			paths.add("_id")
		}
		return projection{include: true, paths: paths}, true
	}
	if id == -1 {
		paths.add("_id")
	}
	return projection{paths: paths}, true
}

func (t pathTree) add(path string) {
	segs := strings.Split(path, ".")
	for i, s := range segs {
		if i == len(segs)-1 {
			t[s] = nil // a shorter path wins over a longer one below it
			return
		}
		sub, seen := t[s]
		if seen && sub == nil {
			return
		}
		if sub == nil {
			sub = pathTree{}
			t[s] = sub
		}
		t = sub
	}
}

// truth reads a projection value as MongoDB does: a number or a bool.
func truth(v any) (on, ok bool) {
	switch x := v.(type) {
	case bool:
		return x, true
	case int32:
		return x != 0, true
	case int64:
		return x != 0, true
	case float64:
		return x != 0, true
	}
	return false, false
}

// apply projects doc.
func (p projection) apply(doc bson.D) bson.D {
	if p.include {
		return includePaths(doc, p.paths)
	}
	return excludePaths(doc, p.paths)
}

func includePaths(doc bson.D, t pathTree) bson.D {
	out := bson.D{}
	for _, e := range doc {
		sub, listed := t[e.Key]
		if !listed {
			continue
		}
		if sub == nil {
			out = append(out, e)
			continue
		}
		switch v := e.Value.(type) {
		case bson.D:
			out = append(out, bson.E{Key: e.Key, Value: includePaths(v, sub)})
		case bson.A:
			// A path into an array applies to each document in it; what
			// is not a document has no such field and is left out.
			arr := bson.A{}
			for _, x := range v {
				if d, ok := x.(bson.D); ok {
					arr = append(arr, includePaths(d, sub))
				}
			}
			out = append(out, bson.E{Key: e.Key, Value: arr})
		}
	}
	return out
}

func excludePaths(doc bson.D, t pathTree) bson.D {
	out := bson.D{}
	for _, e := range doc {
		sub, listed := t[e.Key]
		switch {
		case !listed:
			out = append(out, e)
		case sub == nil:
			// excluded
		default:
			switch v := e.Value.(type) {
			case bson.D:
				out = append(out, bson.E{Key: e.Key, Value: excludePaths(v, sub)})
			case bson.A:
				arr := bson.A{}
				for _, x := range v {
					if d, ok := x.(bson.D); ok {
						x = excludePaths(d, sub)
					}
					arr = append(arr, x)
				}
				out = append(out, bson.E{Key: e.Key, Value: arr})
			default:
				out = append(out, e)
			}
		}
	}
	return out
}
