package refserver

import "slices"

// conversation is one conversation's state: its newest sequence number
// and the messages of it still kept. A direct conversation also names its
// two users, which is what membership of it means: the conversation id
// alone is ambiguous once a user name holds a colon.
type conversation struct {
	name string
	seq  uint64
	// a and b are a direct conversation's users, sorted; "" for a group.
	a, b string
	// hist holds the seqs [hist.front().seq, seq] without a hole: every
	// accepted message is appended and only the oldest are evicted.
	hist fifo[histEntry]
}

// histEntry is one kept message: its msg frame as pushed (shared with the
// deliveries, never modified) and the recipients the drop fault hid it
// from.
type histEntry struct {
	seq    uint64
	frame  []byte
	hidden []string
	// size is what the entry counts against history.maxBytes.
	size int64
}

const (
	// histOverhead is what one kept message counts against the byte cap
	// besides its frame: its 64-byte entry and 16-byte reference in the
	// eviction order (up to two of them, counting stale ones), each up to
	// four times over for the slack fifo allows its backing array.
	// Counting it keeps a flood of tiny messages bounded like any other.
	histOverhead = 384
	// hiddenOverhead is what each recipient a message is hidden from
	// counts besides its name.
	hiddenOverhead = 16
)

// firstKept is the oldest seq of c still kept, or c.seq+1 if none is.
func (c *conversation) firstKept() uint64 {
	if c.hist.len() == 0 {
		return c.seq + 1
	}
	return c.hist.front().seq
}

// histRef names a kept message in the order messages were kept.
type histRef struct {
	conv *conversation
	seq  uint64
}

// history is the bookkeeping shared by every conversation's kept
// messages: the per-conversation limit, the byte cap across all of them
// and the order in which they were kept, which is the order of eviction
// under the cap. It is guarded by Server.mu.
type history struct {
	// limit is the number of messages kept per conversation; 0 keeps
	// none.
	limit int
	// maxBytes caps bytes, the sum of the kept entries' sizes.
	maxBytes int64
	bytes    int64
	// live counts the kept entries.
	live int
	// order holds a reference per kept entry, oldest first, and stale
	// references to entries the per-conversation limit evicted, which
	// compact removes before they outnumber the live ones.
	order fifo[histRef]
	// evicted counts entries evicted, by either bound.
	evicted uint64
}

// add keeps frame as c's message seq, which must be c.seq, evicting the
// oldest beyond the bounds. With history off it does nothing.
func (h *history) add(c *conversation, seq uint64, frame []byte) {
	if h.limit <= 0 {
		return
	}
	e := histEntry{seq: seq, frame: frame, size: int64(len(frame)) + histOverhead}
	c.hist.push(e)
	h.bytes += e.size
	h.live++
	h.order.push(histRef{conv: c, seq: seq})
	for c.hist.len() > h.limit {
		h.evictFront(c)
	}
	h.trim()
}

// hide hides c's newest message from user's history answers, if it is
// still kept. Called right after add, as the deliveries are drawn.
func (h *history) hide(c *conversation, seq uint64, user string) {
	if c.hist.len() == 0 {
		return
	}
	e := c.hist.at(c.hist.len() - 1)
	if e.seq != seq {
		return
	}
	e.hidden = append(e.hidden, user)
	n := int64(len(user)) + hiddenOverhead
	e.size += n
	h.bytes += n
}

// evictFront drops c's oldest kept message.
func (h *history) evictFront(c *conversation) {
	e := c.hist.pop()
	h.bytes -= e.size
	h.live--
	h.evicted++
}

// trim evicts the oldest kept messages across all conversations until
// the byte cap holds, and compacts the eviction order.
func (h *history) trim() {
	for h.bytes > h.maxBytes && h.order.len() > 0 {
		r := h.order.pop()
		// Only the reference to a conversation's oldest entry is live:
		// references are in keeping order, and an older one of the same
		// conversation would have been popped first.
		if r.conv.hist.len() > 0 && r.conv.hist.front().seq == r.seq {
			h.evictFront(r.conv)
		}
	}
	if h.order.len() > 2*h.live+1024 {
		h.order.filter(func(r *histRef) bool {
			return r.conv.hist.len() > 0 && r.seq >= r.conv.hist.front().seq
		})
	}
}

// page returns up to limit frames of c's kept messages with seq above
// after that are not hidden from user, oldest first, and whether another
// such message follows the page.
func (c *conversation) page(user string, after uint64, limit int) (frames [][]byte, more bool) {
	n := c.hist.len()
	if n == 0 || after >= c.seq {
		return nil, false
	}
	i := 0
	if first := c.hist.front().seq; after >= first {
		i = int(after - first + 1)
	}
	for ; i < n; i++ {
		e := c.hist.at(i)
		if slices.Contains(e.hidden, user) {
			continue
		}
		if len(frames) == limit {
			return frames, true
		}
		frames = append(frames, e.frame)
	}
	return frames, false
}

// fifo is a queue on a slice with a moving head. Unlike reslicing, it
// lets go of the backing array's slack: pop compacts once the head passes
// half the slice and reallocates once the queue uses a quarter of the
// capacity, so the array stays within four times the queue's length (and
// nil when empty), whatever the queue's history.
type fifo[T any] struct {
	buf  []T
	head int
}

func (q *fifo[T]) len() int  { return len(q.buf) - q.head }
func (q *fifo[T]) front() *T { return &q.buf[q.head] }

// at returns the i-th element from the front.
func (q *fifo[T]) at(i int) *T { return &q.buf[q.head+i] }

func (q *fifo[T]) push(v T) { q.buf = append(q.buf, v) }

// pop removes and returns the front element; the queue must not be
// empty.
func (q *fifo[T]) pop() T {
	var zero T
	v := q.buf[q.head]
	q.buf[q.head] = zero // let go of what it references
	q.head++
	n := q.len()
	switch {
	case n == 0:
		q.buf, q.head = nil, 0
	case cap(q.buf) > 8 && n <= cap(q.buf)/4:
		q.buf, q.head = append(make([]T, 0, 2*n), q.buf[q.head:]...), 0
	case q.head > len(q.buf)/2:
		m := copy(q.buf, q.buf[q.head:])
		clear(q.buf[m:])
		q.buf, q.head = q.buf[:m], 0
	}
	return v
}

// filter keeps the elements for which keep is true, in order.
func (q *fifo[T]) filter(keep func(*T) bool) {
	var kept []T
	for i := q.head; i < len(q.buf); i++ {
		if keep(&q.buf[i]) {
			kept = append(kept, q.buf[i])
		}
	}
	q.buf, q.head = kept, 0
}
