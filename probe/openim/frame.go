package openim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

// OpenIM takes user ids of letters, digits and '_' only
// (datautil.IsLegalUserID, which /user/user_register checks), and
// imcanary's names hold '-' (PREFIX-uN). openimID escapes a name into that
// alphabet, reversibly so that a push's sendID names its sender again: '_'
// is doubled and every other byte outside it is '_' and two hex digits.
func openimID(name string) string {
	legal := true
	for i := 0; i < len(name); i++ {
		if !idByte(name[i]) || name[i] == '_' {
			legal = false
			break
		}
	}
	if legal {
		return name
	}
	const hex = "0123456789abcdef"
	b := make([]byte, 0, len(name)+8)
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '_':
			b = append(b, '_', '_')
		case idByte(c):
			b = append(b, c)
		default:
			b = append(b, '_', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}

// userName reverses openimID; an id it did not make comes back as it is.
func userName(id string) string {
	if !strings.Contains(id, "_") {
		return id
	}
	b := make([]byte, 0, len(id))
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c != '_':
			b = append(b, c)
		case i+1 < len(id) && id[i+1] == '_':
			b = append(b, '_')
			i++
		case i+2 < len(id):
			hi, ok1 := unhex(id[i+1])
			lo, ok2 := unhex(id[i+2])
			if !ok1 || !ok2 {
				return id
			}
			b = append(b, hi<<4|lo)
			i += 2
		default:
			return id
		}
	}
	return string(b)
}

func idByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// errText is what imcanary keeps of an OpenIM errMsg for a log line, an
// error or a rejection's reason. The real server's messages carry the Go
// call stack after " | " and can echo the token they refused
// ("token=…"): only the head is kept, with any token blanked, and short.
func errText(msg string) string {
	msg, _, _ = strings.Cut(msg, " | ")
	for _, key := range []string{"token=", "Token="} {
		for i := 0; ; {
			j := strings.Index(msg[i:], key)
			if j < 0 {
				break
			}
			start := i + j + len(key)
			end := strings.IndexAny(msg[start:], " ,;)\"")
			if end < 0 {
				end = len(msg) - start
			}
			msg = msg[:start] + "…" + msg[start+end:]
			i = start + len("…")
		}
	}
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	return msg
}
