package matrix

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
)

// syncKey is the device's /sync position in its probe.Catchup, beside
// its rooms' last events (keyed by room id, which starts with '!').
const syncKey = "\x00sync"

// sendSlotWait is how long Send waits for one of max_sends to come free
// before it fails: as long as a WebSocket write may block on a full
// socket.
const sendSlotWait = 5 * time.Second

// pageSize is the events one /messages page asks for.
const pageSize = 100

// pastMark is how many events past the device's last one a fill still
// takes. /messages orders a room by its event graph, /sync by arrival:
// two members' messages sent at once share a depth, and the one /sync
// gave second can come after the first in /messages, behind the mark a
// fill stops at (seen against Dendrite: a group message never filled, so
// counted lost). The ledger counts a fetched message the device already
// had as an overlap, not a duplicate, so taking a few more costs only
// their parsing; a room has no more messages at one depth than members
// sending at once.
const pastMark = 20

type session struct {
	d     *Driver
	conn  *longpoll.Conn
	user  string
	dev   int
	token string
	catch *probe.Catchup
	// since is the position of the next /sync.
	since string
	// resumed is set until the first answer of a session that resumed
	// from the device's saved position: what it carries, intended before
	// loginAt, arrived while the device was away.
	resumed bool
	loginAt int64

	// answers hands the sends' outcomes to Serve's handler.
	answers probe.Answers

	// Serve's own, on its goroutine.
	ans      syncAnswer
	page     messagesAnswer
	fetched  []event
	delivery probe.Delivery
	hdr      probe.Header
}

// Connect logs device dev of user in (with the token it had, or a new
// login) and finds where its /sync starts: the device's saved position
// when catch-up is on and it has one, else the server's present, which an
// initial sync (timeout 0) returns before Connect does, so that every
// message sent once the session counts online comes after it.
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.RequestTimeout)
	defer cancel()
	s := &session{d: d, user: user, dev: dev.Index, catch: dev.Catchup}
	if s.catch != nil {
		_, s.since = s.catch.Position(syncKey)
	}
	for attempt := 0; ; attempt++ {
		tok, err := d.deviceToken(ctx, dev.Link, user, dev.Index)
		if err != nil {
			return nil, fmt.Errorf("login %s: %w", user, err)
		}
		s.token = tok
		if s.since != "" {
			s.resumed = true
			break
		}
		err = s.initialSync(ctx, dev.Link)
		if err == nil {
			break
		}
		if statusOf(err) == http.StatusUnauthorized && attempt == 0 {
			// The token kept from an earlier session is no longer
			// valid (a logout, an expiry): log in again, once.
			d.setToken(user, dev.Index, "")
			continue
		}
		if statusOf(err) == http.StatusUnauthorized || statusOf(err) == http.StatusForbidden {
			err = probe.Unauthorized(err)
		}
		return nil, fmt.Errorf("login %s: %w", user, err)
	}
	s.loginAt = time.Now().UnixNano()
	s.conn = d.pool.NewConn(ctx, dev.Link)
	return s, nil
}

// initialSync asks for the server's present without waiting, and keeps
// its position and each room's last event: the past it shows was sent
// before this device was online.
func (s *session) initialSync(ctx context.Context, link probe.Link) error {
	req, err := s.syncRequest(ctx, 0)
	if err != nil {
		return err
	}
	r, err := s.d.pool.Do(req, link)
	if err != nil {
		return err
	}
	if err := decodeAnswer(r, http.MethodGet, "/sync", nil); err != nil {
		return err
	}
	if err := decodeSync(r.Body, &s.ans); err != nil {
		return err
	}
	if s.catch != nil {
		for id, jr := range s.ans.Rooms.Join {
			if ev := jr.Timeline.Events; len(ev) > 0 {
				s.catch.SetMark(id, ev[len(ev)-1].EventID)
			}
		}
	}
	s.setSince(s.ans.NextBatch)
	return nil
}

func (s *session) setSince(next string) {
	s.since = next
	if s.catch != nil {
		s.catch.SetMark(syncKey, next)
	}
}

// syncRequest is the next /sync, held by the server up to timeout.
func (s *session) syncRequest(ctx context.Context, timeout time.Duration) (*http.Request, error) {
	q := url.Values{"filter": {s.d.filter}, "timeout": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	if s.since != "" {
		q.Set("since", s.since)
	}
	return s.d.request(ctx, http.MethodGet, "/_matrix/client/v3/sync", q, s.token, nil)
}

// Serve implements probe.Session.
func (s *session) Serve(h probe.Handler) error {
	s.answers.Serve(h)
	return s.conn.Serve(s)
}

// Next implements longpoll.Protocol: a resumed session's first poll asks
// for what it missed without waiting.
func (s *session) Next(ctx context.Context) (*http.Request, time.Duration, error) {
	timeout := s.d.cfg.PollTimeout
	if s.resumed {
		timeout = 0
	}
	req, err := s.syncRequest(ctx, timeout)
	return req, timeout, err
}

// Answer implements longpoll.Protocol.
func (s *session) Answer(r *longpoll.Response) error {
	switch {
	case r.Status == http.StatusUnauthorized:
		// Dropped, so that the reconnect logs in again.
		s.d.setToken(s.user, s.dev, "")
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Err: fmt.Errorf("/sync: %w", answerError(r))}
	case r.Status == http.StatusTooManyRequests:
		err := answerError(r)
		probe.Sleep(s.conn.Context(), retryAfter(err, 3))
		return nil
	case r.Status < 200 || r.Status > 299:
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("/sync: %w", answerError(r))}
	}
	if err := decodeSync(r.Body, &s.ans); err != nil {
		return err
	}
	h := s.answers.Handler()
	for id, jr := range s.ans.Rooms.Join {
		if err := s.timeline(h, id, &jr.Timeline, r.At); err != nil {
			return err
		}
	}
	s.resumed = false
	s.setSince(s.ans.NextBatch)
	return nil
}

// timeline delivers one room's new events, after filling what a limited
// timeline left out when catch-up is on.
func (s *session) timeline(h probe.Handler, roomID string, tl *timeline, at int64) error {
	rm, ok := s.d.roomInfo(roomID)
	if !ok {
		s.d.unmatched.Add(uint64(len(tl.Events)))
		return nil
	}
	if tl.Limited && s.catch != nil && tl.PrevBatch != "" {
		if err := s.fill(h, roomID, rm, tl.PrevBatch); err != nil {
			return err
		}
	}
	for i := range tl.Events {
		ev := &tl.Events[i]
		s.deliver(h, rm, ev, s.resumed && s.intendedBefore(ev, s.loginAt), at)
	}
	if n := len(tl.Events); n > 0 && s.catch != nil {
		s.catch.SetMark(roomID, tl.Events[n-1].EventID)
	}
	return nil
}

// fill pages back through roomID's history from prev_batch, newest first,
// to the last event the device had and pastMark events beyond it (or the
// room's start, or catchup_pages pages), and delivers what it fetched,
// oldest first, as recovered.
func (s *session) fill(h probe.Handler, roomID string, rm room, from string) error {
	_, stop := s.catch.Position(roomID)
	s.fetched = s.fetched[:0]
	var at int64
	path := "/_matrix/client/v3/rooms/" + url.PathEscape(roomID) + "/messages"
	// past counts the events taken beyond the mark, -1 until it is met.
	past := -1
pages:
	// catchup_pages pages to find the mark, and one more to take the
	// events past it that the mark's page ended before.
	for page := 0; page < s.d.cfg.CatchupPages || (past >= 0 && page == s.d.cfg.CatchupPages); page++ {
		q := url.Values{"dir": {"b"}, "from": {from}, "limit": {strconv.Itoa(pageSize)}, "filter": {messagesFilter}}
		r, err := s.get(path, q)
		if err != nil {
			return err
		}
		if err := decodeAnswer(r, http.MethodGet, "/messages", nil); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
		}
		if err := decodeMessages(r.Body, &s.page); err != nil {
			return err
		}
		at = r.At
		for _, ev := range s.page.Chunk {
			switch {
			case past >= pastMark:
				break pages
			case past >= 0:
				past++
			case stop != "" && ev.EventID == stop:
				past = 0
				continue
			}
			s.fetched = append(s.fetched, ev)
		}
		if len(s.page.Chunk) == 0 || s.page.End == "" || s.page.End == from {
			break
		}
		from = s.page.End
	}
	for i := len(s.fetched) - 1; i >= 0; i-- {
		s.deliver(h, rm, &s.fetched[i], true, at)
	}
	if cap(s.fetched) > 4*pageSize {
		s.fetched = nil
	}
	return nil
}

// get makes a GET beside the poll, within the request timeout.
func (s *session) get(path string, q url.Values) (*longpoll.Response, error) {
	ctx, cancel := context.WithTimeout(s.conn.Context(), s.d.opts.RequestTimeout)
	defer cancel()
	req, err := s.d.request(ctx, http.MethodGet, path, q, s.token, nil)
	if err != nil {
		return nil, err
	}
	return s.conn.Do(req)
}

// intendedBefore reports whether ev carries a probe body intended before
// t (Unix ns).
func (s *session) intendedBefore(ev *event, t int64) bool {
	return probe.ParseBody([]byte(ev.Content.Body), &s.hdr) == nil && s.hdr.Intended < t
}

// deliver hands one event to h.
func (s *session) deliver(h probe.Handler, rm room, ev *event, recovered bool, at int64) {
	if ev.Type != "m.room.message" || ev.Content.Body == "" {
		s.d.unmatched.Add(1)
		return
	}
	from := ev.Sender
	if i := strings.IndexByte(from, ':'); strings.HasPrefix(from, "@") && i > 0 {
		from = from[1:i]
	}
	d := &s.delivery
	*d = probe.Delivery{From: []byte(from), Group: rm.group, Body: []byte(ev.Content.Body), Recovered: recovered, At: at}
	h.OnDelivery(d)
}

// Send implements probe.Session: the PUT goes out on a goroutine of the
// session's, so that sending never waits for the server; its answer is
// the ack.
func (s *session) Send(m *probe.Message) error {
	roomID, ok := s.d.roomOf(s.user, m)
	if !ok {
		return fmt.Errorf("matrix: no room for the message from %s (group %q, to %q): not provisioned", s.user, m.Group, m.To)
	}
	// Encoded now: m.Body is the caller's again once Send returns.
	payload, err := json.Marshal(struct {
		MsgType string `json:"msgtype"`
		Body    string `json:"body"`
	}{"m.text", string(m.Body)})
	if err != nil {
		return err
	}
	t := time.NewTimer(sendSlotWait)
	defer t.Stop()
	select {
	case s.d.sends <- struct{}{}:
	case <-t.C:
		return fmt.Errorf("matrix: %d sends in flight (max_sends) for %s", cap(s.d.sends), sendSlotWait)
	case <-s.conn.Context().Done():
		return errors.New("matrix: session closed")
	}
	ref := m.Ref
	txn := s.d.nonce + "." + strconv.FormatUint(ref, 10)
	path := "/_matrix/client/v3/rooms/" + url.PathEscape(roomID) + "/send/m.room.message/" + txn
	if !s.conn.Go(func(ctx context.Context) {
		defer func() { <-s.d.sends }()
		s.put(ctx, ref, path, payload)
	}) {
		<-s.d.sends
		return errors.New("matrix: session closed")
	}
	return nil
}

// put sends one message, retrying with the same transaction id while the
// server gives no answer, or a 5xx or 429; a session that ends meanwhile
// reports nothing (the population writes its sends off).
func (s *session) put(ctx context.Context, ref uint64, path string, payload []byte) {
	var err error
	for attempt := 0; ; attempt++ {
		var r *longpoll.Response
		r, err = s.attempt(ctx, path, payload)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			if r.Status >= 200 && r.Status <= 299 {
				var out struct {
					EventID string `json:"event_id"`
				}
				if json.Unmarshal(r.Body, &out) != nil || out.EventID == "" {
					s.answers.Report(probe.Answer{Ref: ref, Reject: "answer without event_id"})
					return
				}
				s.answers.Report(probe.Answer{Ref: ref, ServerID: out.EventID})
				return
			}
			err = answerError(r)
			if r.Status != http.StatusTooManyRequests && r.Status < 500 {
				if r.Status == http.StatusUnauthorized {
					s.d.setToken(s.user, s.dev, "")
				}
				code := errcodeOf(err)
				if code == "" {
					code = "HTTP " + strconv.Itoa(r.Status)
				}
				s.answers.Report(probe.Answer{Ref: ref, Reject: code})
				return
			}
		}
		if attempt >= s.d.cfg.SendRetries {
			break
		}
		s.d.retries.Add(1)
		// Logged because a retry is where a server that does not keep
		// its transaction ids stores one message twice.
		s.d.log.Debug("matrix: send retried", "user", s.user, "attempt", attempt+1, "err", err)
		probe.Sleep(ctx, retryAfter(err, attempt))
		if ctx.Err() != nil {
			return
		}
	}
	s.answers.Report(probe.Answer{Ref: ref, Err: err})
}

// attempt makes one PUT of a send, within the request timeout.
func (s *session) attempt(ctx context.Context, path string, payload []byte) (*longpoll.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, s.d.opts.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.d.base+path, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	return s.conn.Do(req)
}

// Ping implements probe.Session. A long-poll session keeps itself alive:
// the poll in flight is its heartbeat, bounded by poll_timeout.
func (s *session) Ping() error { return nil }

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session.
func (s *session) Close() error { return s.conn.Close() }
