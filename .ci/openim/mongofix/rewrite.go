package mongofix

import (
	"strings"

	"go.mongodb.org/mongo-driver/bson"
)

// A rewrite turns one command FerretDB v1 cannot run, or cannot run in
// time, into one it can, and mends the reply so that the client sees what
// MongoDB would have said. Each exists because OpenIM v3.8.3 sends that
// command on a path imcanary tests; nothing else is touched.
type rewrite struct {
	// name identifies the rewrite in logs and counts.
	name string
	// command is the command's name, the body's first key (matched
	// without case, as the server does).
	command string
	// collections, if set, are the only collections it is for.
	collections []string
	// request changes c in place and returns a function that mends its
	// reply (or nil), or ok false to pass the command on unchanged.
	request func(c *command) (reply func(bson.D) bson.D, ok bool)
	// emulate, instead of request, runs the command as others that
	// FerretDB can run and answers it itself.
	emulate emulation
}

// command is a client's command decoded: its body and the documents of
// its document sequences.
type command struct {
	body bson.D
	seqs []seqDocs
}

type seqDocs struct {
	ident string
	docs  []bson.D
}

// each calls f on every document of the command's field, in the body (an
// array) or in a document sequence of that name, and keeps what f returns.
func (c *command) each(field string, f func(bson.D) bson.D) {
	if i := index(c.body, field); i >= 0 {
		if arr, ok := c.body[i].Value.(bson.A); ok {
			for j, x := range arr {
				if d, ok := x.(bson.D); ok {
					arr[j] = f(d)
				}
			}
		}
	}
	for _, sq := range c.seqs {
		if sq.ident == field {
			for j := range sq.docs {
				sq.docs[j] = f(sq.docs[j])
			}
		}
	}
}

// keyed lists the collections whose documents mongofix stores with their
// unique key as _id, and the key. FerretDB v1 looks a document up by an
// index only by _id: on PostgreSQL its filter on another field is a
// containment test that scans the table (EXPLAIN: Seq Scan, even beside
// the unique index OpenIM made on that field), detoasting every document,
// and on SQLite it decodes every document in Go. OpenIM keeps its messages
// a hundred to a document and updates one per message (msg.go UpdateMsg,
// filter {doc_id}): that scan would grow with every conversation. OpenIM
// never reads these documents' _id on the paths imcanary tests (its
// message search does, and FerretDB cannot run that search anyway).
var keyed = map[string]string{"msg": "doc_id"}

// byKey returns filter as a filter by _id, if it is exactly an equality
// on the collection's key with a string.
func byKey(coll string, filter any) (bson.D, bool) {
	key, ok := keyed[coll]
	if !ok {
		return nil, false
	}
	d, ok := filter.(bson.D)
	if !ok || len(d) != 1 || d[0].Key != key {
		return nil, false
	}
	v, ok := d[0].Value.(string)
	if !ok {
		return nil, false
	}
	return bson.D{{Key: "_id", Value: v}}, true
}

func keyedCollections() []string {
	out := make([]string, 0, len(keyed))
	for c := range keyed {
		out = append(out, c)
	}
	return out
}

// rewrites lists every rewrite, in the order they are tried.
var rewrites = []rewrite{
	{
		// FerretDB v1.24 answers NotImplemented to an update pipeline
		// ("Aggregation pipelines are not supported yet"). OpenIM writes
		// every change of a conversation, a group's members, a user's
		// joined groups and friends to a version log this way
		// (version_log.go writeLogBatch2), and fails the change when it
		// cannot: /group/create_group answered 500.
		name:    "findAndModify.pipeline",
		command: "findAndModify",
		emulate: findAndModifyPipeline,
	},
	{
		// FerretDB v1.24 answers NotImplemented (238) to findAndModify
		// with "fields". OpenIM allocates every conversation's seqs with
		// one (seq_conversation.go Malloc: FindOneAndUpdate, projection
		// _id and max_seq) and appends to its version logs with another
		// (version_log.go, projection logs): without it no message is
		// given a seq, stored or pushed.
		name:    "findAndModify.fields",
		command: "findAndModify",
		request: func(c *command) (func(bson.D) bson.D, bool) {
			out, mend, ok := findAndModifyFields(c.body)
			if ok {
				c.body = out
			}
			return mend, ok
		},
	},
	{
		// FerretDB v1.24 evaluates only $sum and $type in a pipeline's
		// expressions. OpenIM pulls messages by seq from MongoDB when
		// Redis does not have them (msg.go FindSeqs: $project of $map
		// with $arrayElemAt) and reads version logs' changes
		// (findChangeLog: $cond, $filter, $size).
		name:    "aggregate.expressions",
		command: "aggregate",
		emulate: aggregatePipeline,
	},
	// The keyed collections (see keyed): a document inserted gets its key
	// as _id, and a filter that is exactly the key becomes one by _id.
	{
		name: "insert.keyed", command: "insert", collections: keyedCollections(),
		request: func(c *command) (func(bson.D) bson.D, bool) {
			key := keyed[c.body[0].Value.(string)]
			changed := false
			c.each("documents", func(d bson.D) bson.D {
				i := index(d, key)
				if i < 0 {
					return d
				}
				v, ok := d[i].Value.(string)
				if !ok {
					return d
				}
				changed = true
				if j := index(d, "_id"); j >= 0 {
					d[j].Value = v
					return d
				}
				return append(bson.D{{Key: "_id", Value: v}}, d...)
			})
			return nil, changed
		},
	},
	{
		name: "update.keyed", command: "update", collections: keyedCollections(),
		request: func(c *command) (func(bson.D) bson.D, bool) {
			// An upsert by the key would insert a document without
			// it: those go as they came (OpenIM sends none here).
			return nil, statements(c, "updates", func(st bson.D) bool {
				on, _ := truth(value(st, "upsert"))
				return !on
			})
		},
	},
	{
		name: "delete.keyed", command: "delete", collections: keyedCollections(),
		request: func(c *command) (func(bson.D) bson.D, bool) {
			return nil, statements(c, "deletes", func(bson.D) bool { return true })
		},
	},
	{
		name: "find.keyed", command: "find", collections: keyedCollections(),
		request: func(c *command) (func(bson.D) bson.D, bool) {
			i := index(c.body, "filter")
			if i < 0 {
				return nil, false
			}
			f, ok := byKey(c.body[0].Value.(string), c.body[i].Value)
			if ok {
				c.body[i].Value = f
			}
			return nil, ok
		},
	},
}

// statements rewrites the q of each update or delete statement that
// allowed says may be, and reports whether any was.
func statements(c *command, field string, allowed func(bson.D) bool) bool {
	coll := c.body[0].Value.(string)
	changed := false
	c.each(field, func(st bson.D) bson.D {
		i := index(st, "q")
		if i < 0 || !allowed(st) {
			return st
		}
		if f, ok := byKey(coll, st[i].Value); ok {
			st[i].Value = f
			changed = true
		}
		return st
	})
	return changed
}

// findAndModifyFields runs findAndModify without its projection and
// applies the projection to the document the reply carries in "value".
func findAndModifyFields(cmd bson.D) (bson.D, func(bson.D) bson.D, bool) {
	i := index(cmd, "fields")
	if i < 0 {
		return nil, nil, false
	}
	spec, ok := cmd[i].Value.(bson.D)
	if !ok {
		return nil, nil, false
	}
	p, ok := parseProjection(spec)
	if !ok {
		return nil, nil, false
	}
	out := append(append(bson.D{}, cmd[:i]...), cmd[i+1:]...)
	return out, func(reply bson.D) bson.D {
		j := index(reply, "value")
		if j < 0 {
			return reply
		}
		if doc, ok := reply[j].Value.(bson.D); ok {
			reply[j].Value = p.apply(doc)
		}
		return reply
	}, true
}

func index(d bson.D, key string) int {
	for i, e := range d {
		if e.Key == key {
			return i
		}
	}
	return -1
}

// match returns the first rewrite that takes c: having changed c, with
// the mend of its reply, or as an emulation to run.
func match(c *command) (rw *rewrite, mend func(bson.D) bson.D, exec func(env) bson.D) {
	for i := range rewrites {
		rw := &rewrites[i]
		if !rw.takes(c.body[0].Key, c.body[0].Value) {
			continue
		}
		if rw.emulate != nil {
			if exec, ok := rw.emulate(c.body); ok {
				return rw, nil, exec
			}
			continue
		}
		if mend, ok := rw.request(c); ok {
			return rw, mend, nil
		}
	}
	return nil, nil, nil
}

// takes reports whether rw is for a command of this name on this
// collection (the command's first value).
func (rw *rewrite) takes(command string, coll any) bool {
	if !strings.EqualFold(rw.command, command) {
		return false
	}
	if rw.collections == nil {
		return true
	}
	name, _ := coll.(string)
	for _, c := range rw.collections {
		if c == name {
			return true
		}
	}
	return false
}

// anyTakes reports whether some rewrite takes a command of this name on
// this collection: what is worth decoding.
func anyTakes(command string, coll any) bool {
	for i := range rewrites {
		if rewrites[i].takes(command, coll) {
			return true
		}
	}
	return false
}
