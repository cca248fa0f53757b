package mongofix

import (
	"errors"
	"fmt"
	"sync"

	"go.mongodb.org/mongo-driver/bson"
)

// An emulation runs a command FerretDB cannot run as commands it can,
// and answers the client itself. run sends one command upstream and
// returns its reply; lock serialises the emulated writes to a namespace.
type emulation func(cmd bson.D) (exec func(env) bson.D, ok bool)

type env struct {
	run  func(cmd bson.D) (bson.D, error)
	lock func(ns string) (unlock func())
}

// commandError is a failed command's reply, as MongoDB writes one.
func commandError(code int32, name, msg string) bson.D {
	return bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: msg}, {Key: "code", Value: code}, {Key: "codeName", Value: name}}
}

// failed returns reply if it is a failure, for the client to see as it
// came.
func failed(reply bson.D) bool {
	i := index(reply, "ok")
	if i < 0 {
		return true
	}
	on, _ := truth(reply[i].Value)
	return !on
}

// emulateError turns an error of the emulation into a reply: what the
// upstream answered, or what evaluation found wrong.
func emulateError(err error) bson.D {
	var up upstreamError
	if errors.As(err, &up) {
		return up.reply
	}
	return commandError(2, "BadValue", "mongofix: "+err.Error())
}

type upstreamError struct{ reply bson.D }

func (e upstreamError) Error() string { return fmt.Sprintf("upstream refused: %v", e.reply) }

// call runs cmd upstream and returns its reply, or the failed reply as
// an upstreamError.
func (e env) call(cmd bson.D) (bson.D, error) {
	reply, err := e.run(cmd)
	if err != nil {
		return nil, err
	}
	if failed(reply) {
		return nil, upstreamError{reply}
	}
	return reply, nil
}

// findAll runs find with filter (and sort and limit, when set; a filter
// by a keyed collection's key goes by _id) and follows its cursor to the
// end. The reply's batches are capped by the
// wire's message size; the whole by maxResult.
func (e env) findAll(db, coll string, filter, sort any, limit int64) ([]bson.D, error) {
	if f, ok := byKey(coll, filter); ok {
		filter = f
	}
	cmd := bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: filter}}
	if sort != nil {
		cmd = append(cmd, bson.E{Key: "sort", Value: sort})
	}
	if limit > 0 {
		cmd = append(cmd, bson.E{Key: "limit", Value: limit}, bson.E{Key: "singleBatch", Value: true})
	}
	cmd = append(cmd, bson.E{Key: "$db", Value: db})
	reply, err := e.call(cmd)
	var docs []bson.D
	size := 0
	for {
		if err != nil {
			return nil, err
		}
		// The reply is already decoded: its cursor is read from it, not
		// encoded and decoded again.
		cursor, _ := value(reply, "cursor").(bson.D)
		id, _ := value(cursor, "id").(int64)
		batch, _ := value(cursor, "firstBatch").(bson.A)
		if next, ok := value(cursor, "nextBatch").(bson.A); ok {
			batch = next
		}
		for _, x := range batch {
			d, ok := x.(bson.D)
			if !ok {
				return nil, fmt.Errorf("find reply: a batch element of type %T", x)
			}
			b, _ := bson.Marshal(d)
			if size += len(b); size > maxResult {
				return nil, fmt.Errorf("result over %d bytes: more than mongofix answers in one batch", maxResult)
			}
			docs = append(docs, d)
		}
		if id == 0 {
			return docs, nil
		}
		reply, err = e.call(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: coll}, {Key: "$db", Value: db}})
	}
}

// maxResult bounds what an emulated aggregate answers, in one batch:
// under the 16 MiB of a reply document, with room for the envelope.
const maxResult = 15 << 20

func str(cmd bson.D, key string) (string, bool) {
	i := index(cmd, key)
	if i < 0 {
		return "", false
	}
	s, ok := cmd[i].Value.(string)
	return s, ok
}

func value(cmd bson.D, key string) any {
	if i := index(cmd, key); i >= 0 {
		return cmd[i].Value
	}
	return nil
}

// has reports whether cmd sets any of keys.
func has(cmd bson.D, keys ...string) bool {
	for _, k := range keys {
		if index(cmd, k) >= 0 {
			return true
		}
	}
	return false
}

// findAndModifyPipeline emulates findAndModify whose update is a pipeline
// (FerretDB v1: "Aggregation pipelines are not supported yet"), as
// OpenIM's version logs write every change (version_log.go
// writeLogBatch2: $addFields, $set with $add, $filter, $not, $in and
// $concatArrays, $unset, new: true, fields {logs: 0}). It reads the first
// document the query matches, runs the pipeline on it here, and replaces
// it by _id, under a lock of the namespace so that two emulated updates
// of one document do not interleave (OpenIM writes these collections
// otherwise only by insert). An upsert, a remove, or an option beyond
// sort, new and fields goes to FerretDB as it came.
func findAndModifyPipeline(cmd bson.D) (func(env) bson.D, bool) {
	coll, ok := str(cmd, "findAndModify")
	if !ok {
		return nil, false
	}
	db, _ := str(cmd, "$db")
	update, ok := value(cmd, "update").(bson.A)
	if !ok {
		return nil, false
	}
	if on, _ := truth(value(cmd, "upsert")); on {
		return nil, false
	}
	if on, _ := truth(value(cmd, "remove")); on {
		return nil, false
	}
	if has(cmd, "arrayFilters", "collation", "hint", "let") {
		return nil, false
	}
	stages, _, err := parseStages(update)
	if err != nil {
		return nil, false
	}
	var proj *projection
	if spec, ok := value(cmd, "fields").(bson.D); ok {
		p, ok := parseProjection(spec)
		if !ok {
			return nil, false
		}
		proj = &p
	}
	returnNew, _ := truth(value(cmd, "new"))
	query := value(cmd, "query")
	if query == nil {
		query = bson.D{}
	}
	sort := value(cmd, "sort")
	wc := value(cmd, "writeConcern")
	return func(e env) bson.D {
		defer e.lock(db + "." + coll)()
		docs, err := e.findAll(db, coll, query, sort, 1)
		if err != nil {
			return emulateError(err)
		}
		if len(docs) == 0 {
			return bson.D{
				{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: int32(0)}, {Key: "updatedExisting", Value: false}}},
				{Key: "value", Value: nil}, {Key: "ok", Value: 1.0},
			}
		}
		old := docs[0]
		doc, err := runStages(append(bson.D{}, old...), stages)
		if err != nil {
			return emulateError(err)
		}
		id := value(old, "_id")
		if compare(value(doc, "_id"), id) != 0 {
			return commandError(66, "ImmutableField", "mongofix: the pipeline would change _id")
		}
		up := bson.D{
			{Key: "update", Value: coll},
			{Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}}, {Key: "u", Value: doc}}}},
		}
		if wc != nil {
			up = append(up, bson.E{Key: "writeConcern", Value: wc})
		}
		up = append(up, bson.E{Key: "$db", Value: db})
		reply, err := e.call(up)
		if err != nil {
			return emulateError(err)
		}
		if we := value(reply, "writeErrors"); we != nil {
			return commandError(2, "BadValue", fmt.Sprintf("mongofix: replacing the document: %v", we))
		}
		out := old
		if returnNew {
			out = doc
		}
		if proj != nil {
			out = proj.apply(out)
		}
		return bson.D{
			{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: int32(1)}, {Key: "updatedExisting", Value: true}}},
			{Key: "value", Value: out}, {Key: "ok", Value: 1.0},
		}
	}, true
}

// aggregatePipeline emulates an aggregate that is leading $match stages
// and then $addFields, $set, $unset and $project stages with expression
// operators FerretDB v1 does not evaluate, as OpenIM sends two: its pull
// of messages by seq (msg.go: $match by doc_id, then $project of $map over
// the wanted indexes with $arrayElemAt) and its version logs' change query
// (version_log.go findChangeLog: $cond, $or, $lt, $gte, $filter, $gt,
// $size). The $match runs upstream as a find; the rest runs here on each
// document found, and the answer is one batch. A pipeline with any other
// stage, or none that needs evaluating here, goes to FerretDB as it came.
func aggregatePipeline(cmd bson.D) (func(env) bson.D, bool) {
	coll, ok := str(cmd, "aggregate")
	if !ok {
		return nil, false
	}
	db, _ := str(cmd, "$db")
	pipeline, ok := value(cmd, "pipeline").(bson.A)
	if !ok || has(cmd, "explain", "collation", "hint", "let") {
		return nil, false
	}
	var matches bson.A
	for len(pipeline) > 0 {
		d, ok := pipeline[0].(bson.D)
		if !ok || len(d) != 1 || d[0].Key != "$match" {
			break
		}
		matches = append(matches, d[0].Value)
		pipeline = pipeline[1:]
	}
	stages, uses, err := parseStages(pipeline)
	if err != nil || !uses {
		return nil, false
	}
	var filter any = bson.D{}
	switch len(matches) {
	case 0:
	case 1:
		filter = matches[0]
	default:
		filter = bson.D{{Key: "$and", Value: matches}}
	}
	return func(e env) bson.D {
		docs, err := e.findAll(db, coll, filter, nil, 0)
		if err != nil {
			return emulateError(err)
		}
		batch := make(bson.A, 0, len(docs))
		for _, d := range docs {
			out, err := runStages(d, stages)
			if err != nil {
				return emulateError(err)
			}
			batch = append(batch, out)
		}
		return bson.D{
			{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: db + "." + coll}}},
			{Key: "ok", Value: 1.0},
		}
	}, true
}

// locks hands out a mutex per namespace; they live as long as the proxy,
// one per collection an emulated write touched.
type locks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (l *locks) lock(ns string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sync.Mutex{}
	}
	m := l.m[ns]
	if m == nil {
		m = new(sync.Mutex)
		l.m[ns] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}
