package mongofix

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

func ext(t *testing.T, v any) string {
	t.Helper()
	b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEval(t *testing.T) {
	doc := bson.D{
		{Key: "version", Value: int64(4)},
		{Key: "n32", Value: int32(2)},
		{Key: "deleted", Value: int32(0)},
		{Key: "at", Value: primitive.DateTime(1000)},
		{Key: "logs", Value: bson.A{
			bson.D{{Key: "e_id", Value: "a"}, {Key: "version", Value: int64(1)}},
			bson.D{{Key: "e_id", Value: "b"}, {Key: "version", Value: int64(3)}},
			bson.D{{Key: "e_id", Value: "c"}, {Key: "version", Value: int64(5)}},
		}},
		{Key: "msgs", Value: bson.A{"m0", "m1", "m2"}},
	}
	op := func(name string, arg any) bson.D { return bson.D{{Key: name, Value: arg}} }
	for _, tc := range []struct {
		name string
		expr any
		want any
	}{
		{"field path", "$version", int64(4)},
		{"path through an array", "$logs.e_id", bson.A{"a", "b", "c"}},
		{"missing path", "$nope", missing{}},
		{"literal string", "plain", "plain"},
		{"$add keeps int64", op("$add", bson.A{"$version", int32(1)}), int64(5)},
		{"$add of int32 stays int32", op("$add", bson.A{"$n32", int32(1)}), int32(3)},
		{"$add to a double", op("$add", bson.A{"$n32", 0.5}), 2.5},
		{"$add to a date", op("$add", bson.A{"$at", int32(500)}), primitive.DateTime(1500)},
		{"$add with null", op("$add", bson.A{"$nope", int32(1)}), nil},
		{"$lt across int types", op("$lt", bson.A{"$n32", "$version"}), true},
		{"$gte", op("$gte", bson.A{"$deleted", int64(1)}), false},
		{"$eq strings", op("$eq", bson.A{"a", "a"}), true},
		{"$ne", op("$ne", bson.A{int32(1), 1.0}), false},
		{"$gt null below numbers", op("$gt", bson.A{int32(0), nil}), true},
		{"$or", op("$or", bson.A{false, op("$lt", bson.A{int32(1), int32(2)})}), true},
		{"$and", op("$and", bson.A{true, int32(0)}), false},
		{"$not one", op("$not", bson.A{int32(0)}), true},
		{"$in", op("$in", bson.A{"b", bson.A{"a", "b"}}), true},
		{"$size", op("$size", "$logs"), int32(3)},
		{"$arrayElemAt", op("$arrayElemAt", bson.A{"$msgs", int64(1)}), "m1"},
		{"$arrayElemAt negative", op("$arrayElemAt", bson.A{"$msgs", int32(-1)}), "m2"},
		{"$arrayElemAt past the end", op("$arrayElemAt", bson.A{"$msgs", int32(9)}), missing{}},
		{"$concatArrays", op("$concatArrays", bson.A{bson.A{int32(1)}, bson.A{int32(2), int32(3)}}), bson.A{int32(1), int32(2), int32(3)}},
		{"$concatArrays with null", op("$concatArrays", bson.A{bson.A{int32(1)}, nil}), nil},
		{"$cond document", op("$cond", bson.D{{Key: "if", Value: false}, {Key: "then", Value: "t"}, {Key: "else", Value: "e"}}), "e"},
		{"$cond array", op("$cond", bson.A{true, "t", "e"}), "t"},
		{"$literal", op("$literal", "$version"), "$version"},
		{"$filter with a variable", op("$filter", bson.D{{Key: "input", Value: "$logs"}, {Key: "as", Value: "l"},
			{Key: "cond", Value: op("$gt", bson.A{"$$l.version", int32(2)})}}), bson.A{doc[4].Value.(bson.A)[1], doc[4].Value.(bson.A)[2]}},
		{"$filter of missing is null", op("$filter", bson.D{{Key: "input", Value: "$nope"}, {Key: "cond", Value: true}}), nil},
		{"$map with $$this", op("$map", bson.D{{Key: "input", Value: bson.A{int32(2), int32(7)}},
			{Key: "in", Value: op("$arrayElemAt", bson.A{"$msgs", "$$this"})}}), bson.A{"m2", nil}},
		{"object expression", bson.D{{Key: "x", Value: "$version"}, {Key: "gone", Value: "$nope"}}, bson.D{{Key: "x", Value: int64(4)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := eval(tc.expr, scope{root: doc})
			if err != nil {
				t.Fatal(err)
			}
			if _, gone := tc.want.(missing); gone {
				if _, ok := got.(missing); !ok {
					t.Fatalf("got %v, want missing", got)
				}
				return
			}
			if g, w := ext(t, got), ext(t, tc.want); g != w {
				t.Errorf("got %s, want %s", g, w)
			}
		})
	}
}

func TestEvalErrors(t *testing.T) {
	for _, expr := range []any{
		bson.D{{Key: "$size", Value: "$version"}},
		bson.D{{Key: "$add", Value: bson.A{"x", int32(1)}}},
		bson.D{{Key: "$in", Value: bson.A{int32(1), int32(2)}}},
		bson.D{{Key: "$lt", Value: bson.A{int32(1)}}},
		"$$undefined",
	} {
		if v, err := eval(expr, scope{root: bson.D{{Key: "version", Value: int32(1)}}}); err == nil {
			t.Errorf("eval(%v) = %v, want an error", expr, v)
		}
	}
}

// An operator not evaluated here is found before anything is sent: the
// command then goes to FerretDB as it came.
func TestCheckExpr(t *testing.T) {
	uses, err := checkExpr(bson.D{{Key: "a", Value: bson.D{{Key: "$mergeObjects", Value: bson.A{}}}}})
	if !errors.Is(err, errUnsupported) {
		t.Errorf("$mergeObjects: err %v, want unsupported", err)
	}
	if uses, err = checkExpr(bson.D{{Key: "a", Value: int32(1)}}); err != nil || uses {
		t.Errorf("a literal: uses %v, err %v", uses, err)
	}
	if uses, err = checkExpr(bson.D{{Key: "$size", Value: "$a"}}); err != nil || !uses {
		t.Errorf("$size: uses %v, err %v", uses, err)
	}
}
