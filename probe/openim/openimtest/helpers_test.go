package openimtest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/openimsdk/protocol/auth"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/msg"
	"github.com/openimsdk/protocol/sdkws"
	"github.com/openimsdk/protocol/user"
	"google.golang.org/protobuf/proto"
)

const testSecret = "test-secret"

// waitGuard only keeps a broken test from hanging: every wait in these
// tests ends on an event (a frame, a counter), never on a duration.
const waitGuard = 20 * time.Second

func newServer(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Secret == "" {
		o.Secret = testSecret
	}
	s, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// apiEnvelope is a REST answer with its data still raw.
type apiEnvelope struct {
	ErrCode int             `json:"errCode"`
	ErrMsg  string          `json:"errMsg"`
	ErrDlt  string          `json:"errDlt"`
	Data    json.RawMessage `json:"data"`
}

var httpClient = &http.Client{Transport: &http.Transport{}}

// call posts body to the API with an operationID and, if token is not
// empty, a token header.
func call(t testing.TB, s *Server, path, token string, body any) apiEnvelope {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, s.APIURL()+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("operationID", "op-"+path)
	if token != "" {
		req.Header.Set("token", token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d, body %q", path, resp.StatusCode, raw)
	}
	var e apiEnvelope
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("POST %s: %v in %q", path, err, raw)
	}
	return e
}

// mustOK calls and fails the test on a non-zero errCode, decoding data
// into out if out is not nil.
func mustOK(t testing.TB, s *Server, path, token string, body, out any) {
	t.Helper()
	e := call(t, s, path, token, body)
	if e.ErrCode != 0 {
		t.Fatalf("POST %s: errCode %d %s %s", path, e.ErrCode, e.ErrMsg, e.ErrDlt)
	}
	if out != nil {
		if err := json.Unmarshal(e.Data, out); err != nil {
			t.Fatalf("POST %s: data %s: %v", path, e.Data, err)
		}
	}
}

func adminToken(t testing.TB, s *Server) string {
	t.Helper()
	var r auth.GetAdminTokenResp
	mustOK(t, s, "/auth/get_admin_token", "", &auth.GetAdminTokenReq{Secret: testSecret, UserID: adminUserID}, &r)
	return r.Token
}

func register(t testing.TB, s *Server, admin string, ids ...string) {
	t.Helper()
	req := &user.UserRegisterReq{}
	for _, id := range ids {
		req.Users = append(req.Users, &sdkws.UserInfo{UserID: id, Nickname: "n" + id})
	}
	mustOK(t, s, "/user/user_register", admin, req, nil)
}

func userToken(t testing.TB, s *Server, admin, id string, platform int32) string {
	t.Helper()
	var r auth.GetUserTokenResp
	mustOK(t, s, "/auth/get_user_token", admin, &auth.GetUserTokenReq{UserID: id, PlatformID: platform}, &r)
	return r.Token
}

// wsURL is the gateway URL of a login; extra overrides or adds query
// parameters.
func wsURL(s *Server, id string, platform int32, token string, extra url.Values) string {
	q := url.Values{"sendID": {id}, "token": {token}, "platformID": {strconv.Itoa(int(platform))},
		"operationID": {"op-login"}, "sdkType": {"js"}, "isMsgResp": {"true"}}
	for k, v := range extra {
		q[k] = v
	}
	return s.WSURL() + "/?" + q.Encode()
}

// frame is a binary frame as the client saw it, or a text frame.
type frame struct {
	resp   wireResp
	text   []byte
	at     time.Time
	pushes []pushed // decoded once, for a 2001
}

// client is a raw gorilla client: a reader goroutine keeps every frame.
type client struct {
	t        testing.TB
	ws       *websocket.Conn
	user     string
	compress bool
	incr     atomic.Int64

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every new frame
	frames  []frame
	readErr error
	ended   bool
	gone    chan struct{} // the reader has returned

	wmu sync.Mutex
}

type dialOpt struct {
	extra     url.Values
	rcvBuf    int  // SO_RCVBUF before connect, for a slow reader
	noReader  bool // read nothing: a slow consumer
	noMsgResp bool // isMsgResp=false
	// onPing and onPong replace gorilla's handlers before the reader
	// starts.
	onPing, onPong func(string) error
}

// dial logs in; with isMsgResp it checks the first text frame is
// errCode 0.
func dial(t testing.TB, s *Server, id string, platform int32, token string, o dialOpt) *client {
	t.Helper()
	c, resp, err := tryDial(t, s, id, platform, token, o)
	if err != nil {
		t.Fatalf("dial %s/%d: %v (http %v)", id, platform, err, resp)
	}
	t.Cleanup(c.close)
	if !o.noMsgResp {
		f := c.waitFrame(func(f frame) bool { return f.text != nil })
		var e apiEnvelope
		if err := json.Unmarshal(f.text, &e); err != nil || e.ErrCode != 0 {
			t.Fatalf("first frame %s, want errCode 0", f.text)
		}
	}
	return c
}

func tryDial(t testing.TB, s *Server, id string, platform int32, token string, o dialOpt) (*client, *http.Response, error) {
	extra := url.Values{}
	for k, v := range o.extra {
		extra[k] = v
	}
	if o.noMsgResp {
		extra.Set("isMsgResp", "false")
	}
	d := websocket.Dialer{HandshakeTimeout: waitGuard}
	if o.rcvBuf > 0 {
		nd := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, o.rcvBuf)
			})
			if err != nil {
				return err
			}
			return serr
		}}
		d.NetDialContext = nd.DialContext
	}
	ws, resp, err := d.Dial(wsURL(s, id, platform, token, extra), nil)
	if err != nil {
		return nil, resp, err
	}
	c := &client{t: t, ws: ws, user: id, compress: extra.Get("compression") == "gzip",
		changed: make(chan struct{}), gone: make(chan struct{})}
	if o.onPing != nil {
		ws.SetPingHandler(o.onPing)
	}
	if o.onPong != nil {
		ws.SetPongHandler(o.onPong)
	}
	if o.noReader {
		close(c.gone)
	} else {
		go c.read()
	}
	return c, resp, nil
}

func (c *client) read() {
	defer close(c.gone)
	for {
		mt, b, err := c.ws.ReadMessage()
		c.mu.Lock()
		if err != nil {
			c.readErr, c.ended = err, true
			close(c.changed)
			c.mu.Unlock()
			return
		}
		f := frame{at: time.Now()}
		if mt == websocket.TextMessage {
			f.text = b
		} else {
			if c.compress {
				zr, zerr := gzip.NewReader(bytes.NewReader(b))
				if zerr == nil {
					b, zerr = io.ReadAll(zr)
				}
				if zerr != nil {
					b = nil
				}
			}
			if err := json.Unmarshal(b, &f.resp); err != nil {
				f.resp.ErrMsg = "undecodable: " + err.Error()
			}
			f.pushes = decodePush(f)
		}
		c.frames = append(c.frames, f)
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

func (c *client) close() {
	_ = c.ws.Close()
	<-c.gone
}

// until waits for cond over the frames so far to hold, and fails the
// test if the connection ends first or the guard passes.
func (c *client) until(what string, cond func(fs []frame) bool) []frame {
	c.t.Helper()
	guard := time.After(waitGuard)
	for {
		c.mu.Lock()
		fs, ended, err, ch := c.frames, c.ended, c.readErr, c.changed
		ok := cond(fs)
		c.mu.Unlock()
		if ok {
			return fs
		}
		if ended {
			c.t.Fatalf("%s: %s: connection ended: %v", c.user, what, err)
		}
		select {
		case <-ch:
		case <-guard:
			c.t.Fatalf("%s: %s: nothing after %s", c.user, what, waitGuard)
		}
	}
}

func (c *client) waitFrame(match func(frame) bool) frame {
	c.t.Helper()
	var got frame
	c.until("frame", func(fs []frame) bool {
		for _, f := range fs {
			if match(f) {
				got = f
				return true
			}
		}
		return false
	})
	return got
}

// waitEnd waits for the server to end the connection and returns the
// read error.
func (c *client) waitEnd() error {
	c.t.Helper()
	select {
	case <-c.gone:
	case <-time.After(waitGuard):
		c.t.Fatalf("%s: connection still open after %s", c.user, waitGuard)
	}
	return c.readErr
}

func (c *client) writeBinary(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.compress {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(b)
		_ = zw.Close()
		b = buf.Bytes()
	}
	return c.ws.WriteMessage(websocket.BinaryMessage, b)
}

func (c *client) writeText(s string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.ws.WriteMessage(websocket.TextMessage, []byte(s))
}

// request sends a request envelope and returns its msgIncr.
func (c *client) request(id int32, m proto.Message) string {
	c.t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	incr := fmt.Sprintf("%s-%d", c.user, c.incr.Add(1))
	b, _ := json.Marshal(wireReq{ReqIdentifier: id, SendID: c.user, OperationID: "op-" + incr, MsgIncr: incr, Data: data})
	if err := c.writeBinary(b); err != nil {
		c.t.Fatalf("%s: write: %v", c.user, err)
	}
	return incr
}

func (c *client) answer(id int32, incr string) wireResp {
	c.t.Helper()
	return c.waitFrame(func(f frame) bool { return f.resp.ReqIdentifier == id && f.resp.MsgIncr == incr }).resp
}

// call sends a request, waits for its answer and, if errCode is 0,
// decodes its data into out.
func (c *client) call(id int32, req, out proto.Message) wireResp {
	c.t.Helper()
	r := c.answer(id, c.request(id, req))
	if r.ErrCode == 0 && out != nil {
		if err := proto.Unmarshal(r.Data, out); err != nil {
			c.t.Fatalf("%s: answer to %d: %v", c.user, id, err)
		}
	}
	return r
}

func textMsg(from, to, clientMsgID, text string) *sdkws.MsgData {
	content, _ := json.Marshal(map[string]string{"content": text})
	return &sdkws.MsgData{SendID: from, RecvID: to, ClientMsgID: clientMsgID, SenderPlatformID: constant.WindowsPlatformID,
		SessionType: constant.SingleChatType, MsgFrom: constant.UserMsgType, ContentType: constant.Text,
		Content: content, CreateTime: time.Now().UnixMilli(), Status: constant.MsgStatusSending}
}

func groupMsg(from, groupID, clientMsgID, text string) *sdkws.MsgData {
	m := textMsg(from, "", clientMsgID, text)
	m.SessionType, m.GroupID = constant.ReadGroupChatType, groupID
	return m
}

// send sends m and waits for its ack.
func (c *client) send(m *sdkws.MsgData) (wireResp, *msg.SendMsgResp) {
	c.t.Helper()
	var ack msg.SendMsgResp
	r := c.call(wsSendMsg, m, &ack)
	return r, &ack
}

// pushed is one message of a 2001 as a client saw it.
type pushed struct {
	conv         string
	notification bool
	msg          *sdkws.MsgData
	at           time.Time
}

// decodePush decodes a 2001 frame; a frame that does not decode gives
// a pushed with a nil msg, which tests report.
func decodePush(f frame) []pushed {
	if f.resp.ReqIdentifier != wsPushMsg {
		return nil
	}
	var pm sdkws.PushMessages
	if err := proto.Unmarshal(f.resp.Data, &pm); err != nil {
		return []pushed{{conv: "undecodable: " + err.Error()}}
	}
	var out []pushed
	for conv, ms := range pm.Msgs {
		for _, m := range ms.Msgs {
			out = append(out, pushed{conv: conv, msg: m, at: f.at})
		}
	}
	for conv, ms := range pm.NotificationMsgs {
		for _, m := range ms.Msgs {
			out = append(out, pushed{conv: conv, notification: true, msg: m, at: f.at})
		}
	}
	return out
}

// waitPushes waits until the client holds n pushed messages of conv and
// returns them in arrival order.
func (c *client) waitPushes(conv string, n int) []pushed {
	c.t.Helper()
	var got []pushed
	c.until(fmt.Sprintf("%d pushes of %s", n, conv), func(fs []frame) bool {
		got = got[:0]
		for _, f := range fs {
			for _, p := range f.pushes {
				if p.conv == conv {
					got = append(got, p)
				}
			}
		}
		return len(got) >= n
	})
	return got
}

// waitStats polls the server's counters until cond holds.
func waitStats(t testing.TB, s *Server, what string, cond func(Stats) bool) Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitGuard)
	defer cancel()
	for {
		st := s.Stats()
		if cond(st) {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: stats %+v", what, st)
		case <-time.After(time.Millisecond):
		}
	}
}

func seqs(ps []pushed) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.msg.Seq
	}
	return out
}
