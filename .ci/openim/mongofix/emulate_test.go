package mongofix

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// notImplemented fails t unless err is FerretDB's NotImplemented (238):
// the fault a rewrite exists for. If FerretDB learns to do it, the
// rewrite can go.
func notImplemented(t *testing.T, what string, err error) {
	t.Helper()
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 238 {
		t.Fatalf("%s on FerretDB itself: err %v, want NotImplemented (238)", what, err)
	}
}

// versionLog is a document as OpenIM's version logs keep them.
type versionLog struct {
	DID        string    `bson:"d_id"`
	Version    int64     `bson:"version"`
	Deleted    int64     `bson:"deleted"`
	LastUpdate time.Time `bson:"last_update"`
	Logs       []struct {
		EID     string `bson:"e_id"`
		State   int32  `bson:"state"`
		Version int64  `bson:"version"`
	} `bson:"logs"`
	DeleteEIDs any `bson:"delete_e_ids"`
}

// writeLog is the shape of OpenIM's version-log write (version_log.go
// writeLogBatch2): drop the elements' old entries, bump the version, add
// the elements at the new version; answer the document without its logs.
func writeLog(ctx context.Context, db *mongo.Database, dID string, eIDs []string, state int32, now time.Time) (bson.M, error) {
	elems := bson.A{}
	for _, e := range eIDs {
		elems = append(elems, bson.D{{Key: "e_id", Value: e}, {Key: "version", Value: "$version"}, {Key: "state", Value: state}, {Key: "last_update", Value: now}})
	}
	pipeline := bson.A{
		bson.D{{Key: "$addFields", Value: bson.D{{Key: "delete_e_ids", Value: eIDs}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: bson.D{{Key: "$add", Value: bson.A{"$version", 1}}}}, {Key: "last_update", Value: now}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "logs", Value: bson.D{{Key: "$filter", Value: bson.D{
			{Key: "input", Value: "$logs"}, {Key: "as", Value: "log"},
			{Key: "cond", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$in", Value: bson.A{"$$log.e_id", "$delete_e_ids"}}}}}},
		}}}}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "logs", Value: bson.D{{Key: "$concatArrays", Value: bson.A{"$logs", elems}}}}}}},
		bson.D{{Key: "$unset", Value: "delete_e_ids"}},
	}
	opt := options.FindOneAndUpdate().SetUpsert(false).SetReturnDocument(options.After).SetProjection(bson.M{"logs": 0})
	var got bson.M
	err := db.Collection("version_group_member").FindOneAndUpdate(ctx, bson.M{"d_id": dID}, pipeline, opt).Decode(&got)
	return got, err
}

func TestFindAndModifyPipeline(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	coll := f.viaFix.Collection("version_group_member")
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, err := coll.InsertOne(ctx, bson.M{"d_id": "g1", "version": int64(1), "deleted": int64(0), "last_update": now,
		"logs": bson.A{bson.M{"e_id": "u1", "state": int32(1), "version": int64(1)}, bson.M{"e_id": "u2", "state": int32(1), "version": int64(1)}}}); err != nil {
		t.Fatal(err)
	}
	_, err := writeLog(ctx, f.direct, "g1", []string{"u2"}, 2, now)
	notImplemented(t, "findAndModify with an update pipeline", err)

	later := now.Add(time.Second)
	got, err := writeLog(ctx, f.viaFix, "g1", []string{"u2", "u3"}, 2, later)
	if err != nil {
		t.Fatal(err)
	}
	if got["version"] != int64(2) || got["logs"] != nil || got["d_id"] != "g1" {
		t.Errorf("answered %v, want version 2, no logs", got)
	}
	var doc versionLog
	if err := f.direct.Collection("version_group_member").FindOne(ctx, bson.M{"d_id": "g1"}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Version != 2 || !doc.LastUpdate.Equal(later) || doc.DeleteEIDs != nil || len(doc.Logs) != 3 {
		t.Fatalf("stored %+v", doc)
	}
	for i, want := range []struct {
		e string
		v int64
		s int32
	}{{"u1", 1, 1}, {"u2", 2, 2}, {"u3", 2, 2}} {
		if l := doc.Logs[i]; l.EID != want.e || l.Version != want.v || l.State != want.s {
			t.Errorf("log %d = %+v, want %+v", i, l, want)
		}
	}

	// No such document: null, so that OpenIM makes it (initDoc).
	if _, err := writeLog(ctx, f.viaFix, "none", []string{"u1"}, 1, later); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Errorf("no document: err %v, want ErrNoDocuments", err)
	}

	// Concurrent writes to one document all land: each bumps the version.
	const n = 20
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := writeLog(ctx, f.viaFix, "g1", []string{"x" + string(rune('a'+i))}, 1, later)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := f.direct.Collection("version_group_member").FindOne(ctx, bson.M{"d_id": "g1"}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Version != 2+n || len(doc.Logs) != 3+n {
		t.Errorf("after %d concurrent writes: version %d, %d logs; want %d, %d", n, doc.Version, len(doc.Logs), 2+n, 3+n)
	}
	if c := f.proxy.Counts()["findAndModify.pipeline"]; c != 2+n {
		t.Errorf("emulations counted %d, want %d", c, 2+n)
	}
}

// pullBySeq is the shape of OpenIM's pull of messages from MongoDB
// (msg.go FindSeqs): one document's messages at the given indexes.
func pullBySeq(ctx context.Context, db *mongo.Database, docID string, idx []int64) ([]bson.M, error) {
	pipeline := bson.A{
		bson.D{{Key: "$match", Value: bson.D{{Key: "doc_id", Value: docID}}}},
		bson.D{{Key: "$project", Value: bson.D{
			{Key: "_id", Value: 0}, {Key: "doc_id", Value: 1},
			{Key: "msgs", Value: bson.D{{Key: "$map", Value: bson.D{
				{Key: "input", Value: idx}, {Key: "as", Value: "index"},
				{Key: "in", Value: bson.D{{Key: "$arrayElemAt", Value: bson.A{"$msgs", "$$index"}}}},
			}}}},
		}}},
	}
	cur, err := db.Collection("msg").Aggregate(ctx, pipeline)
	if err != nil {
		return nil, err
	}
	var out []bson.M
	err = cur.All(ctx, &out)
	return out, err
}

func TestAggregatePullBySeq(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	msgs := bson.A{}
	for i := range 5 {
		msgs = append(msgs, bson.M{"msg": bson.M{"seq": int64(i + 1), "content": "m"}})
	}
	if _, err := f.viaFix.Collection("msg").InsertMany(ctx, []any{
		bson.M{"doc_id": "si_a_b:0", "msgs": msgs},
		bson.M{"doc_id": "si_a_b:1", "msgs": bson.A{}},
	}); err != nil {
		t.Fatal(err)
	}
	_, err := pullBySeq(ctx, f.direct, "si_a_b:0", []int64{1})
	notImplemented(t, "aggregate with $map", err)

	got, err := pullBySeq(ctx, f.viaFix, "si_a_b:0", []int64{1, 3, 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0]["doc_id"] != "si_a_b:0" || got[0]["_id"] != nil {
		t.Fatalf("got %v", got)
	}
	list, _ := got[0]["msgs"].(bson.A)
	if len(list) != 3 || list[2] != nil {
		t.Fatalf("msgs %v, want 3, the last null (index past the end)", list)
	}
	for i, want := range []int64{2, 4} {
		m, _ := list[i].(bson.M)
		inner, _ := m["msg"].(bson.M)
		if inner["seq"] != want {
			t.Errorf("msgs[%d] = %v, want seq %d", i, list[i], want)
		}
	}
	if got, err := pullBySeq(ctx, f.viaFix, "none", []int64{0}); err != nil || len(got) != 0 {
		t.Errorf("no document: %v, %v; want none", got, err)
	}
	// A pipeline FerretDB runs itself is not touched.
	cur, err := f.viaFix.Collection("msg").Aggregate(ctx, bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "doc_id", Value: "si_a_b:1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var plain []bson.M
	if err := cur.All(ctx, &plain); err != nil || len(plain) != 1 {
		t.Errorf("plain $match: %v, %v", plain, err)
	}
	if c := f.proxy.Counts()["aggregate.expressions"]; c != 2 {
		t.Errorf("emulations counted %d, want 2", c)
	}
}

// changeLog is the shape of OpenIM's change query of a version log
// (version_log.go findChangeLog): the entries after version v, none if
// the log does not reach back to v or holds more than limit.
func changeLog(ctx context.Context, db *mongo.Database, dID string, v int64, limit int32) ([]bson.M, error) {
	pipeline := bson.A{
		bson.D{{Key: "$match", Value: bson.D{{Key: "d_id", Value: dID}}}},
		bson.D{{Key: "$addFields", Value: bson.D{{Key: "logs", Value: bson.D{{Key: "$cond", Value: bson.D{
			{Key: "if", Value: bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: "$lt", Value: bson.A{"$version", v}}},
				bson.D{{Key: "$gte", Value: bson.A{"$deleted", v}}},
			}}}},
			{Key: "then", Value: bson.A{}}, {Key: "else", Value: "$logs"},
		}}}}}}},
		bson.D{{Key: "$addFields", Value: bson.D{{Key: "logs", Value: bson.D{{Key: "$filter", Value: bson.D{
			{Key: "input", Value: "$logs"}, {Key: "as", Value: "l"},
			{Key: "cond", Value: bson.D{{Key: "$gt", Value: bson.A{"$$l.version", v}}}},
		}}}}}}},
		bson.D{{Key: "$addFields", Value: bson.D{{Key: "log_len", Value: bson.D{{Key: "$size", Value: "$logs"}}}}}},
		bson.D{{Key: "$addFields", Value: bson.D{{Key: "logs", Value: bson.D{{Key: "$cond", Value: bson.D{
			{Key: "if", Value: bson.D{{Key: "$gt", Value: bson.A{"$log_len", limit}}}},
			{Key: "then", Value: bson.A{}}, {Key: "else", Value: "$logs"},
		}}}}}}},
	}
	cur, err := db.Collection("version_conversation").Aggregate(ctx, pipeline)
	if err != nil {
		return nil, err
	}
	var out []bson.M
	err = cur.All(ctx, &out)
	return out, err
}

func TestAggregateChangeLog(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.viaFix.Collection("version_conversation").InsertOne(ctx, bson.M{"d_id": "u1", "version": int64(4), "deleted": int64(0),
		"logs": bson.A{bson.M{"e_id": "c1", "version": int64(2)}, bson.M{"e_id": "c2", "version": int64(3)}, bson.M{"e_id": "c3", "version": int64(4)}}}); err != nil {
		t.Fatal(err)
	}
	_, err := changeLog(ctx, f.direct, "u1", 2, 10)
	notImplemented(t, "aggregate with $cond", err)
	for _, tc := range []struct {
		v     int64
		limit int32
		want  []string
		len   int32
	}{
		{2, 10, []string{"c2", "c3"}, 2},
		{3, 10, []string{"c3"}, 1},
		{5, 10, nil, 0}, // the log's version is below v
		{1, 2, nil, 3},  // more changes than the limit
		{0, 10, nil, 0}, // deleted (0) is not below v: nothing
		{1, 10, []string{"c1", "c2", "c3"}, 3},
	} {
		got, err := changeLog(ctx, f.viaFix, "u1", tc.v, tc.limit)
		if err != nil || len(got) != 1 {
			t.Fatalf("v %d: %v, %v", tc.v, got, err)
		}
		logs, _ := got[0]["logs"].(bson.A)
		var ids []string
		for _, l := range logs {
			ids = append(ids, l.(bson.M)["e_id"].(string))
		}
		if len(ids) != len(tc.want) || got[0]["log_len"] != tc.len {
			t.Errorf("v %d limit %d: logs %v, log_len %v; want %v, %d", tc.v, tc.limit, ids, got[0]["log_len"], tc.want, tc.len)
			continue
		}
		for i := range ids {
			if ids[i] != tc.want[i] {
				t.Errorf("v %d: logs %v, want %v", tc.v, ids, tc.want)
			}
		}
	}
}
