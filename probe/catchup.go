package probe

import (
	"sync"
	"time"
)

// Catch-up: what a real client does when it reconnects, or sees a gap in a
// conversation's sequence, is fetch what it missed from the server's store
// (a history range, a channel's recovery, a message archive). Catchup is
// the client's side of that, shared by the adapters: which server
// sequences of each conversation the device holds, and which it still
// lacks. The adapter says what arrived (Got) and what the server says it
// has (Behind), asks for what is Due, and reports each fetched message to
// its Handler with Delivery.Recovered set; the ledger then counts it as
// recovered rather than delivered.

// Catchup limits, per device: memory grows with the conversations a device
// is in and the gaps open in them, never with uptime.
const (
	// maxCatchupConvs bounds the conversations a device keeps a place in;
	// a server that invents conversations gets no catch-up for the rest.
	maxCatchupConvs = 4096
	// maxConvGaps bounds the open gaps of one conversation. Past it the two
	// closest merge: the fetch then asks for more than is missing, never
	// for less.
	maxConvGaps = 16
	// MaxFetch is the most messages one fetch asks for; a longer gap is
	// fetched a page at a time.
	MaxFetch = 500
)

// Catchup is one device's place in each of its conversations: the highest
// server sequence it holds, the protocol's own marker of that position
// (Centrifugo's epoch, an archive id), and the gaps below it. It outlives
// the device's sessions, as a real client's local store does, so that a
// device that logs in again knows where to resume. Safe for concurrent
// use.
type Catchup struct {
	// grace is how long a gap stays open before it is fetched: a push
	// held back by reordering within it still arrives as a push.
	grace int64
	// retry is how long a fetch may go unanswered before it is asked
	// again.
	retry int64

	mu sync.Mutex
	// convs are the device's conversations in the order it first saw
	// them: a slice, scanned, since a device is in few of them and a map
	// of two cost an idle session about 300 bytes more (2026-12-04);
	// index finds them once there are more than convScan.
	convs []place
	index map[string]int
	// open counts the gaps of every conversation, so that the common case,
	// nothing missing, costs Due one load.
	open int
}

// place is one conversation's cursor, by its name.
type place struct {
	name string
	cursor
}

// convScan is how many conversations a device looks up by scanning them
// before it keeps an index.
const convScan = 8

type cursor struct {
	// known is set once the device has a place in the conversation: its
	// first message, or the server's word of where the conversation
	// stands (Behind).
	known bool
	seq   uint64
	// x is the marker and the gaps, nil until there is one: most
	// conversations of an idle device never have either, and the two
	// inline cost it 32 bytes a conversation (2026-12-06).
	x *cursorX
}

type cursorX struct {
	mark string
	gaps []gap
}

// ext returns cur's marker and gaps, making them.
func (cur *cursor) ext() *cursorX {
	if cur.x == nil {
		cur.x = &cursorX{}
	}
	return cur.x
}

// gaps returns cur's open gaps.
func (cur *cursor) gaps() []gap {
	if cur.x == nil {
		return nil
	}
	return cur.x.gaps
}

// gap is a span of sequences the device lacks: since is when it was seen
// to be missing, asked when it was last fetched (0: never).
type gap struct {
	lo, hi       uint64
	since, asked int64
}

// NewCatchup returns an empty Catchup whose gaps are fetched once they are
// grace old.
func NewCatchup(grace time.Duration) *Catchup {
	return &Catchup{grace: int64(grace), retry: max(4*int64(grace), int64(time.Second))}
}

// find returns the index of conv in c.convs, or -1. Comparing or indexing
// with string(conv) does not allocate.
func (c *Catchup) find(conv []byte) int {
	if c.index != nil {
		if i, ok := c.index[string(conv)]; ok {
			return i
		}
		return -1
	}
	for i := range c.convs {
		if c.convs[i].name == string(conv) {
			return i
		}
	}
	return -1
}

// lookup returns conv's cursor, nil if the device has no place in it.
// The pointer is good until the next conversation is added.
func (c *Catchup) lookup(conv string) *cursor {
	if i := c.find([]byte(conv)); i >= 0 {
		return &c.convs[i].cursor
	}
	return nil
}

// conv returns conv's cursor, creating it; nil past maxCatchupConvs. Only
// a new conversation allocates. The pointer is good until the next
// conversation is added.
func (c *Catchup) conv(conv []byte) *cursor {
	if i := c.find(conv); i >= 0 {
		return &c.convs[i].cursor
	}
	if len(c.convs) >= maxCatchupConvs {
		return nil
	}
	c.convs = append(c.convs, place{name: string(conv)})
	switch n := len(c.convs); {
	case c.index != nil:
		c.index[c.convs[n-1].name] = n - 1
	case n > convScan:
		c.index = make(map[string]int, n)
		for i := range c.convs {
			c.index[c.convs[i].name] = i
		}
	}
	return &c.convs[len(c.convs)-1].cursor
}

// Got records that the device now holds seq of conv, pushed or fetched, at
// now (Unix ns). A seq past the one after the highest held opens a gap
// for those between. The first seq seen of a conversation the device had
// no place in opens none: the device joined it there. It reports whether
// the device lacks anything now, so that a caller asks Due only then.
func (c *Catchup) Got(conv []byte, seq uint64, now int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A message without a seq says nothing of where the device stands.
	var cur *cursor
	if seq != 0 {
		cur = c.conv(conv)
	}
	switch {
	case cur == nil:
	case !cur.known:
		cur.known, cur.seq = true, seq
	case seq > cur.seq:
		if seq > cur.seq+1 {
			c.addGap(cur, cur.seq+1, seq-1, now)
		}
		cur.seq = seq
	default:
		c.fill(cur, seq, seq)
	}
	return c.open > 0
}

// Lacks reports whether the device lacks a message it knows of: a gap
// open, fetched or not. False for a nil Catchup (catch-up off).
func (c *Catchup) Lacks() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open > 0
}

// Behind records that the server's newest seq of conv is last (a login or
// sync answer): whatever lies above what the device holds is missing, and
// due once the grace has passed, like any other gap. The server counts a
// message in its seq the moment it accepts it, while the push is still on
// its way (queued, in another push instance, on the wire), so that a gap
// fetched at once turns every push in flight into a false recovery: 158 of
// 37,395 deliveries against a server that only jittered pushes by 0-20 ms
// (2026-12-04). at is when the server said so (Unix ns): a caller that
// holds an answer back until its pushes have had time to come passes the
// answer's own time. A conversation the device
// had no place in starts at last, 0 for one with nothing in it yet: a
// device catches up from its first login on, and what was sent before
// that is the server's offline delivery to measure, not the device's to
// fetch, unless the driver placed it lower first (Start). It reports
// whether it gave the device its place in conv (it had none).
func (c *Catchup) Behind(conv string, last uint64, at int64) (placed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.conv([]byte(conv))
	switch {
	case cur == nil:
	case !cur.known:
		cur.known, cur.seq = true, last
		return true
	case last > cur.seq:
		c.addGap(cur, cur.seq+1, last, at)
		cur.seq = last
	}
	return false
}

// Start gives the device its place in conv at seq, if it has none yet:
// everything above seq is then owed to it, and the next Behind or Got
// past seq+1 opens a gap. A device already placed is left as it is.
//
// Behind places a device new to a conversation at the newest seq, which
// leaves what was sent before its first login to the server's offline
// delivery. That reaches one of a user's devices only where the server
// queues per user (XMPP's offline storage, the reference server): a
// driver that knows where the conversation stood when its process first
// saw it starts a new device there, as a fresh install of a client
// fetches the conversation's recent history.
func (c *Catchup) Start(conv string, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.conv([]byte(conv)); cur != nil && !cur.known {
		cur.known, cur.seq = true, seq
	}
}

// Answered records that the server answered a fetch of conv after after
// with everything it holds up to upTo: what the device still lacks in
// (after, upTo] the server does not have for it, and is not asked again.
// The ledger counts it lost once lost_after has passed.
func (c *Catchup) Answered(conv string, after, upTo uint64) {
	if upTo <= after {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.lookup(conv); cur != nil {
		c.fill(cur, after+1, upTo)
	}
}

// Position returns the highest seq of conv the device holds and the
// protocol's marker set with it (see SetMark).
func (c *Catchup) Position(conv string) (seq uint64, mark string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.lookup(conv); cur != nil {
		if cur.x != nil {
			mark = cur.x.mark
		}
		return cur.seq, mark
	}
	return 0, ""
}

// SetMark keeps the protocol's own marker of the device's position in conv
// (Centrifugo's stream epoch, the id of the last archived message).
func (c *Catchup) SetMark(conv, mark string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.conv([]byte(conv)); cur != nil && (mark != "" || cur.x != nil) {
		cur.ext().mark = mark
	}
}

// Fetch is one range of one conversation to fetch: the messages with seq
// above After, at most N of them.
type Fetch struct {
	Conv  string
	After uint64
	N     int
}

// Due appends to dst the fetches of up to n gaps open for at least the
// grace and not asked for within the retry time, marks them asked at now,
// and returns dst. It is cheap when nothing is missing.
func (c *Catchup) Due(now int64, dst []Fetch, n int) []Fetch { return c.due(now, dst, n, false) }

// DueEach is Due with at most one fetch per conversation, for a server
// whose answer to a request of several ranges holds one list per
// conversation (OpenIM's PullMessageBySeqs keys its answer by
// conversation, so a second range of one replaces the first's messages).
// The conversation's other gaps come due at the next call.
func (c *Catchup) DueEach(now int64, dst []Fetch, n int) []Fetch { return c.due(now, dst, n, true) }

func (c *Catchup) due(now int64, dst []Fetch, n int, each bool) []Fetch {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == 0 {
		return dst
	}
	for k := range c.convs {
		conv, gaps := c.convs[k].name, c.convs[k].gaps()
		for i := range gaps {
			g := &gaps[i]
			if now-g.since < c.grace || (g.asked != 0 && now-g.asked < c.retry) {
				continue
			}
			if n--; n < 0 {
				return dst
			}
			g.asked = now
			dst = append(dst, Fetch{Conv: conv, After: g.lo - 1, N: int(min(g.hi-g.lo+1, MaxFetch))})
			if each {
				break
			}
		}
	}
	return dst
}

// Missing returns how many seqs the device lacks over all its
// conversations.
func (c *Catchup) Missing() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	for k := range c.convs {
		for _, g := range c.convs[k].gaps() {
			n += g.hi - g.lo + 1
		}
	}
	return n
}

// addGap opens [lo, hi] in cur, merging the two closest gaps past
// maxConvGaps.
func (c *Catchup) addGap(cur *cursor, lo, hi uint64, since int64) {
	x := cur.ext()
	x.gaps = append(x.gaps, gap{lo: lo, hi: hi, since: since})
	c.open++
	if len(x.gaps) <= maxConvGaps {
		return
	}
	j := 0
	for k := 1; k+1 < len(x.gaps); k++ {
		if x.gaps[k+1].lo-x.gaps[k].hi < x.gaps[j+1].lo-x.gaps[j].hi {
			j = k
		}
	}
	a, b := x.gaps[j], x.gaps[j+1]
	x.gaps[j] = gap{lo: a.lo, hi: b.hi, since: min(a.since, b.since)}
	x.gaps = append(x.gaps[:j+1], x.gaps[j+2:]...)
	c.open--
}

// fill removes [lo, hi] from cur's gaps, splitting a gap it falls inside.
func (c *Catchup) fill(cur *cursor, lo, hi uint64) {
	x := cur.x
	if x == nil {
		return // no gaps
	}
	for i := 0; i < len(x.gaps); i++ {
		g := x.gaps[i]
		if hi < g.lo || lo > g.hi {
			continue
		}
		switch {
		case lo <= g.lo && hi >= g.hi:
			x.gaps = append(x.gaps[:i], x.gaps[i+1:]...)
			c.open--
			i--
		case lo <= g.lo:
			x.gaps[i].lo = hi + 1
		case hi >= g.hi:
			x.gaps[i].hi = lo - 1
		default:
			// Inside: split in two, the upper half after the lower.
			up := g
			up.lo = hi + 1
			x.gaps[i].hi = lo - 1
			x.gaps = append(x.gaps, gap{})
			copy(x.gaps[i+2:], x.gaps[i+1:])
			x.gaps[i+1] = up
			c.open++
			i++
			if len(x.gaps) > maxConvGaps {
				// Merge back rather than forget: the fetch
				// re-asks a seq held, which the ledger
				// ignores, and loses nothing.
				x.gaps[i-1].hi = x.gaps[i].hi
				x.gaps = append(x.gaps[:i], x.gaps[i+1:]...)
				c.open--
				i--
			}
		}
	}
}
