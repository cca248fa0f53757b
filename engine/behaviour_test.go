package engine

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

var testMix = []config.Behaviour{
	{Name: "active", Share: 0.5, Rate: 2},
	{Name: "silent", Share: 0.3},
	{Name: "large", Share: 0.2, Rate: 0.5, MessageSize: "4096-8192"},
}

func mixPop(t *testing.T, users int, mix []config.Behaviour) *Population {
	t.Helper()
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	p, err := NewPopulation(Options{
		Connection: Connection{Driver: nopDriver{}, Run: "r1", Heartbeat: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond},
		Set:        set, Prefix: "p", Users: users, GroupSize: 5, Rate: 1,
		Deadline: 2 * time.Second, LostAfter: 4 * time.Second, Behaviours: mix,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBehaviourClasses: each class gets its share of the users, to within
// one, spread through the population rather than in a block, and its own
// rate; silent users never send.
func TestBehaviourClasses(t *testing.T) {
	const n = 1000
	p := mixPop(t, n, testMix)
	count := make([]int, len(testMix))
	firstHalf := make([]int, len(testMix))
	for _, u := range p.users {
		count[u.class]++
		if u.idx < n/2 {
			firstHalf[u.class]++
		}
		want := int64(0)
		if r := testMix[u.class].Rate; r > 0 {
			want = int64(float64(time.Second) / r)
		}
		if u.interval != want {
			t.Errorf("user %d of class %s sends every %v, want %v", u.idx, testMix[u.class].Name, time.Duration(u.interval), time.Duration(want))
		}
	}
	for c, b := range testMix {
		if want := b.Share * n; math.Abs(float64(count[c])-want) > 1 {
			t.Errorf("class %s has %d users, want %v ± 1", b.Name, count[c], want)
		}
		if want := b.Share * n / 2; math.Abs(float64(firstHalf[c])-want) > 0.05*n {
			t.Errorf("class %s has %d of the first %d users, want about %v: the classes are not spread", b.Name, firstHalf[c], n/2, want)
		}
	}
}

// TestBehaviourSizes: a class's bodies fall in its size range, and cover
// it; the other classes keep the population's size.
func TestBehaviourSizes(t *testing.T) {
	p := mixPop(t, 100, testMix)
	lo, hi := math.MaxInt, 0
	for _, u := range p.users {
		for range 50 {
			s := p.bodySize(u)
			if u.class != 2 {
				if s != 0 {
					t.Fatalf("class %s body size %d, want the population's 0", testMix[u.class].Name, s)
				}
				continue
			}
			lo, hi = min(lo, s), max(hi, s)
		}
	}
	if lo < 4096 || hi > 8192 || hi-lo < 3000 {
		t.Errorf("large bodies %d to %d bytes, want spread over 4096-8192", lo, hi)
	}
}

// TestMembershipChurnNeedsRegrouper: a mix that churns membership is
// refused by a driver that cannot change groups, naming why.
func TestMembershipChurnNeedsRegrouper(t *testing.T) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	_, err := NewPopulation(Options{
		Connection: Connection{Driver: nopDriver{}, Run: "r1", Heartbeat: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond},
		Set:        set, Prefix: "p", Users: 10, GroupSize: 5, Deadline: time.Second, LostAfter: 2 * time.Second,
		Behaviours: []config.Behaviour{{Name: "joiner", Share: 1, Rate: 1, MembershipChurn: time.Minute}},
	})
	if err == nil || !strings.Contains(err.Error(), "cannot change at run time") {
		t.Errorf("NewPopulation with churn on a driver without SetMembers: %v, want a refusal naming it", err)
	}
}

// TestMembershipJudgement: owed to a member, not to one out of the group,
// and not judged while a change's window, which ends a deadline after the
// server confirmed the change, overlaps the message's flight from its send
// to its ack, nor when the change began after the ack it is judged at.
func TestMembershipJudgement(t *testing.T) {
	g := newGroupState(0, []int{0, 1})
	const dl = int64(time.Second)
	if got := g.at(1, 50, 100, dl); got != member {
		t.Errorf("never changed: %v, want member", got)
	}
	g.changeStart[1].Store(1000)
	g.present[1].Store(false)
	for _, tt := range []struct {
		name          string
		sentAt, ackAt int64
		want          membership
	}{
		{"sent and acked during the change", 1200, 1500, inFlux},
		{"sent before the change, acked during it", 500, 1500, inFlux},
		{"acked before a change that began since", 500, 900, inFlux},
	} {
		if got := g.at(1, tt.sentAt, tt.ackAt, dl); got != tt.want {
			t.Errorf("change unconfirmed, %s: %v, want %v", tt.name, got, tt.want)
		}
	}
	g.changeDone[1].Store(2000)
	for _, tt := range []struct {
		name          string
		sentAt, ackAt int64
		want          membership
	}{
		{"acked a deadline after the confirmation", 1900 + dl, 2000 + dl, inFlux},
		{"sent within the window, acked past it", 2000 + dl, 2500 + dl, inFlux},
		{"sent past the window", 2001 + dl, 2100 + dl, outsider},
	} {
		if got := g.at(1, tt.sentAt, tt.ackAt, dl); got != tt.want {
			t.Errorf("change confirmed at 2000, %s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if g.settled(1, 2000+dl, dl) {
		t.Error("settled within the window")
	}
	g.changeStart[1].Store(0)
	g.changeDone[1].Store(0)
	g.present[1].Store(true)
	if !g.settled(1, 5000, dl) {
		t.Error("a member that never changed is not settled")
	}
}

// failingRegrouper refuses SetMembers while fail is set, and records the
// member lists it was asked for.
type failingRegrouper struct {
	nopDriver
	fail  bool
	lists [][]string
}

func (r *failingRegrouper) SetMembers(_ context.Context, g probe.Group) error {
	r.lists = append(r.lists, g.Members)
	if r.fail {
		return errors.New("refused")
	}
	return nil
}

// TestMembershipChangeFailure: a change the server did not confirm leaves
// the member in flux, never judged, until a later change of its group
// succeeds, and the user's next event retries the same change.
func TestMembershipChangeFailure(t *testing.T) {
	rg := &failingRegrouper{}
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	p, err := NewPopulation(Options{
		Connection: Connection{Driver: rg, Run: "r1", Heartbeat: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond},
		Set:        set, Prefix: "p", Users: 2, GroupSize: 2, Rate: 1,
		Deadline: time.Second, LostAfter: 2 * time.Second,
		Behaviours: []config.Behaviour{{Name: "joiner", Share: 1, Rate: 1, MembershipChurn: time.Minute}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dl := int64(p.opts.Deadline)
	u := p.users[1]
	st := u.groups[0]
	g, pos := st.grp, int(st.pos)

	rg.fail = true
	p.toggleMembership(context.Background(), rg, u)
	later := time.Now().UnixNano() + 10*dl
	if !g.present[pos].Load() {
		t.Fatal("a leave the server refused left the member absent")
	}
	if got := g.at(pos, later, later, dl); got != inFlux {
		t.Errorf("long after a refused change: %v, want in flux", got)
	}
	if u.outOf != st {
		t.Error("the refused change is not the user's next")
	}

	rg.fail = false
	p.toggleMembership(context.Background(), rg, u)
	if g.present[pos].Load() {
		t.Error("the retried leave did not leave")
	}
	if last := rg.lists[len(rg.lists)-1]; len(last) != 1 || last[0] == u.name {
		t.Errorf("retried leave sent members %v, want the other user alone", last)
	}
	later = time.Now().UnixNano() + 10*dl
	if got := g.at(pos, later, later, dl); got != outsider {
		t.Errorf("long after the confirmed leave: %v, want outsider", got)
	}

	// A refused rejoin, then another member's change confirms the whole
	// list, this member absent in it as it was.
	rg.fail = true
	p.toggleMembership(context.Background(), rg, u)
	rg.fail = false
	other := p.users[0]
	p.toggleMembership(context.Background(), rg, other)
	later = time.Now().UnixNano() + 10*dl
	if got := g.at(pos, later, later, dl); got != outsider {
		t.Errorf("after another member's confirmed change: %v, want outsider", got)
	}
}
