// Package reference is the probe driver for the protocol of imcanary's own
// reference server (package refserver): JSON frames over WebSocket, a
// token login, acks carrying a server id and a per-conversation sequence.
package reference

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
	"github.com/imcanary/imcanary/refserver"
)

var _ probe.Driver = (*Driver)(nil)

// Options configures the driver.
type Options struct {
	// URL is the target's WebSocket endpoint, ws://host:port/ws.
	URL string
	// Header is sent with every WebSocket upgrade: imcanary's User-Agent
	// and the configured target.headers. It is not modified.
	Header http.Header
	// Secret signs login tokens; nil logs in with a placeholder token,
	// which only a target without a secret accepts.
	Secret []byte
	// Heartbeat is the session's ping interval; a session that reads
	// nothing for two of them and a margin is declared dead.
	Heartbeat time.Duration
	// DialTimeout bounds connect and login together. Default 10s.
	DialTimeout time.Duration
	// MaxFrame bounds one received frame. Default 64 KiB.
	MaxFrame int64
	// WriteTimeout bounds one write. Default 5s: a target that stops
	// reading must not block the sender, which serves other users too,
	// for longer.
	WriteTimeout time.Duration
	// TLS, if set, is the client TLS configuration of a wss:// URL (its
	// trusted roots); nil verifies against the system's roots.
	TLS *tls.Config
}

// Driver connects users to a reference server.
type Driver struct {
	opts Options
	// key signs the logins: opts.Secret, until Rekey replaces it.
	key *probe.Key
	// conn is what every session's connection shares.
	conn *wsconn.Settings
	// scratch holds *scratch for Frame.
	scratch sync.Pool

	// groupsOf holds each user's groups, so that each login re-creates
	// them: a restarted target has forgotten its groups, and idempotent
	// re-creation heals that without a provisioning pass.
	groupsOf probe.Memberships[probe.Group]
	// convsOf holds each user's conversations by the server's names
	// ("d:a:b", "g:NAME"), for catch-up: a device has a place in each
	// from its first login on, even one nothing was said in yet.
	convsOf probe.Memberships[string]
	// bases holds, per conversation of the plan, the seq below which
	// the process owes its devices nothing: the lowest newest seq a
	// seqs answer gave a device of the process that had no place in the
	// conversation yet. A device with no place in it starts there
	// (Catchup.Start), so that one logging in late fetches what was
	// sent meanwhile: the server's offline backlog goes to one session
	// of the user alone, and the user's other devices, which the ledger
	// owes it to as well, would otherwise take their place at the
	// newest seq and never ask for it. Bounded by the plan's
	// conversations; guarded by basesMu.
	basesMu sync.Mutex
	bases   map[string]uint64
	// regrouped is set once a group's members changed at run time
	// (probe.Regrouper): logins then stop re-creating their groups, which
	// would race the change with a member list of before it.
	regrouped atomic.Bool
	// regroupMu serialises membership changes.
	regroupMu sync.Mutex
}

var _ probe.Regrouper = (*Driver)(nil)

// SetMembers implements probe.Regrouper: the group frame replaces the
// group's members, sent by a short-lived session of the provisioning user
// and confirmed by the server's ok.
func (d *Driver) SetMembers(ctx context.Context, g probe.Group) error {
	d.regroupMu.Lock()
	defer d.regroupMu.Unlock()
	d.regrouped.Store(true)
	s, err := d.connect(ctx, g.Name+"-provisioner", nil, probe.Link{})
	if err != nil {
		return fmt.Errorf("group %s: %w", g.Name, err)
	}
	stop := s.conn.Interrupt(ctx)
	defer stop()
	defer s.conn.Abort()
	if err := s.writeGroup(g, "m"); err != nil {
		return fmt.Errorf("group %s: %w", g.Name, err)
	}
	var f frame
	for {
		buf, _, err := s.conn.Read(d.conn.DialTimeout)
		if err != nil {
			return fmt.Errorf("group %s: %w", g.Name, err)
		}
		err = parseFrame(*buf, &f)
		typ, id, code, msg := string(f.typ), string(f.id), string(f.code), string(f.message)
		wsconn.Release(buf)
		switch {
		case err != nil:
			return fmt.Errorf("group %s: %w", g.Name, err)
		case id != "m":
			// A push to the provisioner: not its business.
		case typ == "ok":
			return nil
		case typ == "error":
			return fmt.Errorf("target refused group %s: %s: %s", g.Name, code, msg)
		}
	}
}

var _ probe.Mirror = (*Driver)(nil)

// MirrorsOwn implements probe.Mirror: the reference server delivers what a
// user sends to the user's other sessions.
func (d *Driver) MirrorsOwn() bool { return true }

// directConv is the server's name of the direct conversation of a and b.
func directConv(a, b string) string {
	if b < a {
		a, b = b, a
	}
	return "d:" + a + ":" + b
}

// closeGrace is how long Close waits for the target's close reply.
const closeGrace = time.Second

// New returns a driver for the target at o.URL.
func New(o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("reference: no target url")
	}
	return &Driver{
		opts: o,
		key:  probe.NewKey(o.Secret),
		conn: wsconn.NewSettings(wsconn.Settings{
			URL: o.URL, Header: o.Header, MaxFrame: o.MaxFrame,
			DialTimeout: o.DialTimeout, WriteTimeout: o.WriteTimeout, Heartbeat: o.Heartbeat,
			CloseGrace: closeGrace, TLS: o.TLS,
		}),
		scratch: sync.Pool{New: func() any { return new(scratch) }},
	}, nil
}

// Provision implements probe.Driver. Users need no provisioning: the target
// creates a user at its first login. Groups are created through a
// short-lived session of a provisioning user, and again at each member's
// login.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	// Counted first, so that each user's lists are parts of one array.
	nGroups, nConvs := map[string]int{}, map[string]int{}
	for _, g := range plan.Groups {
		for _, m := range g.Members {
			nGroups[m]++
			nConvs[m]++
		}
	}
	for _, pr := range plan.Direct {
		nConvs[pr.From]++
		nConvs[pr.To]++
	}
	groupsOf, convsOf := probe.Pack[probe.Group](nGroups), probe.Pack[string](nConvs)
	for _, g := range plan.Groups {
		conv := "g:" + g.Name // one string, shared by the members
		for _, m := range g.Members {
			groupsOf[m] = append(groupsOf[m], g)
			convsOf[m] = append(convsOf[m], conv)
		}
	}
	for _, pr := range plan.Direct {
		c := directConv(pr.From, pr.To)
		convsOf[pr.From] = append(convsOf[pr.From], c)
		convsOf[pr.To] = append(convsOf[pr.To], c)
	}
	d.groupsOf.Replace(plan.Users, groupsOf)
	d.convsOf.Replace(plan.Users, convsOf)
	if len(plan.Groups) == 0 {
		return nil
	}
	// The provisioner's name derives from the plan's first group so that
	// it never collides with a user of the population: a second login of a
	// population user would kick its real session.
	s, err := d.connect(ctx, plan.Groups[0].Name+"-provisioner", nil, probe.Link{})
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	// Shutdown must not wait for a server that stopped answering.
	stop := s.conn.Interrupt(ctx)
	defer stop()
	defer s.conn.Abort()
	// Keep a bounded window of requests in flight: writing thousands of
	// groups before reading a reply would fill the target's send queue
	// with our own oks and get the provisioner kicked as a slow reader.
	const window = 8
	var f frame
	readOK := func() error {
		buf, _, err := s.conn.Read(d.conn.DialTimeout)
		if err != nil {
			return err
		}
		defer wsconn.Release(buf)
		if err := parseFrame(*buf, &f); err != nil {
			return err
		}
		switch string(f.typ) {
		case "ok":
			return nil
		case "error":
			return fmt.Errorf("target refused group request %s: %s: %s", f.id, f.code, f.message)
		}
		return fmt.Errorf("unexpected reply type %q", f.typ)
	}
	inflight := 0
	for i, g := range plan.Groups {
		if err := s.writeGroup(g, "p"+strconv.Itoa(i)); err != nil {
			return fmt.Errorf("provision group %s: %w", g.Name, err)
		}
		if inflight++; inflight == window {
			if err := readOK(); err != nil {
				return fmt.Errorf("provision: %w", err)
			}
			inflight--
		}
	}
	// Provisioning is done only once the target has confirmed every group.
	for ; inflight > 0; inflight-- {
		if err := readOK(); err != nil {
			return fmt.Errorf("provision: %w", err)
		}
	}
	return nil
}

// Connect implements probe.Driver.
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	s, err := d.connect(ctx, user, d.groupsOf.Of(user), dev.Link)
	if err != nil {
		return nil, err
	}
	if dev.Catchup != nil {
		s.cu, s.convs = dev.Catchup, d.convsOf.Of(user)
		// Before any frame of the session is read (the offline
		// backlog, a push): a device new to a conversation starts
		// where the process first saw it.
		d.start(s.cu, s.convs)
		// Where the device stands is asked at once: what it missed
		// while away is fetched before the first sync is due.
		if err := s.Sync(); err != nil {
			s.conn.Abort()
			return nil, fmt.Errorf("catch-up: %w", err)
		}
	}
	return s, nil
}

// start places cu, in each of convs it has no place in yet, at the
// conversation's base (see Driver.bases).
func (d *Driver) start(cu *probe.Catchup, convs []string) {
	d.basesMu.Lock()
	defer d.basesMu.Unlock()
	if len(d.bases) == 0 {
		return
	}
	for _, c := range convs {
		if b, ok := d.bases[c]; ok {
			cu.Start(c, b)
		}
	}
}

// based notes that a device took its place in conv at last: conv's base
// is the lowest such place. A conversation outside the plan (convs, the
// user's) has none.
func (d *Driver) based(convs []string, conv []byte, last uint64) {
	for _, c := range convs {
		if c == string(conv) {
			d.base(c, last)
			return
		}
	}
}

// base lowers conv's base to last, or sets it.
func (d *Driver) base(conv string, last uint64) {
	d.basesMu.Lock()
	defer d.basesMu.Unlock()
	if b, ok := d.bases[conv]; !ok || last < b {
		if d.bases == nil {
			d.bases = map[string]uint64{}
		}
		d.bases[conv] = last
	}
}

func (d *Driver) connect(ctx context.Context, user string, groups []probe.Group, link probe.Link) (*session, error) {
	s := &session{d: d}
	_, err := wsconn.Open(ctx, d.conn, link, user, func(c *wsconn.Conn) error {
		s.conn = c
		if err := s.login(user); err != nil {
			return err
		}
		if d.regrouped.Load() {
			return nil
		}
		for i, g := range groups {
			if err := s.writeGroup(g, "g"+strconv.Itoa(i)); err != nil {
				return fmt.Errorf("group %s: %w", g.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// session is one logged-in connection: the protocol's side of it (frames
// in and out); the connection layer does the rest.
type session struct {
	d    *Driver
	conn *wsconn.Conn
	h    probe.Handler

	// cu is the device's catch-up state, nil when catch-up is off;
	// convs are its user's conversations.
	cu    *probe.Catchup
	convs []string
	// fx is the history requests' state, made at the first: most
	// sessions never fetch, and it inline was 48 bytes a session.
	fx *fetches
}

// fetches are a session's history requests: asked are those in flight,
// Serve's alone; next numbers them; due is scratch for Catchup.Due.
type fetches struct {
	asked []fetch
	next  uint64
	due   []probe.Fetch
}

// fetches returns s's history requests' state, making it.
func (s *session) fetches() *fetches {
	if s.fx == nil {
		s.fx = &fetches{}
	}
	return s.fx
}

// fetch is one history request in flight: its id, what it asked for, and
// the highest seq its answer has brought so far.
type fetch struct {
	id    uint64
	conv  string
	after uint64
	got   uint64
}

// maxAsked bounds the history requests a session has in flight: a device
// far behind fetches a page at a time rather than flood the server.
const maxAsked = 16

func (s *session) login(user string) error {
	token := "open"
	if secret := s.d.key.Bytes(); secret != nil {
		token = refserver.Token(secret, user)
	}
	b := jsonscan.AppendString([]byte(`{"type":"login","id":"login","user":`), user)
	b = append(b, `,"token":`...)
	b = jsonscan.AppendString(b, token)
	b = append(b, '}')
	if err := s.conn.Write(b); err != nil {
		return err
	}
	buf, _, err := s.conn.Read(s.d.conn.DialTimeout)
	if err != nil {
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code == refserver.CloseUnauthorized {
			return probe.Unauthorized(fmt.Errorf("the target closed the login with %d %q", ce.Code, ce.Text))
		}
		return err
	}
	defer wsconn.Release(buf)
	var f frame
	if err := parseFrame(*buf, &f); err != nil {
		return fmt.Errorf("malformed login reply: %w", err)
	}
	switch string(f.typ) {
	case "login_ok":
		return nil
	case "error":
		return fmt.Errorf("login refused: %s: %s", f.code, f.message)
	}
	return fmt.Errorf("unexpected login reply type %q", f.typ)
}

func (s *session) writeGroup(g probe.Group, id string) error {
	b := jsonscan.AppendString([]byte(`{"type":"group","id":`), id)
	b = append(b, `,"group":`...)
	b = jsonscan.AppendString(b, g.Name)
	b = append(b, `,"members":[`...)
	for i, m := range g.Members {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonscan.AppendString(b, m)
	}
	b = append(b, "]}"...)
	return s.conn.Write(b)
}

// sendPool holds encoded send frames between uses.
var sendPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// Send implements probe.Session.
func (s *session) Send(m *probe.Message) error {
	bp := sendPool.Get().(*[]byte)
	b := append((*bp)[:0], `{"type":"send","id":"`...)
	b = strconv.AppendUint(b, m.Ref, 10)
	if m.Group != "" {
		b = append(b, `","group":`...)
		b = jsonscan.AppendString(b, m.Group)
	} else {
		b = append(b, `","to":`...)
		b = jsonscan.AppendString(b, m.To)
	}
	b = append(b, `,"body":`...)
	b = jsonscan.AppendString(b, m.Body)
	b = append(b, '}')
	err := s.conn.Write(b)
	*bp = b
	sendPool.Put(bp)
	return err
}

// Ping implements probe.Session.
func (s *session) Ping() error { return s.conn.Ping() }

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session: a normal-closure frame, then a bounded wait
// for the server's reply, which Serve reads.
func (s *session) Close() error { return s.conn.Close() }

// Serve implements probe.Session.
func (s *session) Serve(h probe.Handler) error { return s.run(h).Serve() }

// Watch implements probe.Watcher: the session read by the Poller of its
// link, without a goroutine of its own.
func (s *session) Watch(h probe.Handler, done func(error)) bool {
	if !s.conn.Watchable() {
		return false
	}
	// Set here rather than by run's Begin: that closure was 32 bytes a
	// session.
	s.h = h
	return wsconn.Session{Conn: s.conn, Proto: s}.Watch(done)
}

// Hold implements probe.Holder: a watched slow reader's pause.
func (s *session) Hold(d time.Duration) bool { return s.conn.Hold(d) }

var (
	_ probe.Watcher = (*session)(nil)
	_ probe.Holder  = (*session)(nil)
)

func (s *session) run(h probe.Handler) wsconn.Session {
	return wsconn.Session{Conn: s.conn, Proto: s, Begin: func() error { s.h = h; return nil }}
}

// scratch is what Frame parses one frame into and hands its handler.
// The driver's sessions share a pool of them rather than each holding
// one: an idle session reads a frame a minute, and 19,000 of them held
// 6.6 MB of scratch (2026-12-04).
type scratch struct {
	f frame
	d probe.Delivery
}

// Frame implements wsconn.Protocol: one frame of the server's.
func (s *session) Frame(b []byte, at int64) error {
	// Not cleared when put back: parseFrame starts from zero, and what a
	// pooled scratch still points to lives until the next collection at
	// the most, a few of them per core.
	sc := s.d.scratch.Get().(*scratch)
	err := s.frame(b, at, sc)
	s.d.scratch.Put(sc)
	return err
}

func (s *session) frame(b []byte, at int64, sc *scratch) error {
	f := &sc.f
	if err := parseFrame(b, f); err != nil {
		return err
	}
	switch string(f.typ) {
	case "msg":
		d := &sc.d
		d.From, d.Group, d.Body, d.ServerSeq, d.At = f.from, len(f.group) > 0, f.body, f.seq, at
		d.Recovered = false
		if s.cu != nil {
			if id, ok := fetchID(f.id); ok {
				// An answer to a history request, not a push.
				d.Recovered = true
				if i := s.findAsked(id); i >= 0 {
					s.fx.asked[i].got = max(s.fx.asked[i].got, f.seq)
				}
			}
			gaps := s.cu.Got(f.conv, f.seq, at)
			s.h.OnDelivery(d)
			if gaps {
				return s.fetchDue(at)
			}
			return nil
		}
		s.h.OnDelivery(d)
	case "seqs":
		if s.cu == nil {
			return nil
		}
		err := eachConv(f.convs, func(conv []byte, last uint64) {
			if s.cu.Behind(string(conv), last, at) {
				s.d.based(s.convs, conv, last)
			}
		})
		if err != nil {
			return err
		}
		// A conversation the server lists none of yet still has its
		// place from now: its first message is then owed.
		for _, c := range s.convs {
			if s.cu.Behind(c, 0, at) {
				s.d.base(c, 0)
			}
		}
		return s.fetchDue(at)
	case "ok":
		if id, ok := fetchID(f.id); ok && s.cu != nil {
			return s.answered(id, f, at)
		}
	case "ack":
		if ref, ok := parseRef(f.id); ok {
			s.h.OnAck(ref, probe.Ack{ServerID: f.msgID, Seq: f.seq})
		}
		if s.cu != nil {
			// The device's own message takes a seq of its
			// conversation too, which no push brings back to it.
			s.cu.Got(f.conv, f.seq, at)
		}
	case "error":
		if ref, ok := parseRef(f.id); ok {
			s.h.OnReject(ref, string(f.code))
		}
		if id, ok := fetchID(f.id); ok && s.cu != nil {
			// Refused (no longer a member): not asked again, and
			// what it would have brought is lost.
			if i := s.findAsked(id); i >= 0 {
				a := s.fx.asked[i]
				s.cu.Answered(a.conv, a.after, a.after+probe.MaxFetch)
				s.fx.asked = append(s.fx.asked[:i], s.fx.asked[i+1:]...)
			}
		}
	}
	return nil
}

// Sync implements probe.Syncer: it asks the server for the newest seq of
// each of the user's conversations, and the answer opens a gap wherever
// the device is behind.
func (s *session) Sync() error {
	if s.cu == nil {
		return nil
	}
	return s.conn.Write([]byte(`{"type":"seqs","id":"sync"}`))
}

// answered closes the history request id: the server sent all it holds
// for the device after the request's after, up to the conversation's
// newest seq, or, with more, up to the last one it sent.
func (s *session) answered(id uint64, f *frame, at int64) error {
	i := s.findAsked(id)
	if i < 0 {
		return nil
	}
	a := s.fx.asked[i]
	s.fx.asked = append(s.fx.asked[:i], s.fx.asked[i+1:]...)
	if f.more && a.got > a.after {
		s.cu.Answered(a.conv, a.after, a.got)
		return s.ask(probe.Fetch{Conv: a.conv, After: a.got, N: probe.MaxFetch})
	}
	s.cu.Answered(a.conv, a.after, max(f.last, a.got))
	return s.fetchDue(at)
}

// fetchDue asks for every gap of the device that is due, within maxAsked.
func (s *session) fetchDue(now int64) error {
	fx := s.fetches()
	if len(fx.asked) >= maxAsked {
		return nil
	}
	fx.due = s.cu.Due(now, fx.due[:0], maxAsked-len(fx.asked))
	for _, f := range fx.due {
		if err := s.ask(f); err != nil {
			return err
		}
	}
	return nil
}

// ask writes one history request.
func (s *session) ask(f probe.Fetch) error {
	fx := s.fetches()
	fx.next++
	id := fx.next
	b := append([]byte(`{"type":"history","id":"h`), strconv.FormatUint(id, 10)...)
	b = append(b, `","conv":`...)
	b = jsonscan.AppendString(b, f.Conv)
	b = append(b, `,"after":`...)
	b = strconv.AppendUint(b, f.After, 10)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, int64(f.N), 10)
	b = append(b, '}')
	fx.asked = append(fx.asked, fetch{id: id, conv: f.Conv, after: f.After})
	return s.conn.Write(b)
}

func (s *session) findAsked(id uint64) int {
	if s.fx == nil {
		return -1
	}
	for i, a := range s.fx.asked {
		if a.id == id {
			return i
		}
	}
	return -1
}

// fetchID parses the id of a history request, "h" and a number.
func fetchID(b []byte) (uint64, bool) {
	if len(b) < 2 || b[0] != 'h' {
		return 0, false
	}
	return parseRef(b[1:])
}

// Ended implements wsconn.Protocol: the server's 4008 is its slow-consumer
// close.
func (s *session) Ended(err error) *probe.Disconnect {
	return wsconn.Ended(err, func(code int, text string) *probe.Disconnect {
		switch code {
		case refserver.CloseSlowConsumer:
			return &probe.Disconnect{Reason: metrics.ReasonSlowConsumer, Code: code, Text: text}
		case refserver.CloseConflict:
			return &probe.Disconnect{Reason: metrics.ReasonConflict, Code: code, Text: text}
		}
		return nil
	})
}

// parseRef parses the decimal id the sender put on a send frame. Other ids
// (login, group) are not refs.
func parseRef(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b), 10, 64)
	return n, err == nil
}

// Decoder is a session's handling of the frames it reads, without a
// connection: the native baseline that a mapped protocol's decoding is
// measured against, side by side (BenchmarkFrameToLedger in probe/jsonws).
// It handles deliveries, acks and errors as a session does; frames that
// would make a session write (catch-up) are not for it.
type Decoder struct{ s session }

// NewDecoder returns a Decoder that reports to h.
func NewDecoder(h probe.Handler) *Decoder {
	// Frame takes its scratch from the driver's pool.
	d := &Driver{scratch: sync.Pool{New: func() any { return new(scratch) }}}
	return &Decoder{s: session{h: h, d: d}}
}

// Frame handles one frame as a session's read loop does.
func (d *Decoder) Frame(b []byte, at int64) error { return d.s.Frame(b, at) }
