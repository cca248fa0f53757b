// Package openimtest is an OpenIM v3.8.3-compatible server for tests, as
// net/http/httptest is an HTTP one: the REST routes a monitor uses and
// the WebSocket gateway, on two loopback listeners (OpenIM's 10002 and
// 10001), with users, groups, per-conversation seqs, pushes, newest-seq
// and pull-by-seq in memory. It injects, on request, the delivery faults
// a monitor must detect and a real server will not show on demand:
// dropped, duplicated, reordered and late pushes, and messages acked but
// never stored. (The real v3.8.3 that CI runs takes the tests that need no
// injected fault.)
//
// Every protobuf payload is the protocol module's own type
// (github.com/openimsdk/protocol v0.0.72-alpha.70, the version
// open-im-server v3.8.3 requires), and every behaviour follows
// open-im-server v3.8.3's source, cited file:line in the comments (paths
// relative to the module root). The code is written from reading that
// source, not copied from it.
//
// What it does not do: friends, blacklists, conversation settings,
// offline push, group roles beyond owner/admin/member, muting,
// dismissal, sdkType=go (gob) encoding (refused at login with 1602),
// sessionType 4 sends (refused with 1001), signalling (1004 answers the
// ArgsError the real one gives), and requests 1005-1007 and 2005
// (answered 500).
//
// Where it knowingly differs from v3.8.3, on the wire:
//   - errMsg is the code's name on REST and "code name: reason" on the
//     gateway; the real one, for an error from a service behind the
//     API, is that service's whole formatted error, stack trace
//     included. Only errCode is worth comparing.
//   - Tokens are HS256 JWTs with OpenIM's claims and a random jti, signed
//     with a key of the server's own: distinct even when issued within
//     one second, which the real ones are not.
//   - A login is registered before its first frame is written; the real
//     gateway registers it afterwards, through a channel, and a push in
//     between is missed.
//   - Notifications are never stored under their own n_ conversation
//     (every one this server sends is of reliability level 1, which the
//     real one does not store either).
//
// Users come from /user/user_register; AdminUserID exists from the start.
package openimtest

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/openimsdk/protocol/sdkws"
)

// AdminUserID is config/share.yml's imAdminUserID: the user whose token
// /auth/get_admin_token gives, and the only one the admin routes accept.
const AdminUserID = "imAdmin"

const adminUserID = AdminUserID

// Defaults, each OpenIM's: internal/msggateway/constant.go:59-71.
const (
	defaultWriteTimeout = 10 * time.Second // writeWait
	defaultReadTimeout  = 30 * time.Second // pongWait
	defaultPingPeriod   = 27 * time.Second // pingPeriod, 9/10 of pongWait
	maxMessageSize      = 51200            // the gateway's read limit
	defaultHistory      = 10000
)

// Options configures a Server.
type Options struct {
	// Secret is the API secret /auth/get_admin_token checks (share.yml's
	// secret). Required; never logged.
	Secret string
	// Faults is what the server does wrong, on purpose; zero is nothing.
	Faults Faults
	// Seed seeds the faults' PRNG.
	Seed uint64
	// WriteTimeout is the write deadline of every frame, OpenIM's 10 s by
	// default. OpenIM writes synchronously under a per-connection mutex,
	// so a reader slower than this stalls that connection's pushes for
	// up to WriteTimeout, after which every write to it fails (gorilla
	// keeps the first write error) and the connection is closed the next
	// time the client pings, or after ReadTimeout of client silence.
	WriteTimeout time.Duration
	// ReadTimeout is the read deadline, reset by every frame from the
	// client, ping and pong included: OpenIM's pongWait, 30 s.
	ReadTimeout time.Duration
	// PingPeriod is how often the server pings a Web (platform 5)
	// connection, the only platform it pings: OpenIM's 27 s.
	PingPeriod time.Duration
	// History is how many messages each conversation keeps, 10000 by
	// default; older ones are gone, and pulls start at the oldest kept.
	History int
	// ReportMinSeqs fills GetMaxSeqResp.minSeqs with each conversation's
	// oldest kept seq. v3.8.3 leaves minSeqs empty
	// (internal/rpc/msg/sync_msg.go:144-146), so this is off by default:
	// a client that relies on it will not find it on a real server.
	ReportMinSeqs bool
	// Logger receives the server's diagnostics; nil discards them.
	Logger *slog.Logger
}

// Faults are fractions in [0,1] of pushes, per connection, or of sends.
type Faults struct {
	// DropPush is the fraction of pushes to one connection not sent. The
	// message is stored, so a pull (1002) gets it: a gap the client must
	// fill.
	DropPush float64
	// DuplicatePush is the fraction of pushes to one connection sent
	// twice.
	DuplicatePush float64
	// ReorderPush is the fraction of pushes to one connection held back
	// and sent right after the next push to that connection from the
	// same sender in the same conversation, so that the two arrive in
	// the order a client can see broken; one held push at a time per
	// connection, lost if the connection closes first.
	ReorderPush float64
	// Unstored is the fraction of sends acked but never given a seq,
	// stored or pushed: a loss the server's numbering cannot show.
	Unstored float64
	// PushDelay delays every push by this long after its send was
	// accepted, without holding up acks.
	PushDelay time.Duration
}

// Stats are counters since New.
type Stats struct {
	Logins, RefusedLogins int64
	// SendsAcked counts 1003 answered with errCode 0.
	SendsAcked int64
	// PushesSent counts 2001 frames written to a connection (a
	// duplicate counts twice); PushesFailed the writes that failed.
	PushesSent, PushesFailed                         int64
	PushesDropped, PushesDuplicated, PushesReordered int64
	// PushesDroppedOwn and PushesDuplicatedOwn are those of them to one of
	// the sender's own connections (sender sync), which a client skips.
	PushesDroppedOwn, PushesDuplicatedOwn int64
	// Unstored counts sends acked and then thrown away (Faults.Unstored).
	Unstored int64
	// MessagesPulled counts the messages 1002 answers carried,
	// placeholders for missing seqs included.
	MessagesPulled int64
	// NewestSeqRequests counts 1001.
	NewestSeqRequests int64
	// Kicks counts connections sent 2002 and closed.
	Kicks int64
	// TextPings counts text {"type":"ping"} frames.
	TextPings int64
	// SlowConsumers counts connections whose write deadline expired;
	// SlowConsumerDisconnects those of them since closed.
	SlowConsumers, SlowConsumerDisconnects int64
	// ConnsOpen is the connections open now.
	ConnsOpen int64
}

type counters struct {
	logins, refusedLogins, sendsAcked, pushesSent, pushesFailed atomic.Int64
	pushesDropped, pushesDuplicated, pushesReordered, unstored  atomic.Int64
	pushesDroppedOwn, pushesDuplicatedOwn                       atomic.Int64
	messagesPulled, newestSeqRequests, kicks, textPings         atomic.Int64
	slowConsumers, slowConsumerDisconnects                      atomic.Int64
	// pushJobs counts messages whose pushes have all ended (written,
	// failed, dropped or held): tests wait on it.
	pushJobs atomic.Int64
}

// Server is a running OpenIM-compatible server.
type Server struct {
	o      Options
	log    *slog.Logger
	store  *store
	tokens *tokens
	st     counters

	apiLn, wsLn   net.Listener
	apiSrv, wsSrv *http.Server
	upgrader      websocket.Upgrader

	// done is closed by Close; every goroutine of the server watches it
	// or a connection that Close closes.
	done      chan struct{}
	closeOnce sync.Once
	track     tracker

	regMu   sync.Mutex
	closing bool
	conns   map[string][]*conn // by user: those a push reaches
	// live is every connection not yet closed, kicked ones included
	// (out of conns, still writing their 2002): Close closes them all.
	live   map[*conn]struct{}
	nextID uint64

	transfer chan transferJob
	lanes    []chan pushJob

	rngMu sync.Mutex
	rng   *rand.Rand
}

// tracker counts the server's goroutines and handlers, and refuses new
// ones once the server is closing, so Close can wait for all of them.
type tracker struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (t *tracker) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

func (t *tracker) spawn(f func()) bool {
	if !t.add() {
		return false
	}
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

func (t *tracker) stop() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// New starts a server on two loopback listeners: the REST API and the
// WebSocket gateway.
func New(o Options) (*Server, error) {
	if o.Secret == "" {
		return nil, errors.New("openimtest: Options.Secret is empty")
	}
	for name, f := range map[string]float64{"DropPush": o.Faults.DropPush, "DuplicatePush": o.Faults.DuplicatePush,
		"ReorderPush": o.Faults.ReorderPush, "Unstored": o.Faults.Unstored} {
		if f < 0 || f > 1 {
			return nil, fmt.Errorf("openimtest: Faults.%s = %v, want a fraction in [0,1]", name, f)
		}
	}
	if o.Faults.PushDelay < 0 {
		return nil, fmt.Errorf("openimtest: Faults.PushDelay = %v, want >= 0", o.Faults.PushDelay)
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = defaultWriteTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = defaultReadTimeout
	}
	if o.PingPeriod <= 0 {
		o.PingPeriod = defaultPingPeriod
	}
	if o.History <= 0 {
		o.History = defaultHistory
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	tk, err := newTokens([]string{adminUserID})
	if err != nil {
		return nil, fmt.Errorf("openimtest: token key: %w", err)
	}
	s := &Server{
		o:      o,
		log:    o.Logger,
		store:  newStore(o.History),
		tokens: tk,
		done:   make(chan struct{}),
		conns:  make(map[string][]*conn),
		live:   make(map[*conn]struct{}),
		// The queue between an accepted send and its seq: OpenIM's
		// Kafka topic toRedis. Bounded: when it is full, the sender's
		// connection stops reading (its next request waits) until the
		// transfer goroutine catches up.
		transfer: make(chan transferJob, transferQueue),
		rng:      rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		upgrader: websocket.Upgrader{
			// long_conn.go:69-72: any origin.
			CheckOrigin: func(*http.Request) bool { return true },
		},
	}
	// The admin user exists from the start, as the user service creates
	// imAdminUserID when it starts.
	s.store.users[adminUserID] = &sdkws.UserInfo{UserID: adminUserID, Nickname: adminUserID, AppMangerLevel: 1}

	if s.apiLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("openimtest: api listener: %w", err)
	}
	if s.wsLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		_ = s.apiLn.Close()
		return nil, fmt.Errorf("openimtest: gateway listener: %w", err)
	}
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	s.apiSrv = &http.Server{Handler: s.tracked(s.serveAPI), ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	s.wsSrv = &http.Server{Handler: s.tracked(s.serveGateway), ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}

	s.lanes = make([]chan pushJob, pushLanes)
	for i := range s.lanes {
		s.lanes[i] = make(chan pushJob, laneQueue)
		lane := s.lanes[i]
		s.track.spawn(func() { s.runLane(lane) }) // exits on done
	}
	s.track.spawn(s.runTransfer)                          // exits on done
	s.track.spawn(func() { _ = s.apiSrv.Serve(s.apiLn) }) // exits on Close
	s.track.spawn(func() { _ = s.wsSrv.Serve(s.wsLn) })   // exits on Close
	return s, nil
}

// tracked refuses requests once the server is closing and lets Close
// wait for the ones in flight, WebSocket read loops included (they run
// in the handler).
func (s *Server) tracked(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.track.add() {
			http.Error(w, "closing", http.StatusServiceUnavailable)
			return
		}
		defer s.track.wg.Done()
		h(w, r)
	}
}

// APIURL is the REST API's base URL, http://127.0.0.1:P.
func (s *Server) APIURL() string { return "http://" + s.apiLn.Addr().String() }

// WSURL is the gateway's URL, ws://127.0.0.1:Q; the gateway answers on
// any path, as OpenIM's does (ws_server.go:182).
func (s *Server) WSURL() string { return "ws://" + s.wsLn.Addr().String() }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.regMu.Lock()
	open := 0
	for _, cs := range s.conns {
		open += len(cs)
	}
	s.regMu.Unlock()
	c := &s.st
	return Stats{
		Logins: c.logins.Load(), RefusedLogins: c.refusedLogins.Load(),
		SendsAcked: c.sendsAcked.Load(),
		PushesSent: c.pushesSent.Load(), PushesFailed: c.pushesFailed.Load(),
		PushesDropped: c.pushesDropped.Load(), PushesDuplicated: c.pushesDuplicated.Load(),
		PushesDroppedOwn: c.pushesDroppedOwn.Load(), PushesDuplicatedOwn: c.pushesDuplicatedOwn.Load(),
		PushesReordered: c.pushesReordered.Load(), Unstored: c.unstored.Load(),
		MessagesPulled: c.messagesPulled.Load(), NewestSeqRequests: c.newestSeqRequests.Load(),
		Kicks: c.kicks.Load(), TextPings: c.textPings.Load(),
		SlowConsumers: c.slowConsumers.Load(), SlowConsumerDisconnects: c.slowConsumerDisconnects.Load(),
		ConnsOpen: int64(open),
	}
}

// Kick disconnects the user's connections on platformID as a
// same-platform login would: a 2002 frame, then close. Like a login with
// a new token (or the auth service's force_logout,
// internal/rpc/auth/auth.go:184-214), it also kicks every token of that
// (user, platform): reconnecting needs a new token.
func (s *Server) Kick(userID string, platformID int32) {
	s.regMu.Lock()
	var kicked []*conn
	kept := make([]*conn, 0, len(s.conns[userID]))
	for _, c := range s.conns[userID] {
		if c.platformID == int(platformID) {
			kicked = append(kicked, c)
		} else {
			kept = append(kept, c)
		}
	}
	s.setConns(userID, kept)
	s.regMu.Unlock()
	s.tokens.invalidate(userID, int(platformID), "")
	for _, c := range kicked {
		c.kick()
	}
}

// Close closes the listeners and every connection, and returns when
// every goroutine of the server has stopped.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.track.stop()
		_ = s.apiSrv.Close()
		_ = s.wsSrv.Close()
		s.regMu.Lock()
		s.closing = true
		all := make([]*conn, 0, len(s.live))
		for c := range s.live {
			all = append(all, c)
		}
		s.regMu.Unlock()
		for _, c := range all {
			c.close(errServerClosed)
		}
		s.track.wg.Wait()
	})
}

var errServerClosed = errors.New("server closed")

// roll reports whether an event of probability p happens.
func (s *Server) roll(p float64) bool {
	if p <= 0 {
		return false
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < p
}
