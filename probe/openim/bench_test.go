package openim

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/sdkws"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/reference"
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
// for the envelope, base64, protobuf, the text content's JSON) and through
// the native reference adapter, in one run: compare them. "build" is the
// frame construction both include, and is large here: the push is built
// with the same libraries it is read with.
func BenchmarkFrameToLedger(b *testing.B) {
	for _, name := range []string{"build", "reference", "openim"} {
		b.Run(name, func(b *testing.B) {
			set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
			start := time.Now().UnixNano()
			in := engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()
			h := probetest.InboxHandler{In: in}
			s, _ := fuzzSession(b)
			s.h = h
			ref := reference.NewDecoder(h)
			var buf, body []byte
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				hd := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3"), Seq: uint64(i + 1), Intended: start + int64(i)}
				body = probe.AppendBody(body[:0], &hd, 0)
				switch name {
				case "build":
					buf = appendPush(buf[:0], body, int64(i+1))
				case "reference":
					buf = append(buf[:0], `{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"123456","seq":77,"body":`...)
					buf = jsonscan.AppendString(buf, body)
					buf = append(buf, '}')
					if err := ref.Frame(buf, start+int64(i)+1e6); err != nil {
						b.Fatal(err)
					}
				case "openim":
					buf = appendPush(buf[:0], body, int64(i+1))
					if err := s.Frame(buf, start+int64(i)+1e6); err != nil {
						b.Fatal(err)
					}
				}
			}
			if name != "build" && metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered) < float64(b.N) {
				b.Fatal("deliveries not counted")
			}
		})
	}
}
