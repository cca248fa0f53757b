package openimtest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/push"
	"github.com/openimsdk/protocol/sdkws"
	"google.golang.org/protobuf/proto"
)

// Request identifiers, internal/msggateway/constant.go:43-57.
const (
	wsGetNewestSeq        = 1001
	wsPullMsgBySeqList    = 1002
	wsSendMsg             = 1003
	wsSendSignalMsg       = 1004
	wsPullMsg             = 1005
	wsGetConvMaxReadSeq   = 1006
	wsPullConvLastMessage = 1007
	wsPushMsg             = 2001
	wsKickOnlineMsg       = 2002
	wsLogoutMsg           = 2003
	wsSetBackgroundStatus = 2004
	wsSubUserOnlineStatus = 2005
)

// maxInflated bounds a gzip-compressed request once inflated. OpenIM reads
// it whole (compressor.go:95-113); a bound keeps a small frame from
// inflating without limit.
const maxInflated = 4 << 20

// wireReq and wireResp are the gateway's envelopes,
// internal/msggateway/message_handler.go:43-50 and 83-90; with
// sdkType=js they are JSON (encoder.go:54-74), data base64 by
// encoding/json, a protobuf inside.
type wireReq struct {
	ReqIdentifier int32  `json:"reqIdentifier"`
	Token         string `json:"token"`
	SendID        string `json:"sendID"`
	OperationID   string `json:"operationID"`
	MsgIncr       string `json:"msgIncr"`
	Data          []byte `json:"data"`
}

type wireResp struct {
	ReqIdentifier int32  `json:"reqIdentifier"`
	MsgIncr       string `json:"msgIncr"`
	OperationID   string `json:"operationID"`
	ErrCode       int    `json:"errCode"`
	ErrMsg        string `json:"errMsg"`
	Data          []byte `json:"data"`
}

// textMessage is message_handler.go:38-41: {"type":"ping"} is answered
// with the same object, type pong, body as it came (null if absent).
type textMessage struct {
	Type string          `json:"type"`
	Body json.RawMessage `json:"body"`
}

// conn is one gateway connection, OpenIM's Client (client.go:65-83).
type conn struct {
	s          *Server
	ws         *websocket.Conn
	id         uint64
	userID     string
	platformID int
	token      string
	compress   bool

	// wmu is Client.w: one writer at a time, each write synchronous with
	// a WriteTimeout deadline (client.go:346-373). held is the push the
	// ReorderPush fault holds back until the next push of heldKey (its
	// sender and conversation); both are guarded by wmu too.
	wmu     sync.Mutex
	held    []byte
	heldKey string

	background atomic.Bool
	writeDead  atomic.Bool // a write timed out: gorilla fails every write after
	closed     atomic.Bool
	closeOnce  sync.Once
	done       chan struct{} // closed by close
}

// serveGateway is wsHandler (internal/msggateway/ws_server.go:412-484).
// Refusals before the upgrade are HTTP 200 with an errCode body, as
// apiresp.HttpError writes them (http_error.go:22-25); a token refused
// with isMsgResp=true is upgraded, told in a text frame, and closed
// (long_conn.go:149-165).
func (s *Server) serveGateway(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	refuse := func(err error) {
		s.st.refusedLogins.Add(1)
		s.log.Debug("gateway refused", "remote", r.RemoteAddr, "err", err)
		writeEnvelope(w, parseError(err))
	}
	// ParseEssentialArgs (context.go:188-211).
	token, sendID, platform := q.Get("token"), q.Get("sendID"), q.Get("platformID")
	switch {
	case token == "":
		refuse(newCode(codeConnArgs, "token is empty"))
		return
	case sendID == "":
		refuse(newCode(codeConnArgs, "sendID is empty"))
		return
	case platform == "":
		refuse(newCode(codeConnArgs, "platformID is empty"))
		return
	}
	platformID, err := strconv.Atoi(platform)
	if err != nil {
		refuse(newCode(codeConnArgs, "platformID is not int"))
		return
	}
	switch q.Get("sdkType") {
	case "js":
	case "", "go":
		// OpenIM's default, gob (context.go:156-162, encoder.go:30-52),
		// is not spoken here.
		refuse(newCode(codeConnArgs, "sdkType=go (gob, the default) is not implemented by openimtest: use sdkType=js"))
		return
	default:
		refuse(newCode(codeConnArgs, "sdkType is not go or js"))
		return
	}
	// ShouldSendResp (context.go:164-175).
	sendResp, _ := strconv.ParseBool(q.Get("isMsgResp"))

	userID, tokPlatform, err := s.tokens.parse(token)
	if err != nil {
		if sendResp {
			s.st.refusedLogins.Add(1)
			if ws, uerr := s.upgrader.Upgrade(w, r, nil); uerr == nil {
				_ = s.writeText(ws, parseError(err))
				_ = ws.Close()
			}
			return // or the upgrader has answered
		}
		refuse(err)
		return
	}
	// validateRespWithRequest (ws_server.go:400-410).
	if userID != sendID {
		refuse(newCode(codeTokenInvalid, "token uid %s != userID %s", userID, sendID))
		return
	}
	if tokPlatform != platformID {
		refuse(newCode(codeTokenInvalid, "token platform %d != platformID %d", tokPlatform, platformID))
		return
	}
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	c := &conn{
		s: s, ws: ws, userID: userID, platformID: platformID, token: token,
		// GetCompression (context.go:143-154): the query or a header.
		compress: q.Get("compression") == "gzip" || r.Header.Get("compression") == "gzip",
		done:     make(chan struct{}),
	}
	// From here Close can reach c, even while the first frame is stuck
	// on a client that does not read.
	if !s.addLive(c) {
		_ = ws.Close()
		return
	}
	// OpenIM writes the first frame, then registers the connection
	// through a channel (ws_server.go:466-482): a push in between is
	// missed. Here the connection is registered first, its writer held
	// so that nothing overtakes the first frame: no push is missed.
	c.wmu.Lock()
	if !s.register(c) {
		c.wmu.Unlock()
		c.close(errServerClosed)
		return
	}
	if sendResp {
		// RespondWithSuccess (long_conn.go:167-179): {"errCode":0,...}.
		if err := s.writeText(ws, envelope{}); err != nil {
			c.wmu.Unlock()
			c.close(err)
			return
		}
	}
	c.wmu.Unlock()
	// ResetClient sets IsBackground from the URL and overwrites it with
	// false at once (client.go:91, 95): only 2004 sets it.
	s.st.logins.Add(1)
	s.log.Debug("gateway login", "user", userID, "platform", platformID, "conn", c.id)
	c.readLoop()
}

// writeText writes the first text frame of a connection.
func (s *Server) writeText(ws *websocket.Conn, e envelope) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_ = ws.SetWriteDeadline(time.Now().Add(s.o.WriteTimeout))
	return ws.WriteMessage(websocket.TextMessage, b)
}

// register adds c to the user's connections and applies multiLogin
// policy 1, AllLoginButSameTermKick (ws_server.go:248-274, 342-365): the
// user's older connections on the same platform are sent 2002 and
// closed, and every token of that platform but c's own is kicked. Other
// platforms stay online. It reports false once the server is closing.
func (s *Server) register(c *conn) bool {
	s.regMu.Lock()
	if s.closing {
		s.regMu.Unlock()
		return false
	}
	var old []*conn
	kept := make([]*conn, 0, len(s.conns[c.userID])+1)
	for _, o := range s.conns[c.userID] {
		if o.platformID == c.platformID {
			old = append(old, o)
		} else {
			kept = append(kept, o)
		}
	}
	s.setConns(c.userID, append(kept, c))
	s.regMu.Unlock()
	if len(old) > 0 {
		for _, o := range old {
			o.kick()
		}
		s.tokens.invalidate(c.userID, c.platformID, c.token)
	}
	return true
}

// addLive numbers c and lets Close reach it; false once the server is
// closing.
func (s *Server) addLive(c *conn) bool {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if s.closing {
		return false
	}
	s.nextID++
	c.id = s.nextID
	s.live[c] = struct{}{}
	return true
}

// setConns replaces a user's connections; callers hold regMu. The slice
// is never changed in place: pushes iterate copies of it.
func (s *Server) setConns(userID string, cs []*conn) {
	if len(cs) == 0 {
		delete(s.conns, userID)
		return
	}
	s.conns[userID] = cs
}

func (s *Server) unregister(c *conn) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	delete(s.live, c)
	cs := s.conns[c.userID]
	kept := make([]*conn, 0, len(cs))
	for _, o := range cs {
		if o != c {
			kept = append(kept, o)
		}
	}
	s.setConns(c.userID, kept)
}

// kick is KickOnlineMessage (client.go:328-336): 2002, then close. The
// caller has already taken c out of the registry.
func (c *conn) kick() {
	c.s.st.kicks.Add(1)
	_ = c.writeResp(wireResp{ReqIdentifier: wsKickOnlineMsg})
	c.close(errKicked)
}

var errKicked = errors.New("kicked")

// close is Client.close (client.go:270-280). It closes the TCP
// connection without a close frame, as OpenIM does, and does not wait for
// a write in progress (which the closed socket fails at once).
func (c *conn) close(reason error) {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		_ = c.ws.Close()
		close(c.done)
		c.s.unregister(c)
		if c.writeDead.Load() {
			c.s.st.slowConsumerDisconnects.Add(1)
		}
		c.s.log.Debug("gateway close", "user", c.userID, "platform", c.platformID, "conn", c.id, "reason", reason)
	})
}

// readLoop is Client.readMessage (client.go:130-187); it returns when
// the connection ends, which it then closes. Every frame from the client
// resets the read deadline; a ping is answered with a pong whose write
// error ends the loop, as client.go:113-120 returns it to gorilla.
func (c *conn) readLoop() {
	var reason error
	defer func() { c.close(reason) }()
	timeout := c.s.o.ReadTimeout
	c.ws.SetReadLimit(maxMessageSize) // over it, gorilla sends close 1009 and fails the read
	_ = c.ws.SetReadDeadline(time.Now().Add(timeout))
	c.ws.SetPongHandler(func(string) error {
		return c.ws.SetReadDeadline(time.Now().Add(timeout))
	})
	c.ws.SetPingHandler(func(app string) error {
		if err := c.ws.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		return c.writeControl(websocket.PongMessage, []byte(app))
	})
	if c.platformID == constant.WebPlatformID {
		c.s.track.spawn(c.heartbeat) // exits when c closes or the server does
	}
	for {
		mt, data, err := c.ws.ReadMessage()
		if err != nil {
			reason = err
			return
		}
		if c.closed.Load() {
			reason = errors.New("conn has closed")
			return
		}
		_ = c.ws.SetReadDeadline(time.Now().Add(timeout))
		switch mt {
		case websocket.BinaryMessage:
			err = c.handleBinary(data)
		case websocket.TextMessage:
			err = c.handleText(data)
		}
		if err != nil {
			reason = err
			return
		}
	}
}

// heartbeat is activeHeartbeat (client.go:376-400): Web connections
// only, a ping every PingPeriod, stopping at the first failed write
// without closing the connection.
func (c *conn) heartbeat() {
	t := time.NewTicker(c.s.o.PingPeriod)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := c.writeControl(websocket.PingMessage, nil); err != nil {
				return
			}
		case <-c.done:
			return
		case <-c.s.done:
			return
		}
	}
}

// handleText is handlerTextMessage (client.go:441-464): anything but
// ping or pong, or text that is not JSON, closes the connection.
func (c *conn) handleText(b []byte) error {
	var m textMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	switch m.Type {
	case "pong":
		return nil
	case "ping":
		c.s.st.textPings.Add(1)
		m.Type = "pong"
		out, err := json.Marshal(m)
		if err != nil {
			return err
		}
		c.wmu.Lock()
		defer c.wmu.Unlock()
		if err := c.ws.SetWriteDeadline(time.Now().Add(c.s.o.WriteTimeout)); err != nil {
			return err
		}
		err = c.ws.WriteMessage(websocket.TextMessage, out)
		c.noteWriteErr(err)
		return err
	default:
		return fmt.Errorf("not support message type %s", m.Type)
	}
}

// handleBinary is Client.handleMessage (client.go:190-257): a frame that
// does not decode, or whose sendID is not the connection's user, or
// whose reqIdentifier is unknown, closes the connection; anything else
// is answered.
func (c *conn) handleBinary(b []byte) error {
	if c.compress {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return err
		}
		b, err = io.ReadAll(io.LimitReader(zr, maxInflated+1))
		if err != nil {
			return err
		}
		if len(b) > maxInflated {
			return fmt.Errorf("inflated request over %d bytes", maxInflated)
		}
	}
	var req wireReq
	if err := json.Unmarshal(b, &req); err != nil {
		return errors.New("JsonEncoder.Decode failed")
	}
	if req.SendID != c.userID {
		return fmt.Errorf("exception conn userID not same to req userID: %s", req.SendID)
	}
	var (
		data  []byte
		err   error
		after func()
	)
	switch req.ReqIdentifier {
	case wsGetNewestSeq:
		data, err = c.s.getNewestSeq(&req)
	case wsSendMsg:
		data, after, err = c.s.sendMsg(c, &req)
	case wsSendSignalMsg:
		// SendSignalMessage sends a nil SendMsgReq (message_handler.go:
		// 175-185), which the msg service's Check refuses.
		err = newCode(codeArgs, "MsgData is empty")
	case wsPullMsgBySeqList:
		data, err = c.s.pullBySeqs(&req)
	case wsLogoutMsg:
		var r push.DelUserPushTokenReq
		if err = proto.Unmarshal(req.Data, &r); err == nil {
			data, err = proto.Marshal(&push.DelUserPushTokenResp{})
		}
	case wsSetBackgroundStatus:
		// message_handler.go:260-269, client.go:259-268.
		var r sdkws.SetAppBackgroundStatusReq
		if err = proto.Unmarshal(req.Data, &r); err == nil {
			if err = validateReq(&req, "SetAppBackgroundStatusReq"); err == nil {
				c.background.Store(r.IsBackground)
			}
		}
	case wsPullMsg, wsGetConvMaxReadSeq, wsPullConvLastMessage, wsSubUserOnlineStatus:
		err = newCode(codeServerInternal, "openimtest: reqIdentifier %d is not implemented", req.ReqIdentifier)
	default:
		return fmt.Errorf("ReqIdentifier failed,sendID:%s,msgIncr:%s,reqIdentifier:%d", req.SendID, req.MsgIncr, req.ReqIdentifier)
	}
	c.reply(&req, err, data)
	if after != nil {
		after()
	}
	if req.ReqIdentifier == wsLogoutMsg {
		// replyMessage ends the connection after a logout (client.go:
		// 300-302).
		return errors.New("user logout")
	}
	return nil
}

// validateReq is the validator run on the envelope by the pull and
// background handlers (message_handler.go:192, 265): its required tags
// (message_handler.go:44-48). Failing it is not a CodeError: 500.
func validateReq(r *wireReq, dataType string) error {
	for _, f := range []struct {
		name  string
		empty bool
	}{{"ReqIdentifier", r.ReqIdentifier == 0}, {"SendID", r.SendID == ""},
		{"OperationID", r.OperationID == ""}, {"MsgIncr", r.MsgIncr == ""}} {
		if f.empty {
			return fmt.Errorf("Key: 'Req.%s' Error:Field validation for '%s' failed on the 'required' tag: validation failed, dataType=%s",
				f.name, f.name, dataType)
		}
	}
	return nil
}

// reply is replyMessage (client.go:282-304): the request's identifier,
// msgIncr and operationID echoed, errCode and errMsg from the error. A
// write error is only logged there, so it does not end the loop here
// either.
func (c *conn) reply(req *wireReq, err error, data []byte) {
	resp := wireResp{ReqIdentifier: req.ReqIdentifier, MsgIncr: req.MsgIncr, OperationID: req.OperationID, Data: data}
	if err != nil {
		e := parseError(err)
		resp.ErrCode, resp.ErrMsg, resp.Data = e.ErrCode, e.ErrMsg, nil
		var ce *codeError
		if errors.As(err, &ce) {
			// The real errMsg of a gRPC-borne error is the whole
			// formatted error; this keeps its "code name: reason" part.
			resp.ErrMsg = ce.Error()
		}
	} else if req.ReqIdentifier == wsSendMsg {
		c.s.st.sendsAcked.Add(1)
	}
	if werr := c.writeResp(resp); werr != nil {
		c.s.log.Debug("gateway reply write", "conn", c.id, "err", werr)
	}
}

// writeResp is writeBinaryMsg (client.go:346-373): a closed connection
// is skipped without error.
func (c *conn) writeResp(r wireResp) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(b)
}

// writeLocked writes one binary frame, gzipped if the connection asked
// for it; the caller holds wmu.
func (c *conn) writeLocked(b []byte) error {
	if c.closed.Load() {
		return nil
	}
	if c.compress {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(b)
		if err := zw.Close(); err != nil {
			return err
		}
		b = buf.Bytes()
	}
	if err := c.ws.SetWriteDeadline(time.Now().Add(c.s.o.WriteTimeout)); err != nil {
		return err
	}
	err := c.ws.WriteMessage(websocket.BinaryMessage, b)
	c.noteWriteErr(err)
	return err
}

// writeControl writes a ping or pong under wmu, as writePingMsg and
// writePongMsg do (client.go:402-439).
func (c *conn) writeControl(mt int, data []byte) error {
	if c.closed.Load() {
		return nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := c.ws.WriteControl(mt, data, time.Now().Add(c.s.o.WriteTimeout))
	c.noteWriteErr(err)
	return err
}

// noteWriteErr marks a connection whose write deadline expired: a slow
// consumer.
func (c *conn) noteWriteErr(err error) {
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() && !c.closed.Load() && !c.writeDead.Swap(true) {
		c.s.st.slowConsumers.Add(1)
		c.s.log.Debug("gateway slow consumer", "user", c.userID, "platform", c.platformID, "conn", c.id)
	}
}
