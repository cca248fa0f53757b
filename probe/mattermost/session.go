package mattermost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// sendSlotWait bounds how long Send waits for one of max_sends.
const sendSlotWait = 5 * time.Second

// sinceSlack is how far before the newest post a device has its catch-up
// fetch starts. A post's create_at is taken before it is stored and
// published, so a post can reach a connection after a newer one by as
// long as storing it took: under load, seconds. A send waits
// requestTimeout for its answer, which bounds it. What the fetch brings
// twice is counted once (ignored as caught up).
const sinceSlack = int64(requestTimeout / time.Millisecond)

type session struct {
	d     *Driver
	conn  *wsconn.Conn
	user  string
	dev   int
	token string
	pos   *position
	// catchUp is target.catch_up; resuming says this session asked the
	// server to resume the device's connection.
	catchUp, resuming bool
	// loginAt (Unix ns) is when the upgrade was answered: a replayed
	// event intended before it was queued while the device was away.
	loginAt int64

	// ctx ends with the session; sends run under it, counted by wg, and
	// Serve waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wmu    sync.Mutex
	done   bool
	wg     sync.WaitGroup

	// answers hands the posts' outcomes to Serve's handler.
	answers probe.Answers

	// Serve's own, on its goroutine.
	connID   string
	next     int64
	hello    bool
	frame    wsFrame
	post     post
	hdr      probe.Header
	delivery probe.Delivery
	list     postList
}

// wsFrame is one frame from the server: an event (event, seq, data,
// broadcast) or the reply to an action of the client's (status,
// seq_reply).
//
// The data of every event is decoded into one struct, in the same pass
// as the frame: the only fields imcanary reads are a posted event's post
// and a hello's connection_id, and a second pass over data would cost a
// third of the decoding.
type wsFrame struct {
	Event string    `json:"event"`
	Seq   *int64    `json:"seq"`
	Data  eventData `json:"data"`
}

// eventData is what imcanary reads of an event's data: a posted event's
// post, JSON inside a string, and a hello's connection_id.
type eventData struct {
	Post         string `json:"post"`
	ConnectionID string `json:"connection_id"`
}

// Connect logs device dev of user in (a token it had is used again) and
// opens its WebSocket, authenticated on the upgrade. A fresh connection is
// logged in once its hello comes; a resumed one (catch-up on, a position
// kept) at once, since the server replays what it queued without a hello
// and sends nothing when nothing was missed.
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	d.mu.RLock()
	_, ok := d.ids[user]
	d.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("mattermost: user %q was not provisioned", user)
	}
	tok, err := d.deviceToken(ctx, dev.Link, user, dev.Index)
	if err != nil {
		return nil, fmt.Errorf("login %s: %w", user, err)
	}
	s := &session{d: d, user: user, dev: dev.Index, token: tok, pos: d.position(user, dev.Index), catchUp: dev.Catchup != nil}
	st := *d.ws
	st.Header = d.ws.Header.Clone()
	if st.Header == nil {
		st.Header = http.Header{}
	}
	st.Header.Set("Authorization", "Bearer "+tok)
	connID, next, _ := s.pos.get()
	if s.catchUp && connID != "" {
		s.resuming, s.connID, s.next = true, connID, next
		st.URL += "?" + url.Values{"connection_id": {connID}, "sequence_number": {strconv.FormatInt(next, 10)}}.Encode()
	}
	s.conn, err = wsconn.Open(ctx, &st, dev.Link, user, func(c *wsconn.Conn) error {
		s.conn = c
		s.loginAt = time.Now().UnixNano()
		if s.resuming {
			return nil
		}
		bp, at, err := c.Read(st.DialTimeout)
		if err != nil {
			return fmt.Errorf("waiting for hello: %w", err)
		}
		defer wsconn.Release(bp)
		if err := s.read(*bp, at, nil); err != nil {
			return err
		}
		if !s.hello {
			return fmt.Errorf("%q event before hello", s.frame.Event)
		}
		return nil
	})
	if err != nil {
		if fe, ok := errors.AsType[*probe.ConnectError](err); ok && fe.Reason == metrics.ConnectUnauthorized {
			// The token expired or was revoked: the next connect logs in.
			d.setToken(user, dev.Index, "")
		}
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// read handles one frame. h is nil during the login, which reads only the
// hello.
func (s *session) read(b []byte, at int64, h probe.Handler) error {
	f := &s.frame
	*f = wsFrame{}
	if err := json.Unmarshal(b, f); err != nil {
		return err
	}
	if f.Event == "" {
		// A reply to an action; imcanary sends none but pings.
		return nil
	}
	if f.Seq == nil {
		return fmt.Errorf("%q event without seq", f.Event)
	}
	seq := *f.Seq
	lost := false
	switch {
	case f.Event == "hello":
		if f.Data.ConnectionID == "" {
			return errors.New("hello without connection_id")
		}
		// A hello on a connection that had one, or on a resume, is the
		// server starting over: what it had queued is gone.
		lost = s.hello || s.resuming
		s.hello, s.connID = true, f.Data.ConnectionID
	case seq > s.next:
		s.d.gaps.Add(1)
		s.d.missed.Add(uint64(seq - s.next))
		lost = true
	}
	if seq >= s.next || f.Event == "hello" {
		s.next = seq + 1
	}
	s.savePosition(0)
	if lost && s.catchUp && h != nil {
		if err := s.fetch(h); err != nil {
			return err
		}
	}
	if f.Event != "posted" || h == nil {
		return nil
	}
	s.post = post{}
	if err := json.Unmarshal([]byte(f.Data.Post), &s.post); err != nil {
		return fmt.Errorf("posted: its post: %w", err)
	}
	recovered := s.resuming && probe.ParseBody([]byte(s.post.Message), &s.hdr) == nil && s.hdr.Intended < s.loginAt
	s.deliver(h, &s.post, recovered, at)
	return nil
}

// savePosition records where the connection stands for the device's next
// session, and since, the create_at of a post it got, if newer.
func (s *session) savePosition(since int64) {
	p := s.pos
	p.mu.Lock()
	p.connID, p.next = s.connID, s.next
	p.since = max(p.since, since)
	p.mu.Unlock()
}

// deliver hands one post to h.
func (s *session) deliver(h probe.Handler, p *post, recovered bool, at int64) {
	rm, from, ok := s.d.lookup(p.ChannelID, p.UserID)
	if !ok || p.Type != "" || p.Message == "" {
		// A system post (a user joined), or one of a channel or user
		// imcanary did not make.
		s.d.unmatched.Add(1)
		return
	}
	s.savePosition(p.CreateAt)
	d := &s.delivery
	*d = probe.Delivery{From: []byte(from), Group: rm.group, Body: []byte(p.Message), Recovered: recovered, At: at}
	h.OnDelivery(d)
}

// fetch gets each of the user's channels' posts since just before the
// newest the device had, oldest first, as recovered: what the server's
// queue no longer held.
func (s *session) fetch(h probe.Handler) error {
	_, _, since := s.pos.get()
	if since == 0 {
		// The device never had a post: from when it logged in.
		since = s.loginAt / 1e6
	}
	since -= sinceSlack
	for _, ch := range s.d.channelsOf(s.user) {
		q := url.Values{"since": {strconv.FormatInt(since, 10)}}
		s.list = postList{}
		r, err := s.d.call(s.fetchContext(), probe.Link{}, http.MethodGet, "/api/v4/channels/"+ch+"/posts", q, s.token, nil, &s.list)
		if err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("catch-up: %w", err)}
		}
		ps := make([]*post, 0, len(s.list.Posts))
		for _, p := range s.list.Posts {
			ps = append(ps, p)
		}
		slices.SortFunc(ps, func(a, b *post) int { return int(a.CreateAt - b.CreateAt) })
		if n := s.d.cfg.CatchupPosts; len(ps) > n {
			ps = ps[len(ps)-n:]
		}
		for _, p := range ps {
			s.deliver(h, p, true, r.At)
		}
		s.d.fetched.Add(uint64(len(ps)))
	}
	return nil
}

// fetchContext is the session's context, which Close ends; a session
// being read in a test before Connect finished has none yet.
func (s *session) fetchContext() context.Context {
	if s.ctx == nil {
		return context.Background()
	}
	return s.ctx
}

// Serve implements probe.Session.
func (s *session) Serve(h probe.Handler) error { return s.run(h).Serve() }

// Watch implements probe.Watcher: the session read by the Poller of its
// link, without a goroutine of its own. A catch-up fetch, an HTTP request
// made while handling a frame, holds the Poller's worker while it runs;
// the Poller starts another for the other sessions meanwhile.
func (s *session) Watch(h probe.Handler, done func(error)) bool { return s.run(h).Watch(done) }

// Hold implements probe.Holder: a watched slow reader's pause.
func (s *session) Hold(d time.Duration) bool { return s.conn.Hold(d) }

var (
	_ probe.Watcher = (*session)(nil)
	_ probe.Holder  = (*session)(nil)
)

func (s *session) run(h probe.Handler) wsconn.Session {
	return wsconn.Session{Conn: s.conn, Proto: &reader{s: s, h: h},
		Begin:  func() error { s.answers.Serve(h); return nil },
		Finish: func(err error) error { s.stop(); return err }}
}

// stop ends the session's sends and waits for them.
func (s *session) stop() {
	s.wmu.Lock()
	s.done = true
	s.wmu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// reader is the session as its connection's wsconn.Protocol.
type reader struct {
	s *session
	h probe.Handler
}

func (r *reader) Frame(b []byte, at int64) error { return r.s.read(b, at, r.h) }

// Ended classes how the server ended the connection: a close frame
// without a status (1005) is what Mattermost writes when it drops a
// connection whose send queue is full.
func (r *reader) Ended(err error) *probe.Disconnect {
	return wsconn.Ended(err, func(code int, _ string) *probe.Disconnect {
		if code == websocket.CloseNoStatusReceived {
			return &probe.Disconnect{Reason: metrics.ReasonSlowConsumer, Code: code, Err: errors.New("closed without a status: the server's send queue for this connection was full")}
		}
		return nil
	})
}

// Send implements probe.Session: the POST goes out on a goroutine of the
// session's, so that sending never waits for the server; its answer is
// the ack.
func (s *session) Send(m *probe.Message) error {
	ch, ok := s.d.channelOf(s.user, m)
	if !ok {
		return fmt.Errorf("mattermost: no channel for the message from %s (group %q, to %q): not provisioned", s.user, m.Group, m.To)
	}
	// Encoded now: m.Body is the caller's again once Send returns. The
	// pending_post_id is the user's id, as Mattermost's own clients
	// begin theirs, and a number unique to this send.
	s.d.mu.RLock()
	uid := s.d.ids[s.user]
	s.d.mu.RUnlock()
	payload := map[string]string{"channel_id": ch, "message": string(m.Body), "pending_post_id": uid + ":" + s.d.nonce + "." + strconv.FormatUint(m.Ref, 10)}
	t := time.NewTimer(sendSlotWait)
	defer t.Stop()
	select {
	case s.d.sends <- struct{}{}:
	case <-t.C:
		return fmt.Errorf("mattermost: %d sends in flight (max_sends) for %s", cap(s.d.sends), sendSlotWait)
	case <-s.ctx.Done():
		return errors.New("mattermost: session closed")
	}
	s.wmu.Lock()
	if s.done {
		s.wmu.Unlock()
		<-s.d.sends
		return errors.New("mattermost: session closed")
	}
	s.wg.Add(1)
	s.wmu.Unlock()
	ref := m.Ref
	// Ends with the session: stop cancels ctx and waits.
	go func() {
		defer s.wg.Done()
		defer func() { <-s.d.sends }()
		s.postOne(ref, payload)
	}()
	return nil
}

// postOne sends one post, retrying under the same pending_post_id while
// the server gives no answer, or a 5xx or 429; a session that ends
// meanwhile reports nothing (the population writes its sends off).
func (s *session) postOne(ref uint64, payload map[string]string) {
	var err error
	for attempt := 0; ; attempt++ {
		var p post
		var r *longpoll.Response
		r, err = s.d.call(s.ctx, probe.Link{}, http.MethodPost, "/api/v4/posts", nil, s.token, payload, &p)
		if s.ctx.Err() != nil {
			return
		}
		switch st := statusOf(err); {
		case err == nil && p.ID != "":
			s.answers.Report(probe.Answer{Ref: ref, ServerID: p.ID})
			return
		case err == nil:
			s.answers.Report(probe.Answer{Ref: ref, Reject: "answer without a post id"})
			return
		case r != nil && st != http.StatusTooManyRequests && st < 500:
			if st == http.StatusUnauthorized {
				s.d.setToken(s.user, s.dev, "")
			}
			reject := "HTTP " + strconv.Itoa(st)
			if ae, ok := errors.AsType[*apiError](err); ok && ae.ID != "" {
				reject = ae.ID
			}
			s.answers.Report(probe.Answer{Ref: ref, Reject: reject})
			return
		}
		if attempt >= s.d.cfg.SendRetries {
			break
		}
		s.d.retries.Add(1)
		if !probe.Sleep(s.ctx, time.Duration(attempt+1)*200*time.Millisecond) {
			return
		}
	}
	s.answers.Report(probe.Answer{Ref: ref, Err: err})
}

// Ping implements probe.Session: a WebSocket ping, whose pong keeps the
// read deadline.
func (s *session) Ping() error { return s.conn.Ping() }

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session: the sends in flight are cancelled, and
// the connection closed with a close handshake.
func (s *session) Close() error {
	s.cancel()
	return s.conn.Close()
}
