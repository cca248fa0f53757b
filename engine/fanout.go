package engine

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Fan-out time: what the members of a large group feel is not the latency
// of one delivery but how long until the last of them has the message. Each
// group stream of this run times its recent messages here: the sender
// starts an entry with the number of member devices online, each first
// delivery or recovery by one of them counts down, and the last one
// observes the time from the intended send time.

// fanRing is how many recent messages of one group stream are timed. An
// entry whose message some device never gets stays until it is
// overwritten, fanRing messages later; at the rates of a population that is
// longer than lost_after, by which time the message is counted lost.
const fanRing = 32

type fanout struct {
	obs prometheus.Observer
	// key is the group stream's inbox key, and slow (ns) the fan-out time
	// above which an observation carries an exemplar naming its message.
	key  string
	slow int64
	gate *exemplarGate // shared by the size class's streams
	mu   sync.Mutex
	// ring is made by the stream's first message: a member who never
	// sends (an idle population) holds none.
	ring *[fanRing]fanEntry
}

type fanEntry struct {
	seq      uint64
	intended int64
	left     int32
}

// start begins timing seq, owed to n online member devices.
func (f *fanout) start(seq uint64, intended int64, n int) {
	f.mu.Lock()
	if f.ring == nil {
		f.ring = new([fanRing]fanEntry)
	}
	f.ring[seq%fanRing] = fanEntry{seq: seq, intended: intended, left: int32(n)}
	f.mu.Unlock()
}

// arrived counts one member device's first copy of seq at now (Unix ns).
func (f *fanout) arrived(seq uint64, now int64) {
	f.mu.Lock()
	if f.ring == nil {
		f.mu.Unlock()
		return
	}
	e := &f.ring[seq%fanRing]
	if e.seq != seq || e.left <= 0 {
		f.mu.Unlock()
		return
	}
	e.left--
	done, intended := e.left == 0, e.intended
	f.mu.Unlock()
	if !done {
		return
	}
	t := now - intended
	if eo, ok := f.obs.(prometheus.ExemplarObserver); ok && f.slow > 0 && t > f.slow && f.gate.allow(float64(t)/1e9, now) {
		eo.ObserveWithExemplar(float64(t)/1e9, exemplar(f.key, seq))
		return
	}
	f.obs.Observe(float64(t) / 1e9)
}
