package reference_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
)

// lostBurst is the lost log's burst (probe's lostBurst).
const lostBurst = 20

// msgID names one delivery owed to one recipient.
type msgID struct {
	recipient, sender, stream string
	seq                       uint64
}

// receipts records every first delivery, by recipient.
type receipts struct {
	mu  sync.Mutex
	got map[msgID]bool
}

func (r *receipts) Login(int, time.Duration, error) {}
func (r *receipts) Disconnect(int, string, error)   {}
func (r *receipts) Ack(uint64, bool, time.Duration) {}
func (r *receipts) Unacked(uint64, string, string)  {}
func (r *receipts) Received(user int, h *probe.Header, _ time.Duration, o engine.Outcome) {
	if o != engine.Delivered && o != engine.Recovered {
		return
	}
	r.mu.Lock()
	r.got[msgID{fmt.Sprintf("t-u%d", user), string(h.Sender), string(h.Stream), h.Seq}] = true
	r.mu.Unlock()
}

// missing returns, per recipient and stream, the seqs below the highest
// received that never came: what the ledger must write off.
func (r *receipts) missing() map[msgID]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	top := map[msgID]uint64{}
	for id := range r.got {
		k := id
		k.seq = 0
		top[k] = max(top[k], id.seq)
	}
	out := map[msgID]bool{}
	for k, hi := range top {
		for s := uint64(1); s < hi; s++ {
			id := k
			id.seq = s
			if !r.got[id] {
				out[id] = true
			}
		}
	}
	return out
}

// lostLines collects the ledger's "messages lost" records.
type lostLines struct {
	mu    sync.Mutex
	ids   map[msgID]int
	lines int
	other []string
}

func (l *lostLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lostLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lostLines) WithGroup(string) slog.Handler            { return l }
func (l *lostLines) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "messages lost" {
		if r.Level >= slog.LevelWarn {
			l.mu.Lock()
			l.other = append(l.other, r.Message)
			l.mu.Unlock()
		}
		return nil
	}
	var id msgID
	var first, last uint64
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "recipient":
			id.recipient = a.Value.String()
		case "sender":
			id.sender = a.Value.String()
		case "stream":
			id.stream = a.Value.String()
		case "first_seq":
			first = a.Value.Uint64()
		case "last_seq":
			last = a.Value.Uint64()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines++
	for s := first; s <= last; s++ {
		id.seq = s
		l.ids[id]++
	}
	return nil
}

// TestLostLogNamesTheMessages drops deliveries at the target and checks that
// the ledger's lost log names exactly the messages that never came, each
// once, and as many as it counted lost.
func TestLostLogNamesTheMessages(t *testing.T) {
	rc := &receipts{got: map[msgID]bool{}}
	logs := &lostLines{ids: map[msgID]int{}}
	pc := base
	pc.observer = rc
	pc.logger = slog.New(logs)
	// Few enough losses (about a dozen) that the log's rate bound, a burst
	// of 20 lines and then one a second, names each one.
	fx := newFixture(t, refserver.Faults{Drop: 0.002}, pc)
	fx.soak(soakFor, pc.lostAfter)
	c := fx.counts()
	off := 0.0
	for _, r := range metrics.SendErrorReasons {
		off += metrics.Value(fx.set.SendErrors[r])
	}
	if off != 0 {
		// A written-off send missing at its recipient is not lost, and
		// receipts cannot tell it from a drop.
		t.Skipf("%v sends written off: the receipts do not say which messages were owed", off)
	}
	want := rc.missing()
	logs.mu.Lock()
	defer logs.mu.Unlock()
	t.Logf("drop: %+v; %d lost log lines naming %d messages; %d missing by the receipts", c, logs.lines, len(logs.ids), len(want))
	if c.lost == 0 {
		t.Fatalf("nothing lost at 0.2%% drop over %v deliveries: the fault was not injected", c.expected)
	}
	// Past the bound some losses go unnamed (their count is in a
	// summary line): then only what is named is checked.
	bounded := logs.lines >= lostBurst
	var extra, absent []msgID
	for id, n := range logs.ids {
		if !want[id] || n != 1 {
			extra = append(extra, id)
		}
	}
	for id := range want {
		if logs.ids[id] == 0 {
			absent = append(absent, id)
		}
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].seq < extra[j].seq })
	if len(extra) != 0 || (!bounded && (len(absent) != 0 || float64(len(logs.ids)) != c.lost)) {
		t.Errorf("lost log names %d messages, %v of them wrongly or twice, and misses %v; the ledger counted %v lost",
			len(logs.ids), extra, absent, c.lost)
	}
}
