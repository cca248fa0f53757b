package mongofix

import (
	"bytes"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.mongodb.org/mongo-driver/x/mongo/driver/wiremessage"
)

// A message parsed and assembled again is the same bytes, document
// sequences included; a checksum is dropped with its flag.
func TestOpMsgRoundTrip(t *testing.T) {
	body, _ := bson.Marshal(bson.D{{Key: "insert", Value: "msg"}, {Key: "$db", Value: "openim_v3"}})
	d1, _ := bson.Marshal(bson.D{{Key: "doc_id", Value: "a:0"}})
	d2, _ := bson.Marshal(bson.D{{Key: "doc_id", Value: "b:0"}})
	m := opMsg{requestID: 7, responseTo: 3, body: body, sequences: []docSeq{{ident: "documents", docs: []bsoncore.Document{d1, d2}}}}
	b := m.bytes()
	got, ok, err := parseOpMsg(b)
	if err != nil || !ok {
		t.Fatalf("parse: %v, %v", ok, err)
	}
	if got.requestID != 7 || got.responseTo != 3 || !bytes.Equal(got.body, body) ||
		len(got.sequences) != 1 || got.sequences[0].ident != "documents" || len(got.sequences[0].docs) != 2 ||
		!bytes.Equal(got.sequences[0].docs[1], d2) {
		t.Fatalf("parsed %+v", got)
	}
	if !bytes.Equal(got.bytes(), b) {
		t.Error("assembled again, the bytes differ")
	}

	// The same with a checksum: parsed, then assembled without it.
	withSum := append(m.bytes(), 1, 2, 3, 4)
	withSum[0] += 4
	withSum[16] |= byte(wiremessage.ChecksumPresent)
	got, ok, err = parseOpMsg(withSum)
	if err != nil || !ok {
		t.Fatalf("parse with checksum: %v, %v", ok, err)
	}
	if !bytes.Equal(got.bytes(), b) {
		t.Error("with a checksum: assembled bytes differ from the message without")
	}
}

func TestOpMsgMalformed(t *testing.T) {
	body, _ := bson.Marshal(bson.D{{Key: "ping", Value: 1}})
	good := opMsg{body: body}.bytes()
	for name, msg := range map[string][]byte{
		"short header":     good[:10],
		"no flags":         good[:16],
		"body cut":         func() []byte { b := append([]byte{}, good[:len(good)-2]...); b[0] -= 2; return b }(),
		"no body":          opMsg{}.bytes()[:20],
		"checksum missing": func() []byte { b := append([]byte{}, good...); b[16] = 1; return b[:21] }(),
		"two bodies": func() []byte {
			b := append(append([]byte{}, good...), 0)
			b = append(b, body...)
			b[0] += byte(1 + len(body))
			return b
		}(),
	} {
		if _, ok, err := parseOpMsg(msg); err == nil && ok {
			t.Errorf("%s: parsed without an error", name)
		}
	}
	// Another op code passes through untouched: not an OP_MSG, no error.
	q := wiremessage.AppendHeader(nil, 16, 1, 0, wiremessage.OpQuery)
	if _, ok, err := parseOpMsg(q); ok || err != nil {
		t.Errorf("OP_QUERY: ok %v, err %v; want passed on", ok, err)
	}
}
