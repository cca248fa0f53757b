package openimtest

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/group"
	"github.com/openimsdk/protocol/sdkws"
)

// TestSendAckPush: acks carry no seq; pushes carry seqs 1, 2, 3 of the
// sorted single-chat conversation, to the receiver and to every device
// of the sender, the sending one included, gzip or not.
func TestSendAckPush(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "bob", "alice")
	alicePC := dial(t, s, "alice", constant.WindowsPlatformID, userToken(t, s, admin, "alice", constant.WindowsPlatformID),
		dialOpt{extra: url.Values{"compression": {"gzip"}}})
	alicePhone := dial(t, s, "alice", constant.AndroidPlatformID, userToken(t, s, admin, "alice", constant.AndroidPlatformID), dialOpt{})
	bob := dial(t, s, "bob", constant.IOSPlatformID, userToken(t, s, admin, "bob", constant.IOSPlatformID), dialOpt{})

	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("cmid-%d", i)
		ids = append(ids, id)
		r, ack := alicePC.send(textMsg("alice", "bob", id, fmt.Sprint("hello ", i)))
		if r.ErrCode != 0 || r.OperationID != "op-"+r.MsgIncr {
			t.Fatalf("ack %d = %+v, want errCode 0 with the request's operationID", i, r)
		}
		if ack.ClientMsgID != id || len(ack.ServerMsgID) != 32 || ack.SendTime == 0 {
			t.Errorf("SendMsgResp %d = %+v, want clientMsgID %s, a serverMsgID, a sendTime", i, ack, id)
		}
	}
	const conv = "si_alice_bob" // ids sorted, whoever sends
	for _, c := range []*client{bob, alicePC, alicePhone} {
		ps := c.waitPushes(conv, 3)
		if got := seqs(ps); !slices.Equal(got, []int64{1, 2, 3}) {
			t.Errorf("%s (gzip %v): seqs %v, want [1 2 3]", c.user, c.compress, got)
		}
		for i, p := range ps {
			m := p.msg
			if p.notification || m.ClientMsgID != ids[i] || m.ServerMsgID == "" || m.SendID != "alice" || m.RecvID != "bob" ||
				m.Status != constant.MsgStatusSendSuccess {
				t.Errorf("%s push %d = %v", c.user, i, m)
			}
		}
	}
	// Sender sync off: only the receiver.
	m := textMsg("alice", "bob", "nosync", "x")
	m.Options = map[string]bool{constant.IsSenderSync: false}
	alicePhone.send(m)
	if got := seqs(bob.waitPushes(conv, 4)); got[3] != 4 {
		t.Errorf("bob's seqs %v, want 4 last", got)
	}
	alicePhone.send(textMsg("alice", "bob", "sentinel", "x"))
	ps := alicePhone.waitPushes(conv, 4)
	if got := seqs(ps); !slices.Equal(got, []int64{1, 2, 3, 5}) {
		t.Errorf("alice's phone seqs %v, want [1 2 3 5] (4 was not synced)", got)
	}
	st := s.Stats()
	if st.SendsAcked != 5 || st.Logins != 3 {
		t.Errorf("stats %+v, want 5 sends acked, 3 logins", st)
	}

	// What the real one refuses.
	tests := []struct {
		name string
		m    *sdkws.MsgData
		code int
	}{
		{"unregistered receiver", textMsg("alice", "nobody", "x1", "x"), codeRecordNotFound},
		{"no receiver", textMsg("alice", "", "x2", "x"), codeRecordNotFound},
		{"no content", func() *sdkws.MsgData { m := textMsg("alice", "bob", "x3", ""); m.Content = nil; return m }(), codeArgs},
		{"no sendID", textMsg("", "bob", "x4", "x"), codeArgs},
		{"write group session", func() *sdkws.MsgData { m := textMsg("alice", "bob", "x5", "x"); m.SessionType = 2; return m }(), codeArgs},
		{"unknown group", groupMsg("alice", "nosuch", "x6", "x"), codeRecordNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r, _ := alicePC.send(tt.m); r.ErrCode != tt.code {
				t.Errorf("send = %d %s, want %d", r.ErrCode, r.ErrMsg, tt.code)
			}
		})
	}
}

// TestGroupFanout: every member's connections get every group message;
// the group's seq 1 is the GroupCreatedNotification, stored as a message
// (groupCreated isSendMsg: true), and the notification itself is pushed
// on n_GROUP without a seq.
func TestGroupFanout(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "o", "m1", "m2", "out", "late")
	o := dial(t, s, "o", constant.WindowsPlatformID, userToken(t, s, admin, "o", constant.WindowsPlatformID), dialOpt{})
	m1 := dial(t, s, "m1", constant.WindowsPlatformID, userToken(t, s, admin, "m1", constant.WindowsPlatformID), dialOpt{})
	m1web := dial(t, s, "m1", constant.WebPlatformID, userToken(t, s, admin, "m1", constant.WebPlatformID), dialOpt{})
	out := dial(t, s, "out", constant.WindowsPlatformID, userToken(t, s, admin, "out", constant.WindowsPlatformID), dialOpt{})
	mustOK(t, s, "/group/create_group", admin, &group.CreateGroupReq{OwnerUserID: "o", MemberUserIDs: []string{"m1", "m2"},
		GroupInfo: &sdkws.GroupInfo{GroupID: "g", GroupType: constant.WorkingGroup}}, nil)

	first := o.waitPushes("sg_g", 1)[0].msg
	if first.Seq != 1 || first.ContentType != constant.GroupCreatedNotification || first.MsgFrom != constant.SysMsgType {
		t.Errorf("seq 1 of the group = %v, want the GroupCreatedNotification", first)
	}
	var elem sdkws.NotificationElem
	var tips sdkws.GroupCreatedTips
	if json.Unmarshal(first.Content, &elem) != nil || json.Unmarshal([]byte(elem.Detail), &tips) != nil || len(tips.MemberList) != 3 {
		t.Errorf("notification content %s, want {detail: tips with 3 members}", first.Content)
	}
	n := o.waitPushes("n_g", 1)[0]
	if !n.notification || n.msg.Seq != 0 {
		t.Errorf("n_g push = %+v, want a notification without seq", n)
	}

	for i := range 3 {
		if r, _ := m1.send(groupMsg("m1", "g", fmt.Sprint("g", i), "hi")); r.ErrCode != 0 {
			t.Fatalf("group send: %d %s", r.ErrCode, r.ErrMsg)
		}
	}
	for _, c := range []*client{o, m1, m1web} {
		if got := seqs(c.waitPushes("sg_g", 4)); !slices.Equal(got, []int64{1, 2, 3, 4}) {
			t.Errorf("%s: sg_g seqs %v, want [1 2 3 4]", c.user, got)
		}
	}
	if r, _ := out.send(groupMsg("out", "g", "intruder", "hi")); r.ErrCode != codeNotInGroupYet {
		t.Errorf("non-member's send = %d, want %d", r.ErrCode, codeNotInGroupYet)
	}
	// An invitee gets what follows, and the history before (pull).
	mustOK(t, s, "/group/invite_user_to_group", admin, &group.InviteUserToGroupReq{GroupID: "g", InvitedUserIDs: []string{"late"}}, nil)
	late := dial(t, s, "late", constant.WindowsPlatformID, userToken(t, s, admin, "late", constant.WindowsPlatformID), dialOpt{})
	o.send(groupMsg("o", "g", "after", "hi"))
	// The invitation's own push (seq 5) may come before or after late's
	// login: it is queued when the invitation is answered.
	var after *sdkws.MsgData
	late.until("the push of after", func(fs []frame) bool {
		for _, f := range fs {
			for _, p := range f.pushes {
				if p.conv == "sg_g" && p.msg.ClientMsgID == "after" {
					after = p.msg
				}
			}
		}
		return after != nil
	})
	if after.Seq != 6 {
		t.Errorf("late's push of after = seq %d, want 6 (5 is the MemberInvitedNotification)", after.Seq)
	}
	var pr sdkws.PullMessageBySeqsResp
	late.call(wsPullMsgBySeqList, &sdkws.PullMessageBySeqsReq{UserID: "late",
		SeqRanges: []*sdkws.SeqRange{{ConversationID: "sg_g", Begin: 1, End: 6, Num: 100}}}, &pr)
	if got := pr.Msgs["sg_g"]; got == nil || len(got.Msgs) != 6 || got.Msgs[4].ContentType != constant.MemberInvitedNotification {
		t.Errorf("late's pull of sg_g 1-6 = %v, want 6 messages, the 5th the invitation", got)
	}
	out.call(wsPullMsgBySeqList, &sdkws.PullMessageBySeqsReq{UserID: "out",
		SeqRanges: []*sdkws.SeqRange{{ConversationID: "sg_g", Begin: 1, End: 6, Num: 100}}}, &pr)
	if len(pr.Msgs) != 0 {
		t.Errorf("a non-member's pull = %v, want nothing", pr.Msgs)
	}
}

// TestNewestSeqAndPull: a user offline while messages were sent finds
// them with 1001 and fetches them with 1002, as the real one answers
// ranges, num and seqs beyond its bounds.
func TestNewestSeqAndPull(t *testing.T) {
	s := newServer(t, Options{History: 4})
	admin := adminToken(t, s)
	register(t, s, admin, "a", "b", "c")
	a := dial(t, s, "a", constant.WindowsPlatformID, userToken(t, s, admin, "a", constant.WindowsPlatformID), dialOpt{})
	for i := range 6 {
		a.send(textMsg("a", "b", fmt.Sprint("m", i+1), "x"))
	}
	a.waitPushes("si_a_b", 6)
	b := dial(t, s, "b", constant.WindowsPlatformID, userToken(t, s, admin, "b", constant.WindowsPlatformID), dialOpt{})

	var ms sdkws.GetMaxSeqResp
	if r := b.call(wsGetNewestSeq, &sdkws.GetMaxSeqReq{UserID: "b"}, &ms); r.ErrCode != 0 {
		t.Fatalf("1001: %d %s", r.ErrCode, r.ErrMsg)
	}
	if ms.MaxSeqs["si_a_b"] != 6 || len(ms.MaxSeqs) != 1 || len(ms.MinSeqs) != 0 {
		t.Errorf("GetMaxSeqResp = %v, want maxSeqs {si_a_b: 6} and no minSeqs (v3.8.3)", &ms)
	}
	if r := b.call(wsGetNewestSeq, &sdkws.GetMaxSeqReq{UserID: "a"}, nil); r.ErrCode != codeNoPermission {
		t.Errorf("1001 for another user = %d, want %d", r.ErrCode, codeNoPermission)
	}

	// History 4 keeps seqs 3-6: minSeq is 3.
	pull := func(r *sdkws.SeqRange, order sdkws.PullOrder) *sdkws.PullMsgs {
		t.Helper()
		var resp sdkws.PullMessageBySeqsResp
		if w := b.call(wsPullMsgBySeqList, &sdkws.PullMessageBySeqsReq{UserID: "b", SeqRanges: []*sdkws.SeqRange{r}, Order: order}, &resp); w.ErrCode != 0 {
			t.Fatalf("1002: %d %s", w.ErrCode, w.ErrMsg)
		}
		return resp.Msgs[r.ConversationID]
	}
	got := func(p *sdkws.PullMsgs) string {
		if p == nil {
			return "none"
		}
		var ss []int64
		for _, m := range p.Msgs {
			ss = append(ss, m.Seq)
		}
		return fmt.Sprintf("%v end=%v", ss, p.IsEnd)
	}
	asc, desc := sdkws.PullOrder_PullOrderAsc, sdkws.PullOrder_PullOrderDesc
	tests := []struct {
		name  string
		r     *sdkws.SeqRange
		order sdkws.PullOrder
		want  string
	}{
		{"whole range", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 1, End: 6, Num: 100}, asc, "[3 4 5 6] end=true"},
		{"below minSeq, cut", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 1, End: 4, Num: 100}, asc, "[3 4] end=false"},
		{"beyond maxSeq", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 5, End: 50, Num: 100}, asc, "[5 6] end=true"},
		{"num takes the newest", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 3, End: 6, Num: 2}, asc, "[5 6] end=true"},
		{"num 0", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 3, End: 6}, asc, "none"},
		{"all below minSeq", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 1, End: 2, Num: 10}, asc, "none"},
		{"begin past maxSeq", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 7, End: 9, Num: 10}, asc, "none"},
		{"descending reaches minSeq", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 1, End: 6, Num: 10}, desc, "[3 4 5 6] end=true"},
		{"descending short of minSeq", &sdkws.SeqRange{ConversationID: "si_a_b", Begin: 5, End: 6, Num: 10}, desc, "[5 6] end=false"},
		{"not b's conversation", &sdkws.SeqRange{ConversationID: "si_a_c", Begin: 1, End: 6, Num: 10}, asc, "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if g := got(pull(tt.r, tt.order)); g != tt.want {
				t.Errorf("pull %v order %v = %s, want %s", tt.r, tt.order, g, tt.want)
			}
		})
	}
	p := pull(&sdkws.SeqRange{ConversationID: "si_a_b", Begin: 6, End: 6, Num: 1}, asc)
	if m := p.Msgs[0]; m.ClientMsgID != "m6" || m.SendID != "a" || string(m.Content) != `{"content":"x"}` {
		t.Errorf("pulled seq 6 = %v, want the message a sent", m)
	}
	// The pull envelope must carry msgIncr (the validator's required tag).
	raw, _ := json.Marshal(wireReq{ReqIdentifier: wsPullMsgBySeqList, SendID: "b", OperationID: "o"})
	if err := b.writeBinary(raw); err != nil {
		t.Fatal(err)
	}
	if r := b.answer(wsPullMsgBySeqList, ""); r.ErrCode != codeServerInternal {
		t.Errorf("pull without msgIncr = %d, want %d", r.ErrCode, codeServerInternal)
	}

	rs := newServer(t, Options{ReportMinSeqs: true, History: 4})
	radmin := adminToken(t, rs)
	register(t, rs, radmin, "a", "b")
	ra := dial(t, rs, "a", constant.WindowsPlatformID, userToken(t, rs, radmin, "a", constant.WindowsPlatformID), dialOpt{})
	for i := range 6 {
		ra.send(textMsg("a", "b", fmt.Sprint("m", i), "x"))
	}
	ra.waitPushes("si_a_b", 6)
	ra.call(wsGetNewestSeq, &sdkws.GetMaxSeqReq{UserID: "a"}, &ms)
	if ms.MaxSeqs["si_a_b"] != 6 || ms.MinSeqs["si_a_b"] != 3 {
		t.Errorf("with ReportMinSeqs: %v, want max 6 min 3", &ms)
	}
}

// TestBackgroundIOS: an iOS connection that said it is in the background
// (2004) gets no pushes; other platforms in the background still do.
func TestBackgroundIOS(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "alice", "bob")
	alice := dial(t, s, "alice", constant.WindowsPlatformID, userToken(t, s, admin, "alice", constant.WindowsPlatformID), dialOpt{})
	ios := dial(t, s, "bob", constant.IOSPlatformID, userToken(t, s, admin, "bob", constant.IOSPlatformID), dialOpt{})
	android := dial(t, s, "bob", constant.AndroidPlatformID, userToken(t, s, admin, "bob", constant.AndroidPlatformID), dialOpt{})
	for _, c := range []*client{ios, android} {
		if r := c.call(wsSetBackgroundStatus, &sdkws.SetAppBackgroundStatusReq{UserID: "bob", IsBackground: true}, nil); r.ErrCode != 0 || r.Data != nil {
			t.Fatalf("2004 = %+v, want errCode 0, no data", r)
		}
	}
	alice.send(textMsg("alice", "bob", "while-away", "x"))
	android.waitPushes("si_alice_bob", 1)
	ios.call(wsSetBackgroundStatus, &sdkws.SetAppBackgroundStatusReq{UserID: "bob"}, nil)
	alice.send(textMsg("alice", "bob", "back", "x"))
	if got := seqs(android.waitPushes("si_alice_bob", 2)); !slices.Equal(got, []int64{1, 2}) {
		t.Errorf("android seqs %v, want [1 2]", got)
	}
	if got := seqs(ios.waitPushes("si_alice_bob", 1)); !slices.Equal(got, []int64{2}) {
		t.Errorf("iOS seqs %v, want [2]: nothing while in the background", got)
	}
}
