package openimtest

import (
	"testing"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/sdkws"
)

// FuzzPull checks pull's answer to any range over a conversation that
// has wrapped its history: seqs ascending and contiguous, inside both
// the range and what is kept, at most num of them, each the stored
// message.
func FuzzPull(f *testing.F) {
	const history, sent = 5, 12 // seqs 8-12 kept, minSeq 8
	st := newStore(history)
	st.users["a"], st.users["b"] = &sdkws.UserInfo{UserID: "a"}, &sdkws.UserInfo{UserID: "b"}
	for range sent {
		st.store("si_a_b", &sdkws.MsgData{SendID: "a", RecvID: "b", SessionType: constant.SingleChatType})
	}
	for _, seed := range [][4]int64{{1, 12, 100, 0}, {0, 0, 1, 0}, {8, 8, 1, 1}, {-5, 1 << 62, -1 << 63, 0}, {13, 20, 5, 1}, {1, 12, 2, 1}} {
		f.Add(seed[0], seed[1], seed[2], int32(seed[3]))
	}
	f.Fuzz(func(t *testing.T, begin, end, num int64, order int32) {
		req := &sdkws.PullMessageBySeqsReq{UserID: "b", Order: sdkws.PullOrder(order),
			SeqRanges: []*sdkws.SeqRange{{ConversationID: "si_a_b", Begin: begin, End: end, Num: num}}}
		resp, n := st.pull(req)
		pm := resp.Msgs["si_a_b"]
		if pm == nil {
			if n != 0 {
				t.Fatalf("pull(%d,%d,%d) = no entry, count %d", begin, end, num, n)
			}
			return
		}
		if len(pm.Msgs) == 0 || int64(len(pm.Msgs)) > num || len(pm.Msgs) != n {
			t.Fatalf("pull(%d,%d,%d) = %d messages, count %d", begin, end, num, len(pm.Msgs), n)
		}
		for i, m := range pm.Msgs {
			if m.Seq < begin || m.Seq > end || m.Seq < sent-history+1 || m.Seq > sent {
				t.Fatalf("pull(%d,%d,%d): seq %d outside the range or what is kept", begin, end, num, m.Seq)
			}
			if i > 0 && m.Seq != pm.Msgs[i-1].Seq+1 {
				t.Fatalf("pull(%d,%d,%d): seq %d after %d", begin, end, num, m.Seq, pm.Msgs[i-1].Seq)
			}
			if m.SendID != "a" {
				t.Fatalf("pull(%d,%d,%d): seq %d is %v, not the stored message", begin, end, num, m.Seq, m)
			}
		}
	})
}

// TestPullSeqZero: before any history is trimmed minSeq is 0, so a range
// from 0 starts with a placeholder for seq 0, as GetMessageBySeqs answers
// a seq it does not hold (controller/msg.go:811-818).
func TestPullSeqZero(t *testing.T) {
	st := newStore(10)
	for range 2 {
		st.store("si_a_b", &sdkws.MsgData{SendID: "a", RecvID: "b", SessionType: constant.SingleChatType})
	}
	resp, _ := st.pull(&sdkws.PullMessageBySeqsReq{UserID: "a",
		SeqRanges: []*sdkws.SeqRange{{ConversationID: "si_a_b", Begin: 0, End: 2, Num: 10}}})
	ms := resp.Msgs["si_a_b"].GetMsgs()
	if len(ms) != 3 || ms[0].Seq != 0 || ms[0].Status != constant.MsgStatusHasDeleted || ms[1].SendID != "a" {
		t.Errorf("pull 0-2 = %v, want a deleted placeholder for 0, then 1 and 2", ms)
	}
}
