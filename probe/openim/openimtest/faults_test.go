package openimtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/group"
	"github.com/openimsdk/protocol/sdkws"
)

// burst sends n messages from a to b with sender sync off, so b's one
// connection is the only one pushed to, and returns when every ack is in
// and every push has ended on the server.
func burst(t *testing.T, s *Server, a *client, n int) {
	t.Helper()
	var incrs []string
	for i := range n {
		m := textMsg("a", "b", fmt.Sprintf("c%03d", i+1), "x")
		m.Options = map[string]bool{constant.IsSenderSync: false}
		incrs = append(incrs, a.request(wsSendMsg, m))
	}
	for _, incr := range incrs {
		if r := a.answer(wsSendMsg, incr); r.ErrCode != 0 {
			t.Fatalf("ack %s: %d %s", incr, r.ErrCode, r.ErrMsg)
		}
	}
	// Every acked send that was not thrown away becomes one push job.
	waitStats(t, s, "pushes ended", func(st Stats) bool {
		return s.st.pushJobs.Load() == int64(n)-st.Unstored
	})
}

// TestFaults injects each fault at a known rate and checks that it is
// counted, and seen on the wire by the receiver, and that without it
// nothing is.
func TestFaults(t *testing.T) {
	const n, p = 300, 0.25
	tests := []struct {
		name   string
		faults Faults
		check  func(t *testing.T, st Stats, got []int64, missing []int64)
	}{
		{"none", Faults{}, func(t *testing.T, st Stats, got, missing []int64) {
			if st.PushesDropped+st.PushesDuplicated+st.PushesReordered+st.Unstored != 0 || len(missing) != 0 {
				t.Errorf("stats %+v, missing %v, want no fault", st, missing)
			}
			if !slices.IsSorted(got) || len(got) != n {
				t.Errorf("got %d pushes, sorted %v, want %d in order", len(got), slices.IsSorted(got), n)
			}
		}},
		{"drop", Faults{DropPush: p}, func(t *testing.T, st Stats, got, missing []int64) {
			inRate(t, "PushesDropped", st.PushesDropped, n, p)
			if int64(len(missing)) != st.PushesDropped || len(got) != n-len(missing) || !slices.IsSorted(got) {
				t.Errorf("missing %d seqs, got %d, PushesDropped %d: want them to match, in order", len(missing), len(got), st.PushesDropped)
			}
			if st.PushesDuplicated+st.PushesReordered+st.Unstored != 0 {
				t.Errorf("stats %+v, want only drops", st)
			}
		}},
		{"duplicate", Faults{DuplicatePush: p}, func(t *testing.T, st Stats, got, missing []int64) {
			inRate(t, "PushesDuplicated", st.PushesDuplicated, n, p)
			twice := 0
			for i := 1; i < len(got); i++ {
				if got[i] == got[i-1] {
					twice++
				}
			}
			if int64(twice) != st.PushesDuplicated || len(got) != n+twice || len(missing) != 0 {
				t.Errorf("%d seqs seen twice in %d pushes, PushesDuplicated %d", twice, len(got), st.PushesDuplicated)
			}
			if st.PushesDropped+st.PushesReordered+st.Unstored != 0 {
				t.Errorf("stats %+v, want only duplicates", st)
			}
		}},
		{"reorder", Faults{ReorderPush: p}, func(t *testing.T, st Stats, got, missing []int64) {
			inRate(t, "PushesReordered", st.PushesReordered, n, p)
			descents := 0
			for i := 1; i < len(got); i++ {
				if got[i] < got[i-1] {
					descents++
				}
			}
			// The last held push, if any, waits for a next push that
			// never comes: it is the one missing.
			held := int64(len(missing))
			if held > 1 || int64(descents) != st.PushesReordered-held {
				t.Errorf("%d descents, %d missing, PushesReordered %d", descents, held, st.PushesReordered)
			}
			if st.PushesDropped+st.PushesDuplicated+st.Unstored != 0 {
				t.Errorf("stats %+v, want only reorders", st)
			}
		}},
		{"unstored", Faults{Unstored: p}, func(t *testing.T, st Stats, got, missing []int64) {
			inRate(t, "Unstored", st.Unstored, n, p)
			// The seqs show nothing: they are contiguous over what was
			// stored.
			if st.SendsAcked != n || int64(len(got)) != n-st.Unstored || len(missing) != 0 || !slices.IsSorted(got) {
				t.Errorf("acked %d, got %d, missing %d, Unstored %d", st.SendsAcked, len(got), len(missing), st.Unstored)
			}
			if st.PushesDropped+st.PushesDuplicated+st.PushesReordered != 0 {
				t.Errorf("stats %+v, want only unstored", st)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, Options{Faults: tt.faults, Seed: 7})
			admin := adminToken(t, s)
			register(t, s, admin, "a", "b")
			a := dial(t, s, "a", constant.WindowsPlatformID, userToken(t, s, admin, "a", constant.WindowsPlatformID), dialOpt{})
			b := dial(t, s, "b", constant.WindowsPlatformID, userToken(t, s, admin, "b", constant.WindowsPlatformID), dialOpt{})
			burst(t, s, a, n)
			st := s.Stats()
			// Everything written is read.
			ps := b.waitPushes("si_a_b", int(st.PushesSent))
			got := seqs(ps)

			var ms sdkws.GetMaxSeqResp
			b.call(wsGetNewestSeq, &sdkws.GetMaxSeqReq{UserID: "b"}, &ms)
			maxSeq := ms.MaxSeqs["si_a_b"]
			if maxSeq != int64(n)-st.Unstored {
				t.Errorf("maxSeq %d, want %d sent - %d unstored", maxSeq, n, st.Unstored)
			}
			seen := map[int64]bool{}
			for _, q := range got {
				seen[q] = true
			}
			var missing []int64
			for q := int64(1); q <= maxSeq; q++ {
				if !seen[q] {
					missing = append(missing, q)
				}
			}
			tt.check(t, st, got, missing)
			t.Logf("%d sent: %d pushes read, %d seqs missing; dropped %d, duplicated %d, reordered %d, unstored %d",
				n, len(got), len(missing), st.PushesDropped, st.PushesDuplicated, st.PushesReordered, st.Unstored)

			// A gap is filled by pulling the missing seqs.
			for _, q := range missing {
				var pr sdkws.PullMessageBySeqsResp
				b.call(wsPullMsgBySeqList, &sdkws.PullMessageBySeqsReq{UserID: "b",
					SeqRanges: []*sdkws.SeqRange{{ConversationID: "si_a_b", Begin: q, End: q, Num: 1}}}, &pr)
				if pm := pr.Msgs["si_a_b"]; pm == nil || len(pm.Msgs) != 1 || pm.Msgs[0].Seq != q || !strings.HasPrefix(pm.Msgs[0].ClientMsgID, "c") {
					t.Errorf("pull of missing seq %d = %v", q, pm)
				}
			}
			if st := s.Stats(); st.MessagesPulled != int64(len(missing)) {
				t.Errorf("MessagesPulled = %d, want %d", st.MessagesPulled, len(missing))
			}
		})
	}
}

// inRate checks a binomial count against its rate, within bounds (half
// and double the mean) that 300 trials at 0.25 leave by chance with a
// probability under 1e-9.
func inRate(t *testing.T, what string, got int64, n int, p float64) {
	t.Helper()
	mean := float64(n) * p
	if float64(got) < mean/2 || float64(got) > 2*mean {
		t.Errorf("%s = %d, want about %.0f (%d × %v)", what, got, mean, n, p)
	}
}

// TestPushDelay: pushes come at least PushDelay after the send, acks do
// not wait for it. The delay is chosen from latencies measured first,
// without it.
func TestPushDelay(t *testing.T) {
	measure := func(delay time.Duration) (ackMax, pushMin, pushMax time.Duration) {
		s := newServer(t, Options{Faults: Faults{PushDelay: delay}})
		admin := adminToken(t, s)
		register(t, s, admin, "a", "b")
		a := dial(t, s, "a", constant.WindowsPlatformID, userToken(t, s, admin, "a", constant.WindowsPlatformID), dialOpt{})
		b := dial(t, s, "b", constant.WindowsPlatformID, userToken(t, s, admin, "b", constant.WindowsPlatformID), dialOpt{})
		pushMin = time.Hour
		for i := range 10 {
			sent := time.Now()
			incr := a.request(wsSendMsg, textMsg("a", "b", fmt.Sprint("d", i), "x"))
			ack := a.waitFrame(func(f frame) bool { return f.resp.MsgIncr == incr })
			p := b.waitPushes("si_a_b", i+1)[i]
			ackMax = max(ackMax, ack.at.Sub(sent))
			pushMin, pushMax = min(pushMin, p.at.Sub(sent)), max(pushMax, p.at.Sub(sent))
		}
		return ackMax, pushMin, pushMax
	}
	ack0, _, push0 := measure(0)
	delay := 20*max(ack0, push0) + 50*time.Millisecond
	ack, pushMin, _ := measure(delay)
	if pushMin < delay {
		t.Errorf("a push came %s after its send, before the %s delay", pushMin, delay)
	}
	if ack >= delay {
		t.Errorf("an ack took %s, not less than the %s push delay (%s without it)", ack, delay, ack0)
	}
	t.Logf("without delay: ack ≤ %s, push ≤ %s; with %s: ack ≤ %s, push ≥ %s", ack0, push0, delay, ack, pushMin)
}

// TestSlowReader: a member of a group that stops reading stalls its own
// pushes for WriteTimeout, then every write to it fails, and the next
// ping it sends gets it disconnected; the other members get every push.
func TestSlowReader(t *testing.T) {
	const (
		writeTimeout = 300 * time.Millisecond
		size         = 30000 // a 30 kB text stays under the 51,200-byte frame limit once base64'd
		batch        = 20
		most         = 1000 // 30 MB: far more than loopback sockets buffer
	)
	s := newServer(t, Options{WriteTimeout: writeTimeout})
	admin := adminToken(t, s)
	register(t, s, admin, "slow", "c")
	// The admin may send to a group it is not in (verify.go:96-98), so
	// the sender gets no pushes to decode.
	a := dial(t, s, adminUserID, constant.AdminPlatformID, admin, dialOpt{})
	// A 4 kB receive buffer and no reader: the server's writes fill the
	// socket and block.
	slow := dial(t, s, "slow", constant.WindowsPlatformID, userToken(t, s, admin, "slow", constant.WindowsPlatformID),
		dialOpt{rcvBuf: 4096, noReader: true, noMsgResp: true})
	c := dial(t, s, "c", constant.WindowsPlatformID, userToken(t, s, admin, "c", constant.WindowsPlatformID), dialOpt{})
	mustOK(t, s, "/group/create_group", admin, &group.CreateGroupReq{OwnerUserID: "c", MemberUserIDs: []string{"slow"},
		GroupInfo: &sdkws.GroupInfo{GroupID: "g", GroupType: constant.WorkingGroup}}, nil)

	// Send until the server has found the slow consumer: how much the
	// sockets take first depends on the kernel.
	text := strings.Repeat("x", size)
	start := time.Now()
	sent := 0
	for s.Stats().SlowConsumers == 0 {
		if sent >= most {
			t.Fatalf("no slow consumer after %d messages of %d bytes: %+v", sent, size, s.Stats())
		}
		var incrs []string
		for range batch {
			incrs = append(incrs, a.request(wsSendMsg, groupMsg(adminUserID, "g", fmt.Sprint("s", sent), text)))
			sent++
		}
		for _, incr := range incrs {
			if r := a.answer(wsSendMsg, incr); r.ErrCode != 0 {
				t.Fatalf("ack: %d %s", r.ErrCode, r.ErrMsg)
			}
		}
	}
	found := time.Since(start)
	if found < writeTimeout {
		t.Errorf("slow consumer found %s after the first send, before the %s write timeout", found, writeTimeout)
	}
	// The others get everything: the notification and every message.
	if got := seqs(c.waitPushes("sg_g", sent+1)); len(got) != sent+1 || !slices.IsSorted(got) || got[sent] != int64(sent+1) {
		t.Errorf("c got seqs %v…, want 1-%d in order", got[:min(5, len(got))], sent+1)
	}
	st := waitStats(t, s, "pushes ended", func(Stats) bool { return s.st.pushJobs.Load() == int64(sent)+2 })
	if st.SlowConsumers != 1 || st.PushesFailed == 0 || st.SlowConsumerDisconnects != 0 {
		t.Errorf("stats %+v: want one slow consumer, failed pushes, the slow connection still open", st)
	}
	// Its next ping's pong cannot be written: the server closes it.
	if err := slow.writeText(`{"type":"ping"}`); err != nil {
		t.Fatal(err)
	}
	st = waitStats(t, s, "slow consumer gone", func(st Stats) bool { return st.SlowConsumerDisconnects == 1 })
	if st.ConnsOpen != 2 {
		t.Errorf("ConnsOpen = %d, want 2", st.ConnsOpen)
	}
	t.Logf("slow consumer found after %d messages, %s; pushes sent %d, failed %d", sent, found, st.PushesSent, st.PushesFailed)
}
