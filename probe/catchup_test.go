package probe

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestCatchup scripts what a device sees of one conversation and checks
// which fetches come due.
func TestCatchup(t *testing.T) {
	const grace = 100 * time.Millisecond
	ms := int64(time.Millisecond)
	type step struct {
		got, behind, answeredAfter, answeredUpTo uint64
		at                                       int64 // ms
		// start, when starts is set, is a Start at that seq.
		start  uint64
		starts bool
		// due, when set, is checked: the fetches due at this step.
		due   []Fetch
		check bool
	}
	tests := []struct {
		name    string
		steps   []step
		missing uint64
	}{
		{
			name:  "in order: nothing due",
			steps: []step{{got: 1}, {got: 2}, {got: 3, at: 500, check: true}},
		},
		{
			name: "gap fetched after the grace, not before",
			steps: []step{
				{got: 1}, {got: 4, at: 10},
				{at: 50, check: true},
				{at: 200, check: true, due: []Fetch{{Conv: "c", After: 1, N: 2}}},
				// Asked: not again until the retry time.
				{at: 300, check: true},
			},
			missing: 2,
		},
		{
			name: "a reordered push closes its gap within the grace",
			steps: []step{
				{got: 1}, {got: 3, at: 10}, {got: 2, at: 20},
				{at: 500, check: true},
			},
		},
		{
			// The server counts a message before its push arrives: a
			// gap it names waits the grace like any other.
			name: "behind is due after the grace",
			steps: []step{
				{got: 5}, {behind: 9, at: 10},
				{at: 10, check: true},
				{at: 109, check: true},
				{at: 110, check: true, due: []Fetch{{Conv: "c", After: 5, N: 4}}},
			},
			missing: 4,
		},
		{
			name: "pushes in flight close what behind named",
			steps: []step{
				{got: 5}, {behind: 9, at: 10},
				{got: 7, at: 40}, {got: 6, at: 50}, {got: 9, at: 60}, {got: 8, at: 100},
				{at: 5000, check: true},
			},
		},
		{
			// A device's first word of a conversation is where it
			// starts: what came before its first login is not its to
			// fetch.
			name:  "first sight opens no gap",
			steps: []step{{behind: 40}, {got: 41, at: 10}, {at: 500, check: true}},
		},
		{
			name: "known at 0: the first message is owed",
			steps: []step{
				{behind: 0}, {got: 2, at: 10},
				{at: 500, check: true, due: []Fetch{{Conv: "c", After: 0, N: 1}}},
			},
			missing: 1,
		},
		{
			// A driver that knows where its process first saw the
			// conversation starts a new device there: what was sent
			// since, before its first login, is its to fetch.
			name: "a start below the first sight is owed from there",
			steps: []step{
				{start: 10, starts: true}, {behind: 40, at: 10},
				{at: 109, check: true},
				{at: 110, check: true, due: []Fetch{{Conv: "c", After: 10, N: 30}}},
			},
			missing: 30,
		},
		{
			// The device that the offline backlog went to holds it
			// all by the time its sync is answered.
			name: "a start then the backlog in order: nothing due",
			steps: []step{
				{start: 10, starts: true}, {got: 11}, {got: 12}, {behind: 12, at: 10},
				{at: 500, check: true},
			},
		},
		{
			name: "a start after the device has its place changes nothing",
			steps: []step{
				{behind: 40}, {start: 10, starts: true}, {got: 41, at: 10},
				{at: 500, check: true},
			},
		},
		{
			name: "answered closes what the server does not have",
			steps: []step{
				{got: 1}, {got: 6, at: 10},
				{got: 3, at: 20},
				{answeredAfter: 1, answeredUpTo: 6, at: 200},
				{at: 5000, check: true},
			},
		},
		{
			name: "a fetch answers a page at a time",
			steps: []step{
				{got: 1}, {behind: 2 + MaxFetch + 10, at: 0},
				{at: 100, check: true, due: []Fetch{{Conv: "c", After: 1, N: MaxFetch}}},
				{answeredAfter: 1, answeredUpTo: 1 + MaxFetch, at: 10},
			},
			missing: 11,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCatchup(grace)
			for i, s := range tt.steps {
				now := s.at * ms
				switch {
				case s.starts:
					c.Start("c", s.start)
				case s.got != 0:
					c.Got([]byte("c"), s.got, now)
				case s.answeredUpTo != 0:
					c.Answered("c", s.answeredAfter, s.answeredUpTo)
				case !s.check:
					c.Behind("c", s.behind, now)
				}
				if s.check {
					if got := c.Due(now, nil, 100); !slices.Equal(got, s.due) {
						t.Errorf("step %d: Due(%d ms) = %v, want %v", i, s.at, got, s.due)
					}
				}
			}
			if got := c.Missing(); got != tt.missing {
				t.Errorf("Missing() = %d, want %d", got, tt.missing)
			}
		})
	}
}

// TestCatchupBehindPlaces: Behind says when it gave the device its place
// in a conversation, which a driver keeps as where its process first saw
// it; a Start before it, or a first Behind, already did.
func TestCatchupBehindPlaces(t *testing.T) {
	c := NewCatchup(time.Second)
	if !c.Behind("a", 7, 0) {
		t.Error("first Behind of a: not placed, want placed")
	}
	if c.Behind("a", 9, 0) {
		t.Error("second Behind of a: placed, want not")
	}
	c.Start("b", 3)
	if c.Behind("b", 9, 0) {
		t.Error("Behind of b after Start: placed, want not")
	}
	if got := c.Missing(); got != 2+6 {
		t.Errorf("Missing() = %d, want 8: a's 8-9 and b's 4-9", got)
	}
}

// TestCatchupDueEach: two gaps in one conversation and one in another
// come due as one fetch per conversation at a time, the conversation's
// second gap at the next call, where Due gives all three at once. A
// server that answers once per conversation (OpenIM) would otherwise
// answer the first gap with the second's messages, and the first gap,
// taken as answered, would never be fetched: its message counted lost.
func TestCatchupDueEach(t *testing.T) {
	const grace = 100 * time.Millisecond
	ms := int64(time.Millisecond)
	gaps := func() *Catchup {
		c := NewCatchup(grace)
		c.Got([]byte("a"), 1, 0)
		c.Got([]byte("a"), 3, 0)
		c.Got([]byte("a"), 5, 0)
		c.Got([]byte("b"), 1, 0)
		c.Got([]byte("b"), 3, 0)
		return c
	}
	byConv := func(fs []Fetch) map[string][]Fetch {
		m := map[string][]Fetch{}
		for _, f := range fs {
			m[f.Conv] = append(m[f.Conv], f)
		}
		return m
	}
	if got := byConv(gaps().Due(200*ms, nil, 100)); len(got["a"]) != 2 || len(got["b"]) != 1 {
		t.Fatalf("Due = %v, want both of a's gaps and b's", got)
	}
	c := gaps()
	first := byConv(c.DueEach(200*ms, nil, 100))
	if len(first["a"]) != 1 || len(first["b"]) != 1 || first["a"][0] != (Fetch{Conv: "a", After: 1, N: 1}) {
		t.Fatalf("first DueEach = %v, want a's first gap (after 1) and b's", first)
	}
	second := c.DueEach(210*ms, nil, 100)
	if want := []Fetch{{Conv: "a", After: 3, N: 1}}; !slices.Equal(second, want) {
		t.Fatalf("second DueEach = %v, want %v", second, want)
	}
}

// TestCatchupBounded: however a hostile or broken server scatters its
// sequence numbers, a device keeps a bounded number of gaps, and a fetch
// never asks for less than is missing.
func TestCatchupBounded(t *testing.T) {
	c := NewCatchup(0)
	for i := range uint64(1000) {
		c.Got([]byte("c"), 1+i*3, 0)
	}
	if n := len(c.lookup("c").gaps()); n > maxConvGaps {
		t.Errorf("%d gaps kept, want at most %d", n, maxConvGaps)
	}
	if got, want := c.Missing(), uint64(999*2); got < want {
		t.Errorf("Missing() = %d, want at least the %d missing", got, want)
	}
	for i := range maxCatchupConvs + 10 {
		c.Got([]byte{byte(i), byte(i >> 8), 'x'}, 1, 0)
	}
	if n := len(c.convs); n > maxCatchupConvs {
		t.Errorf("%d conversations kept, want at most %d", n, maxCatchupConvs)
	}
}

// TestCatchupGotDoesNotAllocate guards the delivery path.
func TestCatchupGotDoesNotAllocate(t *testing.T) {
	c := NewCatchup(time.Second)
	conv := []byte("g:imcanary-g1")
	seq := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		seq++
		c.Got(conv, seq, 0)
	})
	if allocs != 0 {
		t.Errorf("Got allocates %v times per message, want 0", allocs)
	}
}

// TestCatchupManyConversations: a device in more conversations than it
// scans keeps each one's place, before and after it starts an index.
func TestCatchupManyConversations(t *testing.T) {
	c := NewCatchup(0)
	const n = 3 * convScan
	name := func(i int) string { return fmt.Sprintf("conv-%d", i) }
	for i := range n {
		c.Behind(name(i), uint64(i+1), 0)
		for j := range i + 1 {
			if seq, _ := c.Position(name(j)); seq != uint64(j+1) {
				t.Fatalf("with %d conversations, %s at %d, want %d", i+1, name(j), seq, j+1)
			}
		}
	}
	if c.Lacks() {
		t.Fatal("a gap open with none missing")
	}
	c.Got([]byte(name(n-1)), uint64(n+2), 1)
	due := c.Due(1, nil, 10)
	if len(due) != 1 || due[0].Conv != name(n-1) || due[0].After != uint64(n) {
		t.Errorf("due %+v, want %s after %d", due, name(n-1), n)
	}
	if seq, _ := c.Position("none"); seq != 0 {
		t.Errorf("a conversation never seen at %d", seq)
	}
}
