package mongofix

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
)

func TestProjection(t *testing.T) {
	doc := bson.D{
		{Key: "_id", Value: "c1"},
		{Key: "max_seq", Value: int64(7)},
		{Key: "min_seq", Value: int64(0)},
		{Key: "logs", Value: bson.A{
			bson.D{{Key: "e_id", Value: "u1"}, {Key: "version", Value: int64(3)}},
			"scalar",
		}},
		{Key: "meta", Value: bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(2)}}},
	}
	for _, tc := range []struct {
		name string
		spec bson.D
		want bson.D
	}{
		{"OpenIM's seq Malloc", bson.D{{Key: "_id", Value: int32(0)}, {Key: "max_seq", Value: int32(1)}},
			bson.D{{Key: "max_seq", Value: int64(7)}}},
		{"inclusion keeps _id", bson.D{{Key: "max_seq", Value: true}},
			bson.D{{Key: "_id", Value: "c1"}, {Key: "max_seq", Value: int64(7)}}},
		{"_id alone", bson.D{{Key: "_id", Value: int32(1)}},
			bson.D{{Key: "_id", Value: "c1"}}},
		{"exclusion, OpenIM's version log", bson.D{{Key: "logs", Value: int32(0)}},
			bson.D{doc[0], doc[1], doc[2], doc[4]}},
		{"exclusion of _id only", bson.D{{Key: "_id", Value: false}},
			doc[1:]},
		{"empty keeps all", bson.D{}, doc},
		{"dotted inclusion into a document", bson.D{{Key: "meta.b", Value: int32(1)}, {Key: "_id", Value: int32(0)}},
			bson.D{{Key: "meta", Value: bson.D{{Key: "b", Value: int32(2)}}}}},
		{"dotted inclusion into an array drops scalars", bson.D{{Key: "logs.e_id", Value: 1.0}, {Key: "_id", Value: int32(0)}},
			bson.D{{Key: "logs", Value: bson.A{bson.D{{Key: "e_id", Value: "u1"}}}}}},
		{"dotted exclusion into an array keeps scalars", bson.D{{Key: "logs.version", Value: int32(0)}, {Key: "meta", Value: int32(0)}},
			bson.D{doc[0], doc[1], doc[2], {Key: "logs", Value: bson.A{bson.D{{Key: "e_id", Value: "u1"}}, "scalar"}}}},
		{"a shorter path wins", bson.D{{Key: "meta", Value: int32(1)}, {Key: "meta.a", Value: int32(1)}},
			bson.D{doc[0], doc[4]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := parseProjection(tc.spec)
			if !ok {
				t.Fatalf("parseProjection(%v) refused", tc.spec)
			}
			got := p.apply(doc)
			a, _ := bson.MarshalExtJSON(got, false, false)
			b, _ := bson.MarshalExtJSON(tc.want, false, false)
			if string(a) != string(b) {
				t.Errorf("got  %s\nwant %s", a, b)
			}
		})
	}
}

// Projections mongofix does not apply itself go to FerretDB as they came.
func TestProjectionRefused(t *testing.T) {
	for _, spec := range []bson.D{
		{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(0)}},
		{{Key: "logs", Value: bson.D{{Key: "$slice", Value: int32(2)}}}},
		{{Key: "logs.$", Value: int32(1)}},
		{{Key: "a", Value: "$b"}},
	} {
		if _, ok := parseProjection(spec); ok {
			t.Errorf("parseProjection(%v) accepted", spec)
		}
	}
}
