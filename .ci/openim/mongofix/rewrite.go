package mongofix

import (
	"strings"

	"go.mongodb.org/mongo-driver/bson"
)

// A rewrite turns one command FerretDB v1 cannot run into one it can, and
// mends the reply so that the client sees what MongoDB would have said.
// Each exists because OpenIM v3.8.3 sends that command on a path imcanary
// tests; nothing else is touched.
type rewrite struct {
	// name identifies the rewrite in logs and counts.
	name string
	// command is the command's name, the body's first key (matched
	// without case, as the server does).
	command string
	// request returns the command to send instead and a function that
	// mends its reply, or ok false to pass the command on unchanged.
	request func(cmd bson.D) (out bson.D, reply func(bson.D) bson.D, ok bool)
	// emulate, instead of request, runs the command as others that
	// FerretDB can run and answers it itself.
	emulate emulation
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
		request: findAndModifyFields,
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

// match returns the first rewrite that takes cmd: a request to send
// instead with the mend of its reply, or an emulation to run.
func match(cmd bson.D) (rw *rewrite, out bson.D, mend func(bson.D) bson.D, exec func(env) bson.D) {
	if len(cmd) == 0 {
		return nil, nil, nil, nil
	}
	for i := range rewrites {
		rw := &rewrites[i]
		if !strings.EqualFold(rw.command, cmd[0].Key) {
			continue
		}
		if rw.emulate != nil {
			if exec, ok := rw.emulate(cmd); ok {
				return rw, nil, nil, exec
			}
			continue
		}
		if out, mend, ok := rw.request(cmd); ok {
			return rw, out, mend, nil
		}
	}
	return nil, nil, nil, nil
}

// takes reports whether some rewrite is for a command of this name.
func takes(command string) bool {
	for i := range rewrites {
		if strings.EqualFold(rewrites[i].command, command) {
			return true
		}
	}
	return false
}
