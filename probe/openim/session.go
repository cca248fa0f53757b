package openim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/msg"
	"github.com/openimsdk/protocol/sdkws"
	"google.golang.org/protobuf/proto"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// Catch-up limits, per session.
const (
	// pullPage is the most messages one range of a pull asks for, and
	// pullRanges the most ranges one pull carries: 800 messages of a
	// 4 KiB body are some 4.4 MB of base64, near max_frame's default.
	pullPage   = 200
	pullRanges = 4
	// dueEvery is how often the session, on a frame, asks the Catchup what is due: a gap
	// waits for its grace anyway.
	dueEvery = 50 * time.Millisecond
)

// loginError is the gateway's refusal of a login: the first frame's
// errCode, or that of the HTTP answer in its place.
type loginError struct {
	Code int
	Msg  string
}

func (e *loginError) Error() string {
	return fmt.Sprintf("gateway refused the login: OpenIM error %d %s", e.Code, errText(e.Msg))
}

// session is one logged-in connection of one device.
type session struct {
	d    *Driver
	conn *wsconn.Conn
	// user is the imcanary name, id the OpenIM user id it maps to
	// (userID).
	user, id string
	platform int32
	token    string
	st       *devState
	// cu is the device's place in its conversations, nil with catch-up
	// off.
	cu *probe.Catchup
	h  probe.Handler

	incrs atomic.Uint64
	// pmu guards what awaits a reply, by msgIncr: sends (to the caller's
	// ref), pulls (their ranges) and newest-seq requests.
	pmu   sync.Mutex
	acks  map[string]uint64
	pulls map[string][]probe.Fetch
	syncs map[string]bool

	// The frame handler's.
	dueAt    int64
	dues     []probe.Fetch
	delivery probe.Delivery
	f        frame
}

func (d *Driver) connect(ctx context.Context, userID string, platform int32, token string, st *devState, dev probe.Device) (*session, error) {
	s := &session{d: d, user: userID, id: openimID(userID), platform: platform, token: token, st: st, cu: dev.Catchup,
		acks: map[string]uint64{}, pulls: map[string][]probe.Fetch{}, syncs: map[string]bool{}}
	_, err := wsconn.Open(ctx, d.ws.At(d.gatewayURL(s.id, platform, token)), dev.Link, userID, func(c *wsconn.Conn) error {
		s.conn = c
		return s.login()
	})
	if err != nil {
		return nil, err
	}
	if s.cu != nil {
		// What the device missed while away: the newest seq of each of
		// its conversations, answered as frames.
		if err := s.Sync(); err != nil {
			s.conn.Abort()
			return nil, fmt.Errorf("login %s: newest seq: %w", userID, err)
		}
	}
	return s, nil
}

// login reads the gateway's first frame (isMsgResp=true), which says
// whether the token was accepted. A refused token is answered so and the
// connection closed (ws_server.go wsHandler).
func (s *session) login() error {
	bp, _, err := s.conn.Read(s.d.ws.DialTimeout)
	if err != nil {
		if ce, ok := errors.AsType[*websocket.CloseError](err); ok {
			return fmt.Errorf("gateway closed the connection at login: %d %q", ce.Code, ce.Text)
		}
		return err
	}
	defer wsconn.Release(bp)
	var f frame
	if err := decodeFrame(*bp, &f); err != nil {
		return fmt.Errorf("login reply: %w", err)
	}
	if f.Type != "" || f.ReqIdentifier != 0 {
		return fmt.Errorf("login reply: got a frame of type %q, request %d; want the login's {\"errCode\":…}", f.Type, f.ReqIdentifier)
	}
	if f.ErrCode != 0 {
		return &loginError{Code: f.ErrCode, Msg: f.ErrMsg}
	}
	return nil
}

// nextIncr returns a msgIncr for a request of this session.
func (s *session) nextIncr() string { return incr(s.incrs.Add(1)) }

// request writes a request with data m, awaiting its reply under inc.
func (s *session) request(id int32, inc string, m proto.Message) error {
	b, err := encodeRequest(id, s.id, s.token, s.d.operationID(), inc, m)
	if err != nil {
		return err
	}
	if len(b) > MaxClientFrame {
		return fmt.Errorf("request %d of %d bytes: over the gateway's %d-byte frame limit", id, len(b), MaxClientFrame)
	}
	return s.conn.Write(b)
}

// Send implements probe.Session: a SendMsg (1003) of a text message whose
// content is the probe body, acked by the reply with the same msgIncr. A
// frame that would pass the gateway's 51,200 bytes is refused here with an
// error: the gateway would close the connection on it.
func (s *session) Send(m *probe.Message) error {
	md := &sdkws.MsgData{
		SendID: s.id, ClientMsgID: s.d.clientMsgID(), SenderPlatformID: s.platform, SenderNickname: s.user,
		MsgFrom: constant.UserMsgType, ContentType: constant.Text, CreateTime: time.Now().UnixMilli(),
	}
	if m.Group != "" {
		md.GroupID, md.SessionType = m.Group, constant.ReadGroupChatType
	} else {
		md.RecvID, md.SessionType = openimID(m.To), constant.SingleChatType
	}
	md.Content = jsonText(m.Body)
	inc := s.nextIncr()
	// Registered before the write: the reply can beat the write's return.
	s.pmu.Lock()
	s.acks[inc] = m.Ref
	s.pmu.Unlock()
	b, err := encodeRequest(reqSend, s.id, s.token, s.d.operationID(), inc, md)
	if err == nil && len(b) > MaxClientFrame {
		s.d.oversize.Add(1)
		err = fmt.Errorf("openim: a send of a %d-byte body makes a %d-byte frame, over the gateway's limit of %d (maxMessageSize): lower population.message_size", len(m.Body), len(b), MaxClientFrame)
		if !s.d.warnedOversize.Swap(true) {
			s.d.log.Warn("sends refused before writing", "err", err)
		}
	}
	if err == nil {
		s.d.sent(conversationID(md))
		err = s.conn.Write(b)
	}
	if err != nil {
		s.pmu.Lock()
		delete(s.acks, inc)
		s.pmu.Unlock()
	}
	return err
}

// Sync implements probe.Syncer: a GetNewestSeq (1001), whose answer says
// how far each of the device's conversations goes, so that what no later
// push would reveal missing is still found and fetched. One at a time.
func (s *session) Sync() error {
	if s.cu == nil {
		return nil
	}
	inc := s.nextIncr()
	s.pmu.Lock()
	if len(s.syncs) > 0 {
		s.pmu.Unlock()
		return nil
	}
	s.syncs[inc] = true
	s.pmu.Unlock()
	err := s.request(reqNewestSeq, inc, &sdkws.GetMaxSeqReq{UserID: s.id})
	if err != nil {
		s.pmu.Lock()
		delete(s.syncs, inc)
		s.pmu.Unlock()
	}
	return err
}

// ping is the text keepalive the gateway answers with {"type":"pong"}
// (message_handler.go TextPing).
var ping = []byte(`{"type":"ping"}`)

// Ping implements probe.Session.
func (s *session) Ping() error { return s.conn.WriteText(ping) }

// Close implements probe.Session: a normal-closure frame, then a bounded
// wait for the server's reply, which Serve reads.
func (s *session) Close() error { return s.conn.Close() }

// Abort implements probe.Aborter: the connection is dropped with no close.
func (s *session) Abort() { s.conn.Abort() }

var (
	_ probe.Aborter = (*session)(nil)
	_ probe.Syncer  = (*session)(nil)
)

// Serve implements probe.Session.
func (s *session) Serve(h probe.Handler) error { return s.run(h).Serve() }

// Watch implements probe.Watcher: the session read by the Poller of its
// link, without a goroutine of its own. The catch-up it drives (pulls of
// what came due) runs on frames, heartbeats' pongs among them, so it needs
// no timer of its own there either.
func (s *session) Watch(h probe.Handler, done func(error)) bool { return s.run(h).Watch(done) }

// Hold implements probe.Holder: a watched slow reader's pause.
func (s *session) Hold(d time.Duration) bool { return s.conn.Hold(d) }

var (
	_ probe.Watcher = (*session)(nil)
	_ probe.Holder  = (*session)(nil)
)

func (s *session) run(h probe.Handler) wsconn.Session {
	return wsconn.Session{Conn: s.conn, Proto: s, Begin: func() error { s.h = h; return nil }}
}

// Ended implements wsconn.Protocol. OpenIM closes a connection it gives up
// on (a write past its 10 s deadline to a slow reader, a bad request)
// without a close frame: that reads as error.
func (s *session) Ended(err error) *probe.Disconnect { return wsconn.Ended(err, nil) }

// Frame implements wsconn.Protocol.
func (s *session) Frame(b []byte, at int64) error {
	f := &s.f
	if err := decodeFrame(b, f); err != nil {
		return err
	}
	s.delivery.At = at
	switch {
	case f.Type == "pong":
		// Once a heartbeat at least, what has come due is asked for
		// although nothing else arrives: a gap a sync answer named
		// waits the catch-up grace for the pushes in flight.
		return s.pullDue(at)
	case f.Type != "":
		s.d.unmatched.Add(1)
		return nil
	}
	var err error
	switch f.ReqIdentifier {
	case reqSend:
		err = s.onAck(f)
	case pushMsg:
		var pm sdkws.PushMessages
		if err := proto.Unmarshal(f.Data, &pm); err != nil {
			return fmt.Errorf("%w: push: %v", errMalformed, err)
		}
		for conv, msgs := range pm.Msgs {
			for _, m := range msgs.GetMsgs() {
				s.onMsg(conv, m, false)
			}
		}
	case reqNewestSeq:
		err = s.onNewest(f)
	case reqPullSeqs:
		err = s.onPull(f)
	case pushKick:
		s.d.kicked.Add(1)
		// OpenIM has marked the token kicked: the reconnect needs a
		// new one.
		s.d.dropToken(s.user, s.platform)
		return &probe.Disconnect{Reason: metrics.ReasonConflict, Text: fmt.Sprintf(
			"kicked (2002): %s logged in again on platform %d elsewhere", s.user, s.platform)}
	default:
		s.d.unmatched.Add(1)
		s.d.log.Debug("frame of no request imcanary reads", "user", s.user, "reqIdentifier", f.ReqIdentifier, "errCode", f.ErrCode)
	}
	if err != nil {
		return err
	}
	return s.pullDue(at)
}

// awaited takes what awaits the reply under inc in m; a reply to nothing
// the session asked counts as unmatched.
func awaited[V any](s *session, m map[string]V, inc string) (V, bool) {
	s.pmu.Lock()
	v, ok := m[inc]
	delete(m, inc)
	s.pmu.Unlock()
	if !ok {
		s.d.unmatched.Add(1)
	}
	return v, ok
}

// onAck handles the reply to a send.
func (s *session) onAck(f *frame) error {
	ref, ok := awaited(s, s.acks, f.MsgIncr)
	if !ok {
		return nil
	}
	if f.ErrCode != 0 {
		s.h.OnReject(ref, fmt.Sprintf("%d %s", f.ErrCode, errText(f.ErrMsg)))
		return nil
	}
	var r msg.SendMsgResp
	if err := proto.Unmarshal(f.Data, &r); err != nil {
		return fmt.Errorf("%w: send reply: %v", errMalformed, err)
	}
	s.h.OnAck(ref, probe.Ack{ServerID: []byte(r.ServerMsgID)})
	return nil
}

// onMsg handles one message pushed or pulled in conv.
func (s *session) onMsg(conv string, m *sdkws.MsgData, recovered bool) {
	if !isChat(conv) {
		return
	}
	if seq := uint64(m.Seq); seq > 0 {
		s.track(conv, seq, recovered)
		if s.cu != nil {
			now := time.Now().UnixNano()
			s.place(conv, seq-1, true, now)
			s.cu.Got([]byte(conv), seq, now)
		}
	}
	if m.SendID == s.id && m.SenderPlatformID == s.platform {
		// This device's own message, pushed to it by sender sync: the
		// device holds it already. The user's other devices'
		// messages are delivered (MirrorsOwn).
		return
	}
	body, ok := textBody(m)
	if ok && m.SendID == "" {
		// A message from nobody cannot be placed in any stream.
		s.d.unmatched.Add(1)
		return
	}
	if !ok {
		// Another kind of message of the conversation (a group's
		// tips): its seq counts, its content is not imcanary's.
		return
	}
	if recovered {
		s.d.recovered.Add(1)
	}
	d := &s.delivery
	d.From, d.Group, d.Body, d.ServerSeq, d.Recovered = []byte(userName(m.SendID)), m.SessionType == constant.ReadGroupChatType, body, uint64(m.Seq), recovered
	s.h.OnDelivery(d)
}

// place gives the device's Catchup a place in conv, if it has none: the
// process's base of conv, which at makes if there is none yet (the seq
// below the first message seen, or the newest seq at a login). A
// conversation first seen in a push that the device's first GetNewestSeq
// answer did not name began after that login: its place is 0, all of it
// owed.
func (s *session) place(conv string, at uint64, pushed bool, now int64) {
	st := s.st
	st.mu.Lock()
	placed := st.placed[conv]
	if !placed && len(st.placed) < maxConvs {
		st.placed[conv] = true
	}
	if !placed && pushed && st.atLogin != nil && !st.atLogin[conv] && len(st.atLogin) < maxConvs {
		at = 0
	}
	st.mu.Unlock()
	if !placed {
		s.cu.Behind(conv, s.d.base(conv, at), now)
	}
}

// isChat reports whether conv is a direct or group chat: notification
// conversations (n_…) hold no message of imcanary's.
func isChat(conv string) bool {
	return strings.HasPrefix(conv, "si_") || strings.HasPrefix(conv, "sg_")
}

// track advances the device's highest seq of conv, and counts a jump as a
// gap the server's own numbering shows. A pull fills a gap counted already.
func (s *session) track(conv string, seq uint64, recovered bool) {
	st := s.st
	st.mu.Lock()
	last, known := st.seqs[conv]
	switch {
	case !known && len(st.seqs) >= maxConvs:
	case seq > last:
		st.seqs[conv] = seq
	}
	st.mu.Unlock()
	if known && !recovered && seq > last+1 {
		s.d.gaps.Add(1)
		s.d.missed.Add(seq - last - 1)
		s.d.log.Debug("server seq skipped messages", "user", s.user, "conversation", conv, "last_seen", last, "seq", seq)
	}
}

// onNewest handles a GetNewestSeq answer: each conversation's newest seq
// is where the device should be; below its oldest (minSeqs) the server
// holds nothing more to fetch.
func (s *session) onNewest(f *frame) error {
	if _, ok := awaited(s, s.syncs, f.MsgIncr); !ok {
		return nil
	}
	if f.ErrCode != 0 {
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("newest seq refused: OpenIM error %d %s", f.ErrCode, errText(f.ErrMsg))}
	}
	var r sdkws.GetMaxSeqResp
	if err := proto.Unmarshal(f.Data, &r); err != nil {
		return fmt.Errorf("%w: newest seq: %v", errMalformed, err)
	}
	s.d.newest.Add(1)
	if s.cu == nil {
		return nil
	}
	now := time.Now().UnixNano()
	s.st.mu.Lock()
	if s.st.atLogin == nil {
		s.st.atLogin = make(map[string]bool, len(r.MaxSeqs))
		for conv := range r.MaxSeqs {
			if isChat(conv) && len(s.st.atLogin) < maxConvs {
				s.st.atLogin[conv] = true
			}
		}
	}
	s.st.mu.Unlock()
	for conv, top := range r.MaxSeqs {
		if !isChat(conv) || top <= 0 {
			continue
		}
		s.place(conv, uint64(top), false, now)
		s.cu.Behind(conv, uint64(top), now)
		if low := r.MinSeqs[conv]; low > 1 {
			s.cu.Answered(conv, 0, uint64(low-1))
		}
	}
	return nil
}

// pullDue writes a pull of what the Catchup says is due, at most one pull
// in flight.
func (s *session) pullDue(now int64) error {
	if s.cu == nil || now < s.dueAt {
		return nil
	}
	s.dueAt = now + int64(dueEvery)
	s.pmu.Lock()
	busy := len(s.pulls) > 0
	s.pmu.Unlock()
	if busy {
		return nil
	}
	// One range per conversation: the answer holds one list of each.
	s.dues = s.cu.DueEach(now, s.dues[:0], pullRanges)
	if len(s.dues) == 0 {
		return nil
	}
	req := &sdkws.PullMessageBySeqsReq{UserID: s.id, Order: sdkws.PullOrder_PullOrderAsc}
	fetches := make([]probe.Fetch, len(s.dues))
	for i, f := range s.dues {
		f.N = min(f.N, pullPage)
		fetches[i] = f
		req.SeqRanges = append(req.SeqRanges, &sdkws.SeqRange{
			ConversationID: f.Conv, Begin: int64(f.After + 1), End: int64(f.After) + int64(f.N), Num: int64(f.N),
		})
	}
	inc := s.nextIncr()
	s.pmu.Lock()
	s.pulls[inc] = fetches
	s.pmu.Unlock()
	if err := s.request(reqPullSeqs, inc, req); err != nil {
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("pull: %w", err)}
	}
	return nil
}

// onPull handles a pull's answer: each message is recovered; what the
// server did not send of a range it does not hold, and is not asked again.
func (s *session) onPull(f *frame) error {
	fetches, ok := awaited(s, s.pulls, f.MsgIncr)
	if !ok {
		return nil
	}
	if f.ErrCode != 0 {
		// Asked again at the Catchup's retry.
		s.d.log.Debug("pull refused", "user", s.user, "errCode", f.ErrCode, "errMsg", errText(f.ErrMsg))
		return nil
	}
	var r sdkws.PullMessageBySeqsResp
	if err := proto.Unmarshal(f.Data, &r); err != nil {
		return fmt.Errorf("%w: pull: %v", errMalformed, err)
	}
	for conv, pm := range r.Msgs {
		for _, m := range pm.GetMsgs() {
			s.onMsg(conv, m, true)
		}
	}
	for _, fe := range fetches {
		pm := r.Msgs[fe.Conv]
		upTo := fe.After + uint64(fe.N)
		if pm != nil && !pm.IsEnd && len(pm.Msgs) < fe.N {
			// A partial page: what lies past its last message may
			// still come.
			var top uint64
			for _, m := range pm.Msgs {
				top = max(top, uint64(m.Seq))
			}
			upTo = top
		}
		s.cu.Answered(fe.Conv, fe.After, upTo)
	}
	return nil
}

// jsonText returns body as the content of a text message, OpenIM's TextElem
// {"content":"…"}.
func jsonText(body []byte) []byte {
	b := make([]byte, 0, len(body)+16)
	b = append(b, `{"content":`...)
	b = jsonscan.AppendString(b, body)
	return append(b, '}')
}
