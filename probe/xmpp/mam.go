package xmpp

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// Catch-up by message archive (XEP-0313, MAM). XMPP has no sequence per
// conversation, so a device's place in each archive it reads is the id of
// the newest archived message it holds, kept as the archive's mark in
// probe.Catchup: the user's own archive (direct messages, those it
// received and those its other devices sent) and each room's (groupchat).
//
// A session starts with every archive unsynced: it asks each for what came
// after its mark, a page at a time, and only once the archive says the
// answer is complete do the archive ids of pushed messages move the mark
// on. A push read before then, during the login or while the catch-up is
// under way, could have a gap before it that the query is there to find.
// Sync asks again after the mark, so that a message archived but never
// pushed, with nothing later pushed either, is found before lost_after.
//
// Prosody writes a message to the archive and pushes it to the online
// recipients in one step, and both go out on the recipient's stream in
// that order, so a query never fetches a message whose push is still on
// its way: what a catch-up brings that the device was pushed is an
// overlap, which the ledger ignores.
//
// A mark is "ID UNIX": the archive id and when (Unix seconds, our clock)
// the device held it. An archive that no longer has the id (a room
// destroyed with its last occupant and made again, an archive truncated
// or expired) answers item-not-found; the device then asks by time, from
// UNIX less markSkew. An archive empty when the device first asked keeps
// the mark " UNIX".

const (
	// mamPage is the page size asked for: Prosody's largest
	// (max_archive_query_results, 50 by default).
	mamPage = 50
	// maxQueries bounds the queries one session has in flight: a user
	// in many rooms does not flood the server, or its own read loop,
	// with pages at login.
	maxQueries = 4
	// maxPages bounds one catch-up of one archive: probe.MaxFetch
	// messages, then it stops where it got to and the next Sync goes
	// on from there.
	maxPages = probe.MaxFetch / mamPage
	// markSkew is how much earlier than the device's last message a
	// query by time starts: the archive stamps with the server's clock,
	// the mark with ours. What it fetches twice is an overlap.
	markSkew = time.Minute
	// staleSyncs is how many Syncs a query may go unanswered before it
	// is given up and asked again (at least two sync periods): a server
	// that drops a query must not stop the archive's catch-up for the
	// rest of the session, and one that is only slow must not have its
	// answers thrown away.
	staleSyncs = 3
	// queryPrefix starts the id of every archive query.
	queryPrefix = "mam-"
)

// catchup is one session's catch-up state. Its mutex is taken by Serve
// (results, answers, pushes) and by Sync, which runs on the population's
// goroutine; writes happen after it is released.
type catchup struct {
	cu   *probe.Catchup
	self string // the user's bare JID: its own archive

	mu       sync.Mutex
	archives []archive
	byJID    map[string]int
	byQuery  map[string]int
	queue    []int
	inflight int
	next     uint64
}

// archive is the session's state of one archive.
type archive struct {
	// jid is the archive's bare JID, lowercased: the conversation key in
	// probe.Catchup. room is false for the user's own.
	jid  string
	room bool
	// synced is set once a query of this session came back complete:
	// from then on a push's archive id is the device's place.
	synced bool
	queued bool
	// The query in flight: its id, what it asks (tail: the newest id
	// only; byTime: by time, the mark's id being gone), the pages of this
	// catch-up so far, and the Syncs it has waited through.
	qid    string
	tail   bool
	byTime bool
	after  string
	start  int64
	pages  int
	syncs  int
}

// newCatchup returns the catch-up state of a session of user self in
// rooms.
func newCatchup(cu *probe.Catchup, self string, rooms []string) *catchup {
	c := &catchup{cu: cu, self: strings.ToLower(self), byJID: map[string]int{}, byQuery: map[string]int{}}
	c.add(c.self, false)
	for _, r := range rooms {
		c.add(strings.ToLower(r), true)
	}
	return c
}

func (c *catchup) add(jid string, room bool) {
	if _, ok := c.byJID[jid]; ok {
		return
	}
	c.byJID[jid] = len(c.archives)
	c.archives = append(c.archives, archive{jid: jid, room: room})
}

// parseMark splits a mark into its id and time.
func parseMark(mark string) (id string, at int64, ok bool) {
	id, ts, found := strings.Cut(mark, " ")
	if !found {
		return "", 0, false
	}
	at, err := strconv.ParseInt(ts, 10, 64)
	return id, at, err == nil
}

func formatMark(id string, at int64) string {
	return id + " " + strconv.FormatInt(at, 10)
}

// syncAll queues a catch-up of every archive with none under way, gives up
// on queries unanswered for staleSyncs calls, and returns the queries to
// write. now is the time in Unix seconds.
func (c *catchup) syncAll(now int64) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.archives {
		a := &c.archives[i]
		if a.qid != "" {
			if a.syncs++; a.syncs < staleSyncs {
				continue
			}
			// Its answer, should it come, is ignored.
			delete(c.byQuery, a.qid)
			a.qid = ""
			c.inflight--
		}
		if !a.queued {
			a.queued = true
			c.queue = append(c.queue, i)
		}
	}
	return c.pump(now, nil)
}

// pump starts queued catch-ups while fewer than maxQueries are in flight,
// appending their queries to out. Called with c.mu held.
func (c *catchup) pump(now int64, out [][]byte) [][]byte {
	for c.inflight < maxQueries && len(c.queue) > 0 {
		i := c.queue[0]
		c.queue = c.queue[1:]
		a := &c.archives[i]
		a.queued = false
		_, mark := c.cu.Position(a.jid)
		id, at, ok := parseMark(mark)
		a.pages, a.tail, a.byTime, a.after, a.start = 0, !ok, false, id, 0
		switch {
		case !ok:
			// The device's first session: it starts at the newest
			// message, and until the archive says which that is, at
			// this time, so that should the session end first, the
			// next one fetches what came since instead of starting
			// again at the newest message of its own time.
			c.cu.SetMark(a.jid, formatMark("", now))
		case id == "":
			a.byTime, a.start = true, at-int64(markSkew/time.Second)
		}
		out = append(out, c.ask(i))
	}
	if len(c.queue) == 0 {
		// Keep the backing array from growing with every Sync.
		c.queue = c.queue[:0:0]
	}
	return out
}

// ask numbers a query of archive i as it now stands and returns it.
// Called with c.mu held.
func (c *catchup) ask(i int) []byte {
	a := &c.archives[i]
	if a.qid == "" {
		c.inflight++
	}
	c.next++
	a.qid, a.syncs = queryPrefix+strconv.FormatUint(c.next, 10), 0
	c.byQuery[a.qid] = i
	to := ""
	if a.room {
		to = a.jid
	}
	return mamQuery(nil, a.qid, to, a.after, a.start, a.tail)
}

// result checks an archive result: it answers a query in flight and comes
// from the archive asked. It returns the archive's JID, whether it is a
// room's, and whether the message is to be delivered (a tail query's is
// not: it only finds where the device starts).
func (c *catchup) result(st *stanza) (jid string, room, deliver bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.byQuery[st.mamQuery]
	if !ok {
		return "", false, false
	}
	a := &c.archives[i]
	if !c.from(a, st.from) {
		return "", false, false
	}
	return a.jid, a.room, !a.tail
}

// from reports whether from may speak for archive a: a room's results come
// from the room, the user's own from the user's account (Prosody leaves
// from unset).
func (c *catchup) from(a *archive, from string) bool {
	if a.room {
		return strings.EqualFold(from, a.jid)
	}
	return from == "" || strings.EqualFold(from, c.self)
}

// answered handles the iq that ends a query, a <fin/> or an error, at now
// (Unix seconds), and returns the queries to write next: the archive's
// next page, or another archive's catch-up.
func (c *catchup) answered(st *stanza, now int64) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.byQuery[st.id]
	if !ok || !c.from(&c.archives[i], st.from) {
		return nil
	}
	a := &c.archives[i]
	delete(c.byQuery, a.qid)
	last := string(st.rsmLast)
	switch {
	case st.typ == "error":
		if st.cond == "item-not-found" && !a.byTime && !a.tail && a.after != "" {
			// The archive no longer has the mark's id: ask by time.
			_, mark := c.cu.Position(a.jid)
			_, at, _ := parseMark(mark)
			a.byTime, a.after, a.start = true, "", at-int64(markSkew/time.Second)
			return [][]byte{c.ask(i)}
		}
		// Refused: the archive stays unsynced, and the next Sync asks
		// again.
		a.synced = false
	case st.typ != "result" || !st.fin:
		return nil
	case a.tail:
		// The newest id: the device starts here. An empty archive
		// leaves the mark at the time the device first asked.
		if last != "" {
			c.cu.SetMark(a.jid, formatMark(last, now))
		}
		a.synced = true
	default:
		a.pages++
		if last != "" {
			c.cu.SetMark(a.jid, formatMark(last, now))
		}
		switch {
		case st.finComplete:
			a.synced = true
		case last != "" && a.pages < maxPages:
			a.byTime, a.after, a.start = false, last, 0
			return [][]byte{c.ask(i)}
		default:
			// Stopped short: the next Sync goes on from the mark.
			a.synced = false
		}
	}
	a.qid = ""
	c.inflight--
	return c.pump(now, nil)
}

// pushed moves the device's place in archive jid to id, a message pushed
// to it at now (Unix seconds), if the archive is synced and no query of it
// is in flight.
func (c *catchup) pushed(jid, id string, now int64) {
	if id == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.byJID[jid]
	if !ok {
		// byJID holds lowercased JIDs; Prosody's are already.
		i, ok = c.byJID[strings.ToLower(jid)]
	}
	if !ok {
		return
	}
	if a := &c.archives[i]; a.synced && a.qid == "" {
		c.cu.SetMark(a.jid, formatMark(id, now))
	}
}
