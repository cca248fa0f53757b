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
}

// rewrites lists every rewrite, in the order they are tried.
var rewrites = []rewrite{
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

// find returns the rewrite for a command name, or nil.
func find(command string) *rewrite {
	for i := range rewrites {
		if strings.EqualFold(rewrites[i].command, command) {
			return &rewrites[i]
		}
	}
	return nil
}
