package openimtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/msg"
	"github.com/openimsdk/protocol/sdkws"
	"google.golang.org/protobuf/proto"
)

// The asynchronous path from an accepted send to its pushes, sized on
// purpose:
const (
	// transferQueue is the accepted sends waiting for a seq (OpenIM's
	// Kafka topic toRedis, consumed by msgtransfer). When it is full a
	// sender's read loop waits, after its ack, until there is room: the
	// next request on that connection is answered late.
	transferQueue = 4096
	// pushLanes are OpenIM's partitions of the toPush topic: each lane
	// pushes its messages one at a time, in seq order, and a message's
	// pushes to every connection must end (be written, fail, or time
	// out) before the lane's next message, as the push service waits
	// for the gateway's SuperGroupOnlineBatchPushOneMsg
	// (internal/push/onlinepusher.go:61-114). A conversation always
	// takes the same lane, so its pushes keep seq order; a slow reader
	// holds up only the conversations of its lane, for at most
	// WriteTimeout per write.
	pushLanes = 8
	// laneQueue is each lane's backlog. When it is full the transfer
	// goroutine waits, and behind it the senders.
	laneQueue = 1024
	// fanout bounds the writes of one lane in flight at once, 512 over
	// all lanes: the gateway's memamq workers (hub_server.go:85).
	fanout = 64
)

type transferJob struct {
	msg         *sdkws.MsgData
	operationID string
	accepted    time.Time
}

type pushJob struct {
	msg            *sdkws.MsgData
	conversationID string
	operationID    string
	due            time.Time
}

func randomHex() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// switchOn is datautil.GetSwitchFromOptions (tools utils/datautil/
// datautil.go:721-729): a missing option, or no options, is true.
func switchOn(opts map[string]bool, key string) bool {
	v, ok := opts[key]
	return !ok || v
}

// setSwitch is datautil.SetSwitchFromOptions (datautil.go:731-736),
// which does nothing to nil options.
func setSwitch(opts map[string]bool, key string, v bool) {
	if opts != nil {
		opts[key] = v
	}
}

// chatConversationID is msgprocessor.GetChatConversationIDByMsg
// (pkg/msgprocessor/conversation.go:49-66), notificationConversationID
// GetNotificationConversationIDByMsg (conversation.go:31-47).
func chatConversationID(m *sdkws.MsgData) string {
	switch m.SessionType {
	case constant.SingleChatType:
		return "si_" + sortedPair(m.SendID, m.RecvID)
	case constant.ReadGroupChatType:
		return "sg_" + m.GroupID
	}
	return ""
}

func notificationConversationID(m *sdkws.MsgData) string {
	switch m.SessionType {
	case constant.SingleChatType:
		return "n_" + sortedPair(m.SendID, m.RecvID)
	case constant.ReadGroupChatType:
		return "n_" + m.GroupID
	}
	return ""
}

func sortedPair(a, b string) string {
	l := []string{a, b}
	sort.Strings(l)
	return strings.Join(l, "_")
}

// sendMsg is the gateway's SendMessage (message_handler.go:151-173) and
// the msg service's SendMsg (internal/rpc/msg/send.go:34-192). It answers
// the ack; after, when not nil, hands the message to the transfer queue
// and is called once the ack is written.
func (s *Server) sendMsg(c *conn, req *wireReq) (data []byte, after func(), err error) {
	m := new(sdkws.MsgData)
	if err := proto.Unmarshal(req.Data, m); err != nil {
		return nil, nil, fmt.Errorf("SendMessage: error unmarshaling message data: %w", err)
	}
	// The msg service's interceptor runs SendMsgReq.Check: sendID and
	// content must be set, and OANotification goes with sessionType 4
	// only (protocol sdkws/sdkws.go:23-35). clientMsgID and contentType
	// are not checked otherwise.
	if err := check(&msg.SendMsgReq{MsgData: m}); err != nil {
		return nil, nil, err
	}
	encapsulate(m)
	switch m.SessionType {
	case constant.SingleChatType:
		deliver, err := s.verifySingle(m)
		if err != nil {
			return nil, nil, err
		}
		if !deliver {
			// The receiver refuses all messages (globalRecvMsgOpt 1):
			// send.go:172-174 answers nothing, which reaches the client
			// as an empty SendMsgResp, and the message goes nowhere.
			data, err := proto.Marshal(&msg.SendMsgResp{})
			return data, nil, err
		}
	case constant.ReadGroupChatType:
		if err := s.verifyGroup(m); err != nil {
			return nil, nil, err
		}
	case constant.NotificationChatType:
		// send.go:142-152 accepts these unchecked; not modelled here.
		return nil, nil, newCode(codeArgs, "openimtest: sessionType 4 (notification chat) is not implemented")
	default:
		return nil, nil, newCode(codeArgs, "unknown sessionType")
	}
	data, err = proto.Marshal(&msg.SendMsgResp{ServerMsgID: m.ServerMsgID, ClientMsgID: m.ClientMsgID, SendTime: m.SendTime})
	if err != nil {
		return nil, nil, err
	}
	if s.roll(s.o.Faults.Unstored) {
		s.st.unstored.Add(1)
		return data, nil, nil
	}
	job := transferJob{msg: m, operationID: req.OperationID, accepted: time.Now()}
	return data, func() { s.enqueue(job) }, nil
}

// encapsulate is encapsulateMsgData (internal/rpc/msg/verify.go:134-178):
// a fresh serverMsgID, sendTime if the client gave none, and the options
// of typing and receipt messages turned off, when the client sent
// options at all.
func encapsulate(m *sdkws.MsgData) {
	m.ServerMsgID = randomHex()
	if m.SendTime == 0 {
		m.SendTime = time.Now().UnixMilli()
	}
	switch m.ContentType {
	case constant.Revoke:
		setSwitch(m.Options, constant.IsUnreadCount, false)
		setSwitch(m.Options, constant.IsOfflinePush, false)
	case constant.HasReadReceipt:
		for _, k := range []string{constant.IsConversationUpdate, constant.IsSenderConversationUpdate,
			constant.IsUnreadCount, constant.IsOfflinePush} {
			setSwitch(m.Options, k, false)
		}
	case constant.Typing:
		for _, k := range []string{constant.IsHistory, constant.IsPersistent, constant.IsSenderSync,
			constant.IsConversationUpdate, constant.IsSenderConversationUpdate, constant.IsUnreadCount, constant.IsOfflinePush} {
			setSwitch(m.Options, k, false)
		}
	}
}

func isNotificationContent(t int32) bool {
	return t >= constant.NotificationBegin && t <= constant.NotificationEnd
}

// verifySingle is messageVerification for single chat (verify.go:53-82;
// no friends or blacklists here, and friendVerify is false in
// config/openim-rpc-msg.yml) and then modifyMessageByUserMessageReceiveOpt
// (verify.go:185-223) for messages that are not notifications: the
// receiver must be a registered user (RecordNotFoundError otherwise, from
// the user service's FindWithError), and one who refuses all messages
// gets none. The sendID is not compared with the connection's user: the
// real gateway checks only the envelope's sendID.
func (s *Server) verifySingle(m *sdkws.MsgData) (deliver bool, err error) {
	if !switchOn(m.Options, constant.IsNotNotification) {
		return true, nil
	}
	u := s.store.user(m.RecvID)
	if u == nil {
		return false, newCode(codeRecordNotFound, "userID not found")
	}
	return u.GlobalRecvMsgOpt != constant.NotReceiveMessage, nil
}

// verifyGroup is messageVerification for group chat (verify.go:83-128):
// the group must exist (RecordNotFoundError), and its sender must be a
// member, unless the sender is the admin or the content is a
// notification type (NotInGroupYetError).
func (s *Server) verifyGroup(m *sdkws.MsgData) error {
	exists, member := s.store.isMember(m.GroupID, m.SendID)
	switch {
	case !exists:
		return newCode(codeRecordNotFound, "group not found")
	case m.SendID == adminUserID || isNotificationContent(m.ContentType) || member:
		return nil
	default:
		return newCode(codeNotInGroupYet, "not in group")
	}
}

// getNewestSeq is GetSeq (message_handler.go:130-147) over GetMaxSeq
// (internal/rpc/msg/sync_msg.go:120-147), which lets a user ask only for
// themself (CheckAccessV3).
func (s *Server) getNewestSeq(req *wireReq) ([]byte, error) {
	var r sdkws.GetMaxSeqReq
	if err := proto.Unmarshal(req.Data, &r); err != nil {
		return nil, fmt.Errorf("GetSeq: error unmarshaling request: %w", err)
	}
	s.st.newestSeqRequests.Add(1)
	if err := checkAccess(req.SendID, r.UserID); err != nil {
		return nil, err
	}
	return proto.Marshal(s.store.maxSeqs(r.UserID, s.o.ReportMinSeqs))
}

// pullBySeqs is PullMessageBySeqList (message_handler.go:187-204). It
// checks the envelope, not the request's userID: any user may be named.
func (s *Server) pullBySeqs(req *wireReq) ([]byte, error) {
	var r sdkws.PullMessageBySeqsReq
	if err := proto.Unmarshal(req.Data, &r); err != nil {
		return nil, fmt.Errorf("err proto unmarshal: %w", err)
	}
	if err := validateReq(req, "PullMessageBySeqsReq"); err != nil {
		return nil, err
	}
	resp, n := s.store.pull(&r)
	s.st.messagesPulled.Add(int64(n))
	return proto.Marshal(resp)
}

// enqueue hands a job to the transfer goroutine, waiting while the queue
// is full; it gives up when the server closes.
func (s *Server) enqueue(j transferJob) {
	select {
	case s.transfer <- j:
	case <-s.done:
	}
}

// runTransfer is msgtransfer, one goroutine so that seqs follow the
// order sends were accepted in. It returns when the server closes.
func (s *Server) runTransfer() {
	for {
		select {
		case <-s.done:
			return
		case j := <-s.transfer:
			s.transferOne(j)
		}
	}
}

// transferOne sorts a message as categorizeMessageLists does
// (internal/msgtransfer/online_history_msg_handler.go:219-260), stores
// what is stored with the conversation's next seq (msg_transfer.go:
// 232-264), and queues the pushes: a message is pushed whether or not it
// is stored (handleMsg, online_history_msg_handler.go:262-337). A
// notification with isSendMsg is also stored as a message of the chat
// conversation, with fresh options. Notifications themselves are pushed
// without a seq even when their options ask for history; every
// notification this server makes is of reliability level 1 anyway.
func (s *Server) transferOne(j transferJob) {
	m := j.msg
	due := j.accepted.Add(s.o.Faults.PushDelay)
	if !switchOn(m.Options, constant.IsNotNotification) {
		if switchOn(m.Options, constant.IsSendMsg) {
			c := proto.Clone(m).(*sdkws.MsgData)
			c.Options = make(map[string]bool)
			c.Options[constant.IsOfflinePush] = switchOn(m.Options, constant.IsOfflinePush)
			c.Options[constant.IsUnreadCount] = switchOn(m.Options, constant.IsUnreadCount)
			setSwitch(m.Options, constant.IsOfflinePush, false)
			setSwitch(m.Options, constant.IsUnreadCount, false)
			s.queuePush(pushJob{msg: m, conversationID: notificationConversationID(m), operationID: j.operationID, due: due})
			conv := chatConversationID(c)
			s.store.store(conv, c)
			s.queuePush(pushJob{msg: c, conversationID: conv, operationID: j.operationID, due: due})
			return
		}
		s.queuePush(pushJob{msg: m, conversationID: notificationConversationID(m), operationID: j.operationID, due: due})
		return
	}
	conv := chatConversationID(m)
	if switchOn(m.Options, constant.IsHistory) {
		s.store.store(conv, m)
	}
	s.queuePush(pushJob{msg: m, conversationID: conv, operationID: j.operationID, due: due})
}

func (s *Server) queuePush(j pushJob) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(j.conversationID))
	select {
	case s.lanes[h.Sum32()%pushLanes] <- j:
	case <-s.done:
	}
}

// runLane pushes one lane's messages in order, each no earlier than its
// due time; it returns when the server closes.
func (s *Server) runLane(lane chan pushJob) {
	for {
		select {
		case <-s.done:
			return
		case j := <-lane:
			if d := time.Until(j.due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-s.done:
					t.Stop()
					return
				}
			}
			s.push(j)
			s.st.pushJobs.Add(1)
		}
	}
}

// push sends one message to every online connection of its recipients
// and returns when every write has ended. The recipients are
// handleMs2PsChat's (internal/push/push_handler.go:95-127): a group's
// members at push time, the sender's own connections included; a single
// chat's receiver, and its sender too unless the message turns sender
// sync off. Every connection of a recipient is written to
// (hub_server.go:125-162), the sending one included, except an iOS one
// in the background (hub_server.go:145-146).
func (s *Server) push(j pushJob) {
	m := j.msg
	var users []string
	if m.SessionType == constant.ReadGroupChatType {
		users, _ = s.store.groupMembers(m.GroupID)
	} else {
		users = []string{m.RecvID}
		if switchOn(m.Options, constant.IsSenderSync) && m.SendID != m.RecvID {
			users = append(users, m.SendID)
		}
	}
	var targets []*conn
	s.regMu.Lock()
	for _, u := range users {
		for _, c := range s.conns[u] {
			if c.background.Load() && c.platformID == constant.IOSPlatformID {
				continue
			}
			targets = append(targets, c)
		}
	}
	s.regMu.Unlock()
	if len(targets) == 0 {
		return
	}
	frame, err := pushFrame(m, j.conversationID, j.operationID)
	if err != nil {
		s.log.Warn("push frame", "err", err)
		return
	}
	// A reordered push waits for the sender's next push in the same
	// conversation: an order a client can see break.
	key := m.SendID + " " + j.conversationID
	if len(targets) == 1 {
		s.deliver(targets[0], frame, key)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, fanout)
	for _, c := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.deliver(c, frame, key)
		})
	}
	wg.Wait()
}

// pushFrame is Client.PushMessage (client.go:306-326): a 2001 carrying
// PushMessages with the one message under its conversation, in
// notificationMsgs for a notification conversation, with the sender's
// operationID (the push path carries it from the send).
func pushFrame(m *sdkws.MsgData, conversationID, operationID string) ([]byte, error) {
	if m.Status == constant.MsgStatusSending {
		// GetConnsAndOnlinePush marks what it pushes sent
		// (push_handler.go:217-219); the stored copy keeps its status.
		m = proto.Clone(m).(*sdkws.MsgData)
		m.Status = constant.MsgStatusSendSuccess
	}
	pm := &sdkws.PushMessages{}
	one := map[string]*sdkws.PullMsgs{conversationID: {Msgs: []*sdkws.MsgData{m}}}
	if strings.HasPrefix(conversationID, "n_") {
		pm.NotificationMsgs = one
	} else {
		pm.Msgs = one
	}
	data, err := proto.Marshal(pm)
	if err != nil {
		return nil, err
	}
	return json.Marshal(wireResp{ReqIdentifier: wsPushMsg, OperationID: operationID, Data: data})
}

// deliver writes one push to one connection, with the faults; key names
// the sender and conversation whose next push a reordered one follows.
func (s *Server) deliver(c *conn, frame []byte, key string) {
	f := s.o.Faults
	// A push to one of the sender's own connections is one a client
	// skips: counted apart, so a test can tell what was owed.
	own := strings.HasPrefix(key, c.userID+" ")
	if s.roll(f.DropPush) {
		s.st.pushesDropped.Add(1)
		if own {
			s.st.pushesDroppedOwn.Add(1)
		}
		return
	}
	dup, reorder := s.roll(f.DuplicatePush), s.roll(f.ReorderPush)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return
	}
	if reorder && c.held == nil {
		c.held, c.heldKey = frame, key
		s.st.pushesReordered.Add(1)
		return
	}
	write := func(b []byte) bool {
		if err := c.writeLocked(b); err != nil {
			s.st.pushesFailed.Add(1)
			return false
		}
		s.st.pushesSent.Add(1)
		return true
	}
	if !write(frame) {
		return
	}
	if dup && write(frame) {
		s.st.pushesDuplicated.Add(1)
		if own {
			s.st.pushesDuplicatedOwn.Add(1)
		}
	}
	if h := c.held; h != nil && c.heldKey == key {
		c.held = nil
		write(h)
	}
}

// notifyGroup sends a group notification as the group service's
// NotificationSender does (pkg/notification/msg.go:193-249): from the
// caller, content {"detail": tips as JSON}, options from
// config/notification.yml (isSendMsg true, reliability level 1, no
// unread count, no offline push) through config.GetOptionsByNotification
// (pkg/common/config/parse.go:61-78).
func (s *Server) notifyGroup(op apiOp, groupID string, contentType int32, tips []byte, what string) {
	content, _ := json.Marshal(&sdkws.NotificationElem{Detail: string(tips)})
	now := time.Now().UnixMilli()
	name := map[int32]string{constant.GroupCreatedNotification: "create group",
		constant.MemberInvitedNotification: "memberInvited"}[contentType]
	m := &sdkws.MsgData{
		SendID: op.userID, RecvID: groupID, GroupID: groupID, ClientMsgID: randomHex(),
		SessionType: constant.ReadGroupChatType, MsgFrom: constant.SysMsgType, ContentType: contentType,
		Content: content, CreateTime: now,
		Options: map[string]bool{
			constant.IsNotNotification: false, constant.IsSendMsg: true, constant.IsHistory: false,
			constant.IsPersistent: false, constant.IsOfflinePush: false, constant.IsUnreadCount: false,
			constant.IsConversationUpdate: false, constant.IsSenderSync: true, constant.IsNotPrivate: false,
			constant.IsSenderConversationUpdate: false, constant.IsReactionFromCache: false,
		},
		OfflinePushInfo: &sdkws.OfflinePushInfo{Title: name + " title", Desc: name + " desc", Ex: name + " ext"},
	}
	encapsulate(m)
	s.log.Debug("group notification", "group", groupID, "what", what, "contentType", contentType)
	s.enqueue(transferJob{msg: m, operationID: op.operationID, accepted: time.Now()})
}
