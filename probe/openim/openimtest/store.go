package openimtest

import (
	"strings"
	"sync"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/sdkws"
)

// store holds what OpenIM keeps in MongoDB and Redis: users, groups, the
// conversations each user has, and each conversation's messages by seq.
// One mutex guards it all: every operation is a few map lookups, and the
// writes that take longest (a group's creation) are bounded by the 1000
// members the protocol's Check allows.
type store struct {
	history int

	mu     sync.Mutex
	users  map[string]*sdkws.UserInfo
	groups map[string]*groupState
	// userGroups and userSingles are the user's conversations: a group
	// conversation per group joined, and a single-chat conversation once
	// it holds a message (msgtransfer creates both sides' conversation
	// records then: internal/msgtransfer/online_history_msg_handler.go:
	// 291-322).
	userGroups  map[string]map[string]struct{}
	userSingles map[string]map[string]struct{}
	convs       map[string]*conversation
}

type groupState struct {
	info    *sdkws.GroupInfo
	members map[string]*sdkws.GroupMemberFullInfo
	order   []string // members in join order, for fan-out and tips
}

// conversation holds the newest history messages of one conversation in
// a ring, oldest at start. Seqs are contiguous from 1; minSeq is 0 until
// the ring first overwrites, then the oldest seq kept, as the clear job
// sets it after deleting old messages (internal/rpc/msg/clear.go:
// 12-50, minSeq set at 45-46).
type conversation struct {
	minSeq, maxSeq int64
	ring           []*sdkws.MsgData
	start          int
}

func newStore(history int) *store {
	return &store{
		history:     history,
		users:       make(map[string]*sdkws.UserInfo),
		groups:      make(map[string]*groupState),
		userGroups:  make(map[string]map[string]struct{}),
		userSingles: make(map[string]map[string]struct{}),
		convs:       make(map[string]*conversation),
	}
}

func (c *conversation) oldest() int64 { return c.maxSeq - int64(len(c.ring)) + 1 }

func (c *conversation) get(seq int64) *sdkws.MsgData {
	if len(c.ring) == 0 || seq < c.oldest() || seq > c.maxSeq {
		return nil
	}
	return c.ring[(c.start+int(seq-c.oldest()))%len(c.ring)]
}

func (c *conversation) append(m *sdkws.MsgData, history int) {
	c.maxSeq++
	m.Seq = c.maxSeq
	if len(c.ring) < history {
		c.ring = append(c.ring, m)
		return
	}
	c.ring[c.start] = m
	c.start = (c.start + 1) % len(c.ring)
	c.minSeq = c.oldest()
}

func addTo(m map[string]map[string]struct{}, k, v string) {
	s := m[k]
	if s == nil {
		s = make(map[string]struct{})
		m[k] = s
	}
	s[v] = struct{}{}
}

// store assigns m the conversation's next seq and keeps it. m must not
// change afterwards: pulls hand the stored message out as it is.
func (s *store) store(conversationID string, m *sdkws.MsgData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.convs[conversationID]
	if c == nil {
		c = &conversation{}
		s.convs[conversationID] = c
	}
	c.append(m, s.history)
	if m.SessionType == constant.SingleChatType {
		addTo(s.userSingles, m.SendID, conversationID)
		addTo(s.userSingles, m.RecvID, conversationID)
	}
}

// hasConversation is the conversation service's record of (user,
// conversation) that PullMessageBySeqs looks up first
// (internal/rpc/msg/sync_msg.go:37-41).
func (s *store) hasConversation(userID, conversationID string) bool {
	if groupID, ok := strings.CutPrefix(conversationID, "sg_"); ok {
		_, ok := s.userGroups[userID][groupID]
		return ok
	}
	_, ok := s.userSingles[userID][conversationID]
	return ok
}

// maxSeqs is GetMaxSeq (internal/rpc/msg/sync_msg.go:120-147): the
// user's conversations, those with no message left out. v3.8.3 never
// fills minSeqs; with reportMin the oldest seq a pull can still return
// is given there.
func (s *store) maxSeqs(userID string, reportMin bool) *sdkws.GetMaxSeqResp {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &sdkws.GetMaxSeqResp{MaxSeqs: make(map[string]int64)}
	if reportMin {
		resp.MinSeqs = make(map[string]int64)
	}
	add := func(id string) {
		c := s.convs[id]
		if c == nil || c.maxSeq == 0 {
			return
		}
		resp.MaxSeqs[id] = c.maxSeq
		if reportMin {
			resp.MinSeqs[id] = c.oldest()
		}
	}
	for id := range s.userSingles[userID] {
		add(id)
	}
	for g := range s.userGroups[userID] {
		add("sg_" + g)
	}
	return resp
}

// pull is PullMessageBySeqs (internal/rpc/msg/sync_msg.go:31-87) over
// GetMsgBySeqsRange (pkg/common/storage/controller/msg.go:388-442) and
// GetMessageBySeqs (msg.go:797-820). Per range: a conversation the user
// does not have, or one whose minSeq is past end, gives no entry; begin
// is raised to minSeq and end lowered to maxSeq, and end < begin gives no
// entry; when the range holds more than num seqs, the newest num are
// returned (so num 0 returns nothing); a seq in range that is not stored
// comes back as {seq, status: MsgStatusHasDeleted}; isEnd is maxSeq <=
// the requested end (ascending) or the requested begin <= minSeq
// (descending). Notification conversations (n_…) hold nothing here:
// every notification this server sends is of reliability level 1, which
// msgtransfer does not store.
func (s *store) pull(req *sdkws.PullMessageBySeqsReq) (*sdkws.PullMessageBySeqsResp, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &sdkws.PullMessageBySeqsResp{
		Msgs:             make(map[string]*sdkws.PullMsgs),
		NotificationMsgs: make(map[string]*sdkws.PullMsgs),
	}
	n := 0
	for _, r := range req.SeqRanges {
		if r == nil || strings.HasPrefix(r.ConversationID, "n_") || !s.hasConversation(req.UserID, r.ConversationID) {
			continue
		}
		if r.Num <= 0 {
			// The real loop is empty then too; returning early keeps
			// end-num+1 from overflowing.
			continue
		}
		var minSeq, maxSeq int64
		c := s.convs[r.ConversationID]
		if c != nil {
			minSeq, maxSeq = c.minSeq, c.maxSeq
		}
		if minSeq > r.End {
			continue
		}
		begin, end := max(r.Begin, minSeq), min(r.End, maxSeq)
		if end < begin {
			continue
		}
		from := begin
		if end-begin+1 > r.Num {
			from = end - r.Num + 1
		}
		var msgs []*sdkws.MsgData
		for seq := from; seq <= end; seq++ {
			var m *sdkws.MsgData
			if c != nil {
				m = c.get(seq)
			}
			if m == nil {
				m = &sdkws.MsgData{Seq: seq, Status: constant.MsgStatusHasDeleted}
			}
			msgs = append(msgs, m)
		}
		if len(msgs) == 0 {
			continue
		}
		var isEnd bool
		switch req.Order {
		case sdkws.PullOrder_PullOrderAsc:
			isEnd = maxSeq <= r.End
		case sdkws.PullOrder_PullOrderDesc:
			isEnd = r.Begin <= minSeq
		}
		resp.Msgs[r.ConversationID] = &sdkws.PullMsgs{Msgs: msgs, IsEnd: isEnd}
		n += len(msgs)
	}
	return resp, n
}

func (s *store) user(userID string) *sdkws.UserInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users[userID]
}

// groupMembers returns the members of a group in join order, or false if
// there is no such group.
func (s *store) groupMembers(groupID string) ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[groupID]
	if g == nil {
		return nil, false
	}
	return append([]string(nil), g.order...), true
}

// isMember reports whether a group exists and whether userID is in it.
func (s *store) isMember(groupID, userID string) (exists, member bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[groupID]
	if g == nil {
		return false, false
	}
	_, member = g.members[userID]
	return true, member
}
