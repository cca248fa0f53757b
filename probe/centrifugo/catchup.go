package centrifugo

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// Catch-up, with a device's probe.Catchup: the conversation is the channel
// and its sequence the publications' offsets, which Centrifugo numbers
// within an epoch. A device resubscribes with recovery from where it is
// (appendSubscribe), fetches the gaps Catchup finds with the history
// command (fetchDue, onFetch), and on Sync asks each channel's top with a
// history of limit 0 (onSync), to find a gap no later push would reveal.
//
// An epoch change means the stream was lost (a memory engine restarted,
// the channel's history expired): offsets start again, and what the
// device lacked of the old stream nobody can give it. Catchup's sequences
// must only grow, so the device's sequence of an offset is the offset plus
// a shift, raised at each new epoch so that the new stream's top lands
// just above where the device was; the shift is kept with the epoch in
// the Catchup's mark (streamMark).

// Catch-up limits, per session.
const (
	// historyPage is the most publications one history request asks
	// for: below Centrifugo's default client.history_max_publication_limit
	// (300), and 100 bodies of up to 40 KiB fit in a 4 MiB frame.
	historyPage = 100
	// maxFetches bounds the history fetches a session has in flight;
	// Catchup keeps the gaps beyond it due for later.
	maxFetches = 4
	// maxPages bounds the pages one Fetch is followed through at once: a
	// server that answers a page at a time (a lower
	// history_max_publication_limit) is asked the rest at the next retry.
	maxPages = 8
	// dueEvery is how often Serve asks Catchup what is due: a gap waits
	// for its grace anyway, and a session reading thousands of frames a
	// second need not lock the Catchup for each.
	dueEvery = 50 * time.Millisecond
)

// Centrifugo's error for a history since a position in another epoch, or
// one it no longer has (v6.9.1 ErrorUnrecoverablePosition).
const errUnrecoverablePosition = 112

// streamMark is what the device keeps as its Catchup mark of a channel: the
// channel's epoch, and the shift from the stream's offsets to the device's
// sequences (0 until a first epoch change).
type streamMark struct {
	epoch string
	shift uint64
}

// String encodes m for Catchup.SetMark: "SHIFT:EPOCH".
func (m streamMark) String() string {
	return strconv.FormatUint(m.shift, 10) + ":" + m.epoch
}

// parseMark decodes a mark that String encoded; ok is false for none.
func parseMark(s string) (m streamMark, ok bool) {
	shift, epoch, found := strings.Cut(s, ":")
	n, err := strconv.ParseUint(shift, 10, 64)
	if !found || err != nil || epoch == "" {
		return streamMark{}, false
	}
	return streamMark{epoch: epoch, shift: n}, true
}

// place returns where the device is in ch, as the offset and epoch to
// recover from; ok is false where it has no place yet.
func (s *session) place(ch string) (offset uint64, m streamMark, ok bool) {
	seq, mark := s.cu.Position(ch)
	m, ok = parseMark(mark)
	if !ok || seq < m.shift {
		return 0, streamMark{}, false
	}
	return seq - m.shift, m, true
}

// placed tells catch-up what a subscribe reply said of ch: the stream's
// epoch and top. A first subscription starts the device at the top; an
// epoch other than the device's is a lost stream (restart); in the same
// epoch the device is behind the top, once the recovered publications, if
// pending, are delivered (deliverRecovered calls behind then).
func (s *session) placed(ch, epoch string, top uint64, pending bool) {
	if s.cu == nil || epoch == "" {
		return
	}
	_, m, ok := s.place(ch)
	switch {
	case !ok:
		m = streamMark{epoch: epoch}
		s.cu.SetMark(ch, m.String())
		s.marks[ch] = m
		s.cu.Behind(ch, top, time.Now().UnixNano())
	case m.epoch != epoch:
		s.restart(ch, epoch, top)
	default:
		s.marks[ch] = m
		if !pending {
			s.behind(ch, epoch, top)
		}
	}
}

// behind tells catch-up that ch's newest offset is top, if the device is
// still in epoch.
func (s *session) behind(ch, epoch string, top uint64) {
	if s.cu == nil {
		return
	}
	if m, ok := s.marks[ch]; ok && m.epoch == epoch {
		s.cu.Behind(ch, top+m.shift, time.Now().UnixNano())
	}
}

// restart moves the device's place in ch to the top of a new stream: the
// old one was lost, and what the device lacked of it is asked for no more
// (the ledger counts it lost, by imcanary's own sequence, once lost_after
// has passed). What the new stream holds below its top the device does
// not fetch either, as a Centrifugo client that gets recovered:false does
// not: the server told it the history is gone.
func (s *session) restart(ch, epoch string, top uint64) {
	seq, _ := s.cu.Position(ch)
	next := seq + 1
	m := streamMark{epoch: epoch, shift: next - min(top, next)}
	s.cu.SetMark(ch, m.String())
	s.marks[ch] = m
	// top's sequence is next, or above it with a shift of 0: Got puts
	// the place there, and Answered closes every gap below it, old and
	// new alike.
	at := top + m.shift
	s.cu.Got([]byte(ch), at, time.Now().UnixNano())
	s.cu.Answered(ch, 0, at-1)
	delete(s.tops, ch)
	s.d.log.Debug("channel stream lost: catch-up moved to the new top", "user", s.user, "channel", ch,
		"epoch", epoch, "top", top, "had", seq)
}

// lost handles a stream lost under a live subscription, as a history or
// sync answer in another epoch shows: a gap by the server's own numbering,
// the position moved to the new stream, and catch-up restarted there.
func (s *session) lost(ch, epoch string, top uint64) {
	s.d.gaps.Add(1)
	st := s.st
	st.mu.Lock()
	if pos := st.pos[ch]; pos != nil && pos.known {
		pos.epoch, pos.offset = epoch, top
	}
	st.mu.Unlock()
	s.restart(ch, epoch, top)
}

// ownClient records the id Centrifugo gave this session, and takes the ids
// of the device's latest sessions (its own included) to tell its own
// publications by.
func (s *session) ownClient(id []byte) {
	if len(id) == 0 {
		return
	}
	st := s.st
	st.mu.Lock()
	st.clients = append(st.clients, string(id))
	if n := len(st.clients); n > maxClients {
		st.clients = slices.Delete(st.clients, 0, n-maxClients)
	}
	s.own = s.own[:0]
	for _, c := range st.clients {
		s.own = append(s.own, []byte(c))
	}
	st.mu.Unlock()
}

// ownEcho reports whether a publication with info.client client was
// published by this device (this session, or one of its latest).
func (s *session) ownEcho(client []byte) bool {
	if len(client) == 0 {
		return false
	}
	for _, c := range s.own {
		if bytes.Equal(c, client) {
			return true
		}
	}
	return false
}

// fetch is a history request in flight: a page of one probe.Fetch.
type fetch struct {
	ch string
	// after is the device's sequence the page asks above; mark is the
	// stream it asked in.
	after uint64
	mark  streamMark
	// limit is the page's; left is how many the Fetch still wants, this
	// page's included; pages counts the pages asked so far.
	limit, left, pages int
}

// fetchDue asks Catchup, at most every dueEvery, what the device should
// fetch, and sends a history request for each, as many as maxFetches
// allows. Serve's goroutine only.
func (s *session) fetchDue(now int64) error {
	if s.cu == nil || now < s.dueAt {
		return nil
	}
	s.dueAt = now + int64(dueEvery)
	s.pmu.Lock()
	free := maxFetches - len(s.fetches)
	s.pmu.Unlock()
	if free <= 0 {
		return nil
	}
	// Only as many as may be sent: the rest stay due, unasked, for
	// when a fetch in flight is answered.
	s.dues = s.cu.Due(now, s.dues[:0], free)
	for _, f := range s.dues {
		m, ok := s.marks[f.Conv]
		switch {
		case !ok:
			// Not a channel of this session (the plan changed): it
			// is asked again at the retry, and the ledger decides.
			continue
		case f.After < m.shift:
			// Below this stream: restart closed those gaps, so this
			// is a leftover; nobody has it.
			s.cu.Answered(f.Conv, f.After, m.shift)
			continue
		}
		if err := s.ask(&fetch{ch: f.Conv, after: f.After, mark: m, left: f.N}); err != nil {
			return err
		}
	}
	return nil
}

// ask sends the next page of f, unless maxFetches are in flight already
// (a page that follows another reuses its slot, so only then): f then
// waits for Catchup's retry.
func (s *session) ask(f *fetch) error {
	f.limit = min(f.left, historyPage)
	f.pages++
	id := s.newID()
	s.pmu.Lock()
	if len(s.fetches) >= maxFetches {
		s.pmu.Unlock()
		return nil
	}
	if s.fetches == nil {
		s.fetches = make(map[uint32]*fetch)
	}
	s.fetches[id] = f
	s.pmu.Unlock()
	b := append([]byte(`{"id":`), strconv.FormatUint(uint64(id), 10)...)
	b = append(b, `,"history":{"channel":`...)
	b = jsonscan.AppendString(b, f.ch)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, int64(f.limit), 10)
	b = append(b, `,"since":{"offset":`...)
	b = strconv.AppendUint(b, f.after-f.mark.shift, 10)
	b = append(b, `,"epoch":`...)
	b = jsonscan.AppendString(b, f.mark.epoch)
	b = append(b, "}}}"...)
	return s.write(b)
}

// onFetch handles the reply to a history page: each publication is
// delivered as recovered, and what the device still lacks in the range the
// page covered the server does not have (Answered). A full page that left
// some of the Fetch wanted is followed by the next at once, up to
// maxPages.
func (s *session) onFetch(f *fetch, m *msg, frame []byte, h probe.Handler) error {
	r := &m.res
	// A slot is free: what else is due is asked after this frame.
	s.dueAt = 0
	switch {
	case m.hasErr && m.errCode == errUnrecoverablePosition:
		// The stream is not the one asked about any more: its top and
		// epoch, asked now, say where it stands (onSync).
		return s.syncChannels([]string{f.ch})
	case m.hasErr:
		// History not allowed or not available in this namespace, or
		// the server failing: what was asked is not to be had. Not
		// asked again; the ledger counts it lost if nothing else
		// brings it.
		s.d.log.Debug("history refused", "user", s.user, "channel", f.ch, "code", m.errCode, "message", string(m.errMsg))
		s.cu.Answered(f.ch, f.after, f.after+uint64(f.left))
		return nil
	case string(r.epoch) != f.mark.epoch:
		s.lost(f.ch, string(r.epoch), r.offset)
		return nil
	}
	chb := []byte(f.ch)
	n, last := 0, f.after-f.mark.shift
	if r.pubsHi > r.pubsLo {
		err := parsePubs(frame[r.pubsLo:r.pubsHi], func(pb *pub) error {
			n++
			s.d.recovered.Add(1)
			last = max(last, pb.offset)
			s.onPub(chb, pb, h, true)
			return nil
		})
		if err != nil {
			return fmt.Errorf("history of %s: %w", f.ch, err)
		}
	}
	if n == 0 {
		// Nothing above the position asked from: all the stream
		// has up to its top is held.
		s.cu.Answered(f.ch, f.after, r.offset+f.mark.shift)
		return nil
	}
	upTo := last + f.mark.shift
	s.cu.Answered(f.ch, f.after, upTo)
	if n >= f.limit && f.left > n && last < r.offset && f.pages < maxPages {
		return s.ask(&fetch{ch: f.ch, after: upTo, mark: f.mark, left: f.left - n, pages: f.pages})
	}
	return nil
}

// Sync implements probe.Syncer: it asks the top of each of the session's
// channels (a history of limit 0), so that a gap at the end of a channel,
// with no later push to reveal it, is found. One round at a time: while
// the last is unanswered, Sync sends nothing.
func (s *session) Sync() error {
	if s.cu == nil || len(s.chans) == 0 {
		return nil
	}
	s.pmu.Lock()
	busy := len(s.syncs) > 0
	s.pmu.Unlock()
	if busy {
		return nil
	}
	return s.syncChannels(s.chans)
}

// syncChannels sends a history of limit 0 for each of chans, in one frame.
func (s *session) syncChannels(chans []string) error {
	var b []byte
	s.pmu.Lock()
	if s.syncs == nil {
		s.syncs = make(map[uint32]string)
	}
	for i, ch := range chans {
		if i > 0 {
			b = append(b, '\n')
		}
		id := s.newID()
		s.syncs[id] = ch
		b = append(b, `{"id":`...)
		b = strconv.AppendUint(b, uint64(id), 10)
		b = append(b, `,"history":{"channel":`...)
		b = jsonscan.AppendString(b, ch)
		b = append(b, `,"limit":0}}`...)
	}
	s.pmu.Unlock()
	return s.write(b)
}

// streamTop is a channel's top as a sync reply gave it, and when (Unix ns).
type streamTop struct {
	offset uint64
	at     int64
}

// onSync handles the answer to a sync of ch: the stream's epoch and top.
// Another epoch is a lost stream. In the same epoch, the top the previous
// sync gave is now applied (Catchup.Behind), not this one: what was
// published just before this answer may still be on its way as a push,
// and fetching it would only make an overlap. A sync period later it has
// arrived, or it is missing.
func (s *session) onSync(ch string, m *msg) error {
	if m.hasErr {
		// History off in the namespace: nothing to sync.
		s.d.log.Debug("sync refused", "user", s.user, "channel", ch, "code", m.errCode, "message", string(m.errMsg))
		return nil
	}
	r := &m.res
	mk, ok := s.marks[ch]
	switch {
	case len(r.epoch) == 0:
		return nil
	case !ok:
		s.placed(ch, string(r.epoch), r.offset, false)
		return nil
	case string(r.epoch) != mk.epoch:
		s.lost(ch, string(r.epoch), r.offset)
		return nil
	}
	now := time.Now().UnixNano()
	if prev, ok := s.tops[ch]; ok {
		// Dated when the server said it: its grace has passed.
		s.cu.Behind(ch, prev.offset+mk.shift, prev.at)
	}
	if s.tops == nil {
		s.tops = make(map[string]streamTop, len(s.chans))
	}
	s.tops[ch] = streamTop{offset: r.offset, at: now}
	// Due at once: a gap found here waited a sync period already.
	s.dueAt = 0
	return nil
}
