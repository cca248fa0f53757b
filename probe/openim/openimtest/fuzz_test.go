package openimtest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/sdkws"
	"google.golang.org/protobuf/proto"
)

// FuzzGatewayFrame hands the gateway any frame, then a newest-seq
// request: the server must answer that request or close the connection,
// never crash or hang. A closed connection is dialled again for the next
// input.
func FuzzGatewayFrame(f *testing.F) {
	s := newServer(f, Options{})
	admin := adminToken(f, s)
	register(f, s, admin, "u")
	tok := userToken(f, s, admin, "u", constant.WindowsPlatformID)
	data, _ := proto.Marshal(&sdkws.GetMaxSeqReq{UserID: "u"})
	msgData, _ := proto.Marshal(textMsg("u", "u", "c", "x"))
	for _, seed := range []wireReq{
		{ReqIdentifier: wsGetNewestSeq, SendID: "u", OperationID: "o", MsgIncr: "1", Data: data},
		{ReqIdentifier: wsSendMsg, SendID: "u", OperationID: "o", MsgIncr: "2", Data: msgData},
		{ReqIdentifier: wsPullMsgBySeqList, SendID: "u", OperationID: "o", MsgIncr: "3", Data: msgData},
		{ReqIdentifier: wsSetBackgroundStatus, SendID: "u", OperationID: "o", MsgIncr: "4", Data: []byte{0xff}},
	} {
		b, _ := json.Marshal(seed)
		f.Add(b, false)
	}
	f.Add([]byte(`{"type":"ping","body":{"x":1}}`), true)
	f.Add([]byte(`{`), false)

	var ws *websocket.Conn
	n := 0
	f.Cleanup(func() {
		if ws != nil {
			_ = ws.Close()
		}
	})
	f.Fuzz(func(t *testing.T, b []byte, text bool) {
		if ws == nil {
			var err error
			if ws, _, err = websocket.DefaultDialer.Dial(wsURL(s, "u", constant.WindowsPlatformID, tok, nil), nil); err != nil {
				t.Fatalf("dial: %v", err)
			}
			if _, _, err := ws.ReadMessage(); err != nil { // the errCode 0 frame
				t.Fatalf("first frame: %v", err)
			}
		}
		mt := websocket.BinaryMessage
		if text {
			mt = websocket.TextMessage
		}
		n++
		incr := fmt.Sprint("sentinel-", n)
		sentinel, _ := json.Marshal(wireReq{ReqIdentifier: wsGetNewestSeq, SendID: "u", OperationID: "o", MsgIncr: incr, Data: data})
		if ws.WriteMessage(mt, b) != nil || ws.WriteMessage(websocket.BinaryMessage, sentinel) != nil {
			_ = ws.Close()
			ws = nil
			return
		}
		_ = ws.SetReadDeadline(time.Now().Add(waitGuard))
		for {
			_, got, err := ws.ReadMessage()
			if err != nil {
				if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
					t.Fatalf("no answer to the sentinel and no close after %s", waitGuard)
				}
				_ = ws.Close()
				ws = nil
				return
			}
			var r wireResp
			if json.Unmarshal(got, &r) == nil && r.MsgIncr == incr {
				if r.ErrCode != 0 {
					t.Fatalf("sentinel answered %d %s", r.ErrCode, r.ErrMsg)
				}
				return
			}
		}
	})
}
