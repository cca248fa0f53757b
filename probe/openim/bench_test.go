package openim

import (
	"encoding/json"
	"testing"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/sdkws"
	"google.golang.org/protobuf/proto"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
)

// appendPush appends the gateway's push (2001) of body as group message
// seq of sg_imcanary-g3, built as openimtest and OpenIM build it: the
// MsgData in PushMessages, protobuf, in the JSON envelope.
func appendPush(dst, body []byte, seq int64) []byte {
	m := &sdkws.MsgData{
		SendID: "imcanary_2du17", GroupID: "imcanary-g3", ClientMsgID: "c", ServerMsgID: "s", SenderPlatformID: 3,
		SessionType: constant.ReadGroupChatType, MsgFrom: constant.UserMsgType, ContentType: constant.Text,
		Content: jsonText(body), Seq: seq, SendTime: 1, CreateTime: 1,
	}
	data, _ := proto.Marshal(&sdkws.PushMessages{Msgs: map[string]*sdkws.PullMsgs{"sg_imcanary-g3": {Msgs: []*sdkws.MsgData{m}}}})
	b, _ := json.Marshal(&frame{ReqIdentifier: pushMsg, OperationID: "op", Data: data})
	return append(dst, b...)
}

// BenchmarkFrameToLedger measures a group delivery from the gateway's
// push frame to the ledger's counters through this adapter (encoding/json
// for the envelope, base64, protobuf, the text content's JSON), beside the
// native reference adapter (conformance.BenchmarkFrames). Its "build" is
// large: the push is built with the same libraries it is read with.
func BenchmarkFrameToLedger(b *testing.B) { conformance.BenchmarkFrames(b, benchFrames()) }

// TestBenchFrames: the benchmark's frames are ones the adapter delivers.
func TestBenchFrames(t *testing.T) { conformance.CheckFrames(t, benchFrames()) }

// benchFrames is the gateway's push (2001) of a group message, and the
// session's frame reader.
func benchFrames() conformance.Frames {
	return conformance.Frames{
		Name:  "openim",
		Build: func(dst, body []byte, seq uint64) []byte { return appendPush(dst, body, int64(seq)) },
		Decoder: func(tb testing.TB, h probe.Handler) func([]byte, int64) error {
			s, _ := fuzzSession(tb)
			s.h = h
			return s.Frame
		},
	}
}
