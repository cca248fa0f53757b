package openim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/sdkws"
	"google.golang.org/protobuf/proto"
)

// The gateway's frames, with sdkType=js (internal/msggateway
// message_handler.go, encoder.go): a request is a binary frame of the JSON
// Req, a reply or push a binary frame of the JSON Resp, and data in either
// is a protobuf message as base64, which encoding/json gives a []byte. The
// heartbeat is text: {"type":"ping"} answered by {"type":"pong"}. The login's
// first frame (isMsgResp=true) is text too: OpenIM's API envelope.

// Request identifiers (internal/msggateway/constant.go).
const (
	reqNewestSeq = 1001 // GetNewestSeq: sdkws.GetMaxSeqReq → GetMaxSeqResp
	reqPullSeqs  = 1002 // PullMsgBySeqList: sdkws.PullMessageBySeqsReq → PullMessageBySeqsResp
	reqSend      = 1003 // SendMsg: sdkws.MsgData → msg.SendMsgResp
	pushMsg      = 2001 // PushMsg: sdkws.PushMessages
	pushKick     = 2002 // KickOnlineMsg: the connection is closed after it
	reqLogout    = 2003
	pushDataErr  = 3001
)

// request is the gateway's Req, as the JSON encoder writes it.
type request struct {
	ReqIdentifier int32  `json:"reqIdentifier"`
	Token         string `json:"token"`
	SendID        string `json:"sendID"`
	OperationID   string `json:"operationID"`
	MsgIncr       string `json:"msgIncr"`
	Data          []byte `json:"data"`
}

// frame is what one frame from the gateway may be: a Resp (reply or push),
// the text pong (Type), or the login's first frame (ErrCode alone).
type frame struct {
	Type          string `json:"type"`
	ReqIdentifier int32  `json:"reqIdentifier"`
	MsgIncr       string `json:"msgIncr"`
	OperationID   string `json:"operationID"`
	ErrCode       int    `json:"errCode"`
	ErrMsg        string `json:"errMsg"`
	ErrDlt        string `json:"errDlt"`
	Data          []byte `json:"data"`
}

// errMalformed wraps every decoding failure of a gateway frame.
var errMalformed = errors.New("malformed OpenIM frame")

// decodeFrame decodes one frame from the gateway into f.
func decodeFrame(b []byte, f *frame) error {
	*f = frame{}
	if err := json.Unmarshal(b, f); err != nil {
		return fmt.Errorf("%w: %v", errMalformed, err)
	}
	return nil
}

// encodeRequest encodes a request whose data is m.
func encodeRequest(id int32, userID, token, opID, incr string, m proto.Message) ([]byte, error) {
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(&request{ReqIdentifier: id, Token: token, SendID: userID, OperationID: opID, MsgIncr: incr, Data: data})
}

// textContent is the content of a text message (contentType 101), the
// JSON of OpenIM's TextElem.
type textContent struct {
	Content string `json:"content"`
}

// textBody returns the text of a text message's content; ok is false for
// another kind of message or content that is not a TextElem.
func textBody(m *sdkws.MsgData) (body []byte, ok bool) {
	if m.ContentType != constant.Text {
		return nil, false
	}
	var t textContent
	if json.Unmarshal(m.Content, &t) != nil {
		return nil, false
	}
	return []byte(t.Content), true
}

// conversationID returns the conversation of m as OpenIM names it
// (pkg/msgprocessor GetConversationIDByMsg): si_A_B for a direct chat, the
// two user ids sorted; sg_GROUP for a group.
func conversationID(m *sdkws.MsgData) string {
	if m.SessionType == constant.ReadGroupChatType {
		return "sg_" + m.GroupID
	}
	return directConversation(m.SendID, m.RecvID)
}

// directConversation returns the conversation id of a and b's direct chat.
func directConversation(a, b string) string {
	if b < a {
		a, b = b, a
	}
	return "si_" + a + "_" + b
}

// incr formats a msgIncr.
func incr(n uint64) string { return strconv.FormatUint(n, 36) }
