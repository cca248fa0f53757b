package mongofix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// The integration tests need a real FerretDB v1: the one .ci/openim.sh
// starts for OpenIM listens on this Unix socket, behind its own mongofix.
// The tests put a proxy of their own in front of it and work in a
// database of their own, dropped at the end.
const ferretVar = "IMCANARYTEST_OPENIM_FERRETDB"

// fixture is a proxy in front of the real FerretDB, and a client of each.
type fixture struct {
	proxy  *Proxy
	direct *mongo.Database // FerretDB itself
	viaFix *mongo.Database // through the proxy
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	sock := os.Getenv(ferretVar)
	if sock == "" {
		t.Skipf("%s not set: no FerretDB to test against (.ci/openim.sh starts one)", ferretVar)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := New("unix", sock, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()
	// Registered first, so it runs after the clients have disconnected.
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	name := fmt.Sprintf("mongofix_test_%d", time.Now().UnixNano())
	connect := func(o *options.ClientOptions) *mongo.Database {
		c, err := mongo.Connect(context.Background(), o.SetTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
		return c.Database(name)
	}
	f := &fixture{
		proxy: p,
		// The driver lowercases a socket path in a URI: dial it directly.
		direct: connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/").SetDialer(unixDialer(sock))),
		viaFix: connect(options.Client().ApplyURI("mongodb://" + ln.Addr().String() + "/")),
	}
	t.Cleanup(func() { _ = f.direct.Drop(context.Background()) })
	return f
}

type unixDialer string

func (d unixDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "unix", string(d))
}

// OpenIM's seq allocation (seq_conversation.go Malloc): an upserting
// FindOneAndUpdate that returns only max_seq. FerretDB refuses it; through
// the proxy it allocates, and the reply holds exactly the projected field.
func TestFindAndModifyFields(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	malloc := func(db *mongo.Database, conv string, n int64) (bson.D, error) {
		opt := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After).
			SetProjection(bson.M{"_id": 0, "max_seq": 1})
		var got bson.D
		err := db.Collection("seq").FindOneAndUpdate(ctx, bson.M{"conversation_id": conv},
			bson.M{"$inc": bson.M{"max_seq": n}, "$set": bson.M{"min_seq": int64(0)}}, opt).Decode(&got)
		return got, err
	}

	_, err := malloc(f.direct, "si_a_b", 1)
	var cmdErr mongo.CommandError
	if !errors.As(err, &cmdErr) || cmdErr.Code != 238 {
		t.Fatalf("FerretDB itself: err %v, want NotImplemented (238): if FerretDB now does this, the rewrite can go", err)
	}

	for i, want := range []int64{3, 5, 10} {
		got, err := malloc(f.viaFix, "si_a_b", []int64{3, 2, 5}[i])
		if err != nil {
			t.Fatalf("malloc %d through the proxy: %v", i, err)
		}
		if len(got) != 1 || got[0].Key != "max_seq" || got[0].Value != want {
			t.Fatalf("malloc %d: got %v, want [{max_seq %d}] alone", i, got, want)
		}
	}
	// The document itself still has every field: only the reply was cut.
	var whole bson.M
	if err := f.direct.Collection("seq").FindOne(ctx, bson.M{"conversation_id": "si_a_b"}).Decode(&whole); err != nil {
		t.Fatal(err)
	}
	if whole["max_seq"] != int64(10) || whole["min_seq"] != int64(0) || whole["_id"] == nil {
		t.Errorf("stored document %v", whole)
	}
	if n := f.proxy.Counts()["findAndModify.fields"]; n != 3 {
		t.Errorf("rewrites counted %d, want 3", n)
	}

	// No match and no upsert: value is null, which the projection leaves.
	err = f.viaFix.Collection("seq").FindOneAndUpdate(ctx, bson.M{"conversation_id": "none"},
		bson.M{"$inc": bson.M{"max_seq": 1}}, options.FindOneAndUpdate().SetProjection(bson.M{"max_seq": 1})).Err()
	if !errors.Is(err, mongo.ErrNoDocuments) {
		t.Errorf("no match: err %v, want ErrNoDocuments", err)
	}
}

// What no rewrite matches passes through as it came.
func TestPassThrough(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	coll := f.viaFix.Collection("other")
	if _, err := coll.InsertOne(ctx, bson.M{"doc_id": "d:0", "msgs": bson.A{bson.M{"msg": nil}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.UpdateOne(ctx, bson.M{"doc_id": "d:0"}, bson.M{"$set": bson.M{"msgs.0.msg": "hello"}}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Msgs []struct{ Msg string } `bson:"msgs"`
	}
	if err := coll.FindOne(ctx, bson.M{"doc_id": "d:0"}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Msgs) != 1 || got.Msgs[0].Msg != "hello" {
		t.Errorf("read back %+v", got)
	}
	for name, n := range f.proxy.Counts() {
		if n != 0 {
			t.Errorf("rewrite %s counted %d for commands it does not match", name, n)
		}
	}
}

// A client that sends what is not a wire message loses its connection;
// the proxy serves the next one, and leaves no goroutine behind at stop.
func TestMalformedFrame(t *testing.T) {
	before := runtime.NumGoroutine()
	dir := t.TempDir()
	up, err := net.Listen("unix", filepath.Join(dir, "up.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := New("unix", up.Addr().String(), 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()

	for _, frame := range [][]byte{
		{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}, // a length over 48 MB
		{4, 0, 0, 0},                         // a length under the header's
		// An OP_MSG whose section is of kind 7.
		{21, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x07, 0, 0, 0, 0, 0, 0, 7},
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(frame); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("frame %x: read %d, %v: want the connection closed", frame, n, err)
		}
		c.Close()
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	up.Close()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after stop, %d before", n, before)
	}
}

// OpenIM's message documents are stored with their doc_id as _id, and
// the filters by doc_id it sends go by _id, which FerretDB pushes down to
// its database's index on _id (see keyed).
func TestKeyed(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	explain := func(filter bson.D) bool {
		var r struct {
			Pushdown bool `bson:"filterPushdown"`
		}
		err := f.direct.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "msg"}, {Key: "filter", Value: filter}}}}).Decode(&r)
		if err != nil {
			t.Fatal(err)
		}
		return r.Pushdown
	}
	coll := f.viaFix.Collection("msg")
	if _, err := coll.InsertMany(ctx, []any{
		bson.M{"doc_id": "si_a_b:0", "msgs": bson.A{bson.M{"msg": nil}, bson.M{"msg": nil}}},
		bson.M{"doc_id": "si_a_b:1", "msgs": bson.A{bson.M{"msg": nil}}},
		bson.M{"doc_id": int32(5)}, // not a string: left as it came
	}); err != nil {
		t.Fatal(err)
	}
	if !explain(bson.D{{Key: "_id", Value: "si_a_b:0"}}) {
		t.Fatal("FerretDB does not push a filter by _id down to its database")
	}
	var ids []struct {
		ID    any `bson:"_id"`
		DocID any `bson:"doc_id"`
	}
	cur, err := f.direct.Collection("msg").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &ids); err != nil || len(ids) != 3 {
		t.Fatalf("stored %v, %v", ids, err)
	}
	for _, d := range ids {
		if s, ok := d.DocID.(string); ok && d.ID != s {
			t.Errorf("document %v stored with _id %v, want its doc_id", d.DocID, d.ID)
		}
		if _, ok := d.DocID.(string); !ok {
			if _, oid := d.ID.(primitive.ObjectID); !oid {
				t.Errorf("document with doc_id %v: _id %v, want the driver's ObjectID", d.DocID, d.ID)
			}
		}
	}

	// OpenIM's UpdateMsg: one message's slot, by doc_id.
	res, err := coll.UpdateOne(ctx, bson.M{"doc_id": "si_a_b:0"}, bson.M{"$set": bson.M{"msgs.1.msg": bson.M{"seq": int64(2)}}})
	if err != nil || res.MatchedCount != 1 || res.ModifiedCount != 1 {
		t.Fatalf("update by doc_id: %+v, %v", res, err)
	}
	var doc struct {
		Msgs []struct {
			Msg *struct {
				Seq int64 `bson:"seq"`
			} `bson:"msg"`
		} `bson:"msgs"`
	}
	if err := coll.FindOne(ctx, bson.M{"doc_id": "si_a_b:0"}).Decode(&doc); err != nil {
		t.Fatalf("find by doc_id: %v", err)
	}
	if len(doc.Msgs) != 2 || doc.Msgs[1].Msg == nil || doc.Msgs[1].Msg.Seq != 2 {
		t.Errorf("read back %+v", doc)
	}
	// A filter with more than the key goes as it came, and still matches.
	if n, err := coll.CountDocuments(ctx, bson.M{"doc_id": "si_a_b:0", "msgs.1.msg.seq": int64(2)}); err != nil || n != 1 {
		t.Errorf("count by doc_id and more: %d, %v", n, err)
	}
	if res, err := coll.DeleteOne(ctx, bson.M{"doc_id": "si_a_b:1"}); err != nil || res.DeletedCount != 1 {
		t.Errorf("delete by doc_id: %+v, %v", res, err)
	}
	if n, _ := f.direct.Collection("msg").CountDocuments(ctx, bson.D{}); n != 2 {
		t.Errorf("%d documents left, want 2", n)
	}
	c := f.proxy.Counts()
	for name, want := range map[string]int64{"insert.keyed": 1, "update.keyed": 1, "find.keyed": 1, "delete.keyed": 1} {
		if c[name] != want {
			t.Errorf("%s counted %d, want %d", name, c[name], want)
		}
	}
}
