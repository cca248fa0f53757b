package jsonws

// Catch-up over a mapping: the server seqs a session saw (holes, for the
// server-side gap count), the history requests it makes of Catchup's due
// fetches, and the sync that asks the server where each conversation
// stands.

import (
	"fmt"
	"slices"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// fetch is one history request in flight.
type fetch struct {
	id    uint64
	conv  string
	after uint64
	n     int
	got   uint64
}

// maxAsked bounds the history requests a session has in flight.
const maxAsked = 16

// hole is a span of a conversation's server seqs a session has not seen
// though it saw one after them, since when.
type hole struct {
	conv   string
	lo, hi uint64
	since  int64
}

// Holes are counted as the server's gaps only once they stayed open for
// holeGrace: an ack of the session's own message may come after a later
// delivery of the same conversation, and a reordered push after the next
// one. maxHoles bounds what a session tracks; past it a hole counts at
// once.
const (
	holeGrace = int64(time.Second)
	maxHoles  = 64
)

// fillHole removes seq of conv from the session's holes.
func (s *session) fillHole(conv []byte, seq uint64) {
	for i := 0; i < len(s.holes); i++ {
		h := &s.holes[i]
		if h.conv != string(conv) || seq < h.lo || seq > h.hi {
			continue
		}
		switch {
		case h.lo == h.hi:
			s.holes = append(s.holes[:i], s.holes[i+1:]...)
		case seq == h.lo:
			h.lo++
		case seq == h.hi:
			h.hi--
		case len(s.holes) < maxHoles:
			up := *h
			up.lo, h.hi = seq+1, seq-1
			s.holes = append(s.holes, up)
		default:
			// No room to split: the seq found stays counted.
		}
		return
	}
}

// settleHoles counts the holes open for holeGrace at now (all of them,
// with now 0) as gaps in the server's numbering.
func (s *session) settleHoles(now int64) {
	n := 0
	for _, h := range s.holes {
		if now != 0 && now-h.since < holeGrace {
			s.holes[n] = h
			n++
			continue
		}
		s.d.gaps.Add(1)
		s.d.missed.Add(h.hi - h.lo + 1)
	}
	s.holes = s.holes[:n]
}

// sawSeq checks seq of conv against the last the session saw: a jump is
// a gap in the server's own numbering.
func (s *session) sawSeq(conv []byte, seq uint64) {
	if s.lastSeq == nil {
		return
	}
	last, known := s.lastSeq[string(conv)]
	switch {
	case !known && len(s.lastSeq) < maxSeqConvs:
		s.lastSeq[string(conv)] = seq
	case known && seq > last:
		if seq > last+1 {
			if len(s.holes) < maxHoles {
				s.holes = append(s.holes, hole{conv: string(conv), lo: last + 1, hi: seq - 1, since: s.at})
			} else {
				s.d.gaps.Add(1)
				s.d.missed.Add(seq - last - 1)
			}
		}
		s.lastSeq[string(conv)] = seq
	case known && len(s.holes) > 0:
		s.fillHole(conv, seq)
	}
}

// fetchOf returns the history request in flight whose range holds seq of
// conv, or -1.
func (s *session) fetchOf(conv []byte, seq uint64) int {
	for i := range s.asked {
		f := &s.asked[i]
		if f.conv == string(conv) && seq > f.after && seq <= f.after+uint64(f.n) {
			return i
		}
	}
	return -1
}

func (s *session) findAsked(id uint64) int {
	for i, f := range s.asked {
		if f.id == id {
			return i
		}
	}
	return -1
}

// fetchDue asks for every gap of the device that is due, within maxAsked.
func (s *session) fetchDue(now int64) error {
	if len(s.asked) >= maxAsked {
		return nil
	}
	s.due = s.cu.Due(now, s.due[:0], maxAsked-len(s.asked))
	for _, f := range s.due {
		f.N = min(f.N, s.d.m.limit)
		if err := s.ask(f); err != nil {
			return err
		}
	}
	return nil
}

// ask writes one history request.
func (s *session) ask(f probe.Fetch) error {
	e := *s.env
	e.id, e.conv, e.after, e.limit = s.newID(), f.Conv, f.After, uint64(f.N)
	b, err := s.d.m.fetch.render(s.wbuf[:0], &e)
	if err != nil {
		return err
	}
	s.wbuf = b
	s.asked = append(s.asked, fetch{id: e.id, conv: f.Conv, after: f.After, n: f.N})
	if s.tracing() {
		s.trace("send", "catch_up.fetch", string(b))
	}
	return s.conn.Write(b)
}

// answeredFetch closes the history request at i: the server sent what it
// holds in the range. A full page means there may be more: the rest of
// the range is asked at once.
func (s *session) answeredFetch(i int, m *msg) error {
	if ld := s.d.m.done.list; ld != nil {
		if v := m.vals[ld.slot]; v.kind == kindArray {
			f := &s.asked[i]
			err := s.deliverList(ld, v.b, []byte(f.conv), s.isGroupConv(f.conv), func(seq uint64) { f.got = max(f.got, seq) })
			if err != nil {
				return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("history of %s: %w", f.conv, err)}
			}
		}
	}
	f := s.asked[i]
	s.asked = append(s.asked[:i], s.asked[i+1:]...)
	if f.got >= f.after+uint64(f.n) {
		s.cu.Answered(f.conv, f.after, f.got)
		return nil
	}
	upTo := f.after + uint64(f.n)
	if s.d.m.done.last >= 0 {
		if last, ok := m.vals[s.d.m.done.last].uint(); ok && last > f.got && last < upTo {
			// The server holds up to last: what it did not send of
			// (after, last] it does not have for this device.
			upTo = last
		}
	}
	s.cu.Answered(f.conv, f.after, max(upTo, f.got))
	return nil
}

// isGroupConv reports whether conv is one of the user's groups, by its
// catch_up name.
func (s *session) isGroupConv(conv string) bool {
	return slices.Index(s.convs, conv) >= s.nDirect
}

// maxSyncs bounds the newest-seq requests a session keeps waiting for: a
// server that never answers them must not grow the list.
const maxSyncs = 4

// Sync implements probe.Syncer: it asks the server for the newest seq of
// each of the user's conversations (catch_up.newest), and the answer
// opens a gap wherever the device is behind.
func (s *session) Sync() error {
	nw := s.d.m.newest
	if s.cu == nil || nw.send == nil {
		return nil
	}
	e := *s.env
	e.id = s.newID()
	reply, err := nw.reply.bind(&e)
	if err != nil {
		return err
	}
	b, err := nw.send.render(nil, &e)
	if err != nil {
		return fmt.Errorf("catch_up.newest.send: %w", err)
	}
	s.pmu.Lock()
	if len(s.syncs) == maxSyncs {
		s.syncs = s.syncs[1:]
	}
	s.syncs = append(s.syncs, reply)
	s.nsyncs.Store(int32(len(s.syncs)))
	s.pmu.Unlock()
	if s.tracing() {
		s.trace("send", "catch_up.newest.send", string(b))
	}
	return s.conn.Write(b)
}

// synced handles m if it answers a newest-seq request.
func (s *session) synced(m *msg) bool {
	s.pmu.Lock()
	i := slices.IndexFunc(s.syncs, func(r *rule) bool { return r.match(m) })
	if i >= 0 {
		s.syncs = slices.Delete(s.syncs, i, i+1)
		s.nsyncs.Store(int32(len(s.syncs)))
	}
	s.pmu.Unlock()
	if i < 0 {
		return false
	}
	v := m.vals[s.d.m.newest.convs]
	if el := s.d.m.newest.elem; el != nil {
		s.syncedList(el, v)
	} else if v.kind == kindObject {
		s.syncedObject(v)
	}
	// A conversation the server lists none of yet still has its place
	// from now: its first message is then owed, and fetched if missed.
	for _, c := range s.convs {
		s.cu.Behind(c, 0, s.at)
	}
	s.lacking = true
	return true
}

// syncedList reads a list of objects each naming a conversation and its
// newest seq (Tinode's subscriptions).
func (s *session) syncedList(el *decoder, v value) {
	if v.kind != kindArray {
		return
	}
	// A malformed element ends the list: what came before it stands.
	_ = el.eachElem(v.b, el.newMsg(), func(em *msg) {
		if seq, ok := em.vals[1].uint(); ok && em.vals[0].kind == kindString {
			s.cu.Behind(string(em.vals[0].b), seq, s.at)
		}
	})
}

// syncedObject reads an object of conversation to newest seq.
func (s *session) syncedObject(v value) {
	p := jsonscan.Scanner{B: v.b}
	if p.Open() != nil {
		return
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			break
		}
		last, err := p.Uint()
		if err != nil {
			break
		}
		s.cu.Behind(string(key), last, s.at)
	}
}
