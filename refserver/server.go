package refserver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/netpoll"
)

// Close codes the server sends besides the standard 1001 (going away) and
// 1008 (policy violation).
const (
	// CloseUnauthorized ends a connection whose login was refused.
	CloseUnauthorized = 4001
	// CloseSlowConsumer ends a connection whose send queue overflowed.
	CloseSlowConsumer = 4008
	// CloseConflict ends the oldest session of a user who logged in on
	// more devices than Options.MaxDevices allows, or refuses the login
	// beyond them (see DevicePolicy).
	CloseConflict = 4009
	// CloseIdle ends a connection that sent nothing within the idle timeout.
	CloseIdle = 4010
)

// Defaults for the zero values of Options.
const (
	DefaultSendQueue    = 256
	DefaultOfflineQueue = 1000
	DefaultIdleTimeout  = 90 * time.Second
	DefaultMaxFrame     = 64 << 10
	DefaultMaxDevices   = 5
	DefaultHistoryLimit = 1000
	DefaultHistoryBytes = 64 << 20
)

// MaxHistoryPage is the most messages one history answer carries, and
// the page a request without a "limit" gets.
const MaxHistoryPage = 500

// DevicePolicy says what a login beyond Options.MaxDevices does.
type DevicePolicy string

// The device policies; the zero value is DevicePolicyOldest.
const (
	// DevicePolicyOldest closes the user's oldest session, as a server
	// that allows one device replaces the old one.
	DevicePolicyOldest DevicePolicy = "oldest"
	// DevicePolicyRefuse refuses the new login and keeps the sessions
	// the user has.
	DevicePolicyRefuse DevicePolicy = "refuse"
)

const (
	// reorderHold is how long a delivery held back by the reorder fault
	// waits for the recipient's next delivery before it goes out anyway.
	reorderHold = 5 * time.Second
	// closeGrace bounds a close: the in-flight write, the close frame and
	// the wait for the peer's echo all end by then. It is what keeps
	// Close and Serve's shutdown within about a second.
	closeGrace = time.Second
	// slowCloseGrace is closeGrace for a slow consumer. Its socket is
	// full when the queue overflows, so its close frame waits behind a
	// write that ends only when the reader reads again; cutting the
	// connection sooner would leave the client a bare TCP close (1006)
	// that cannot tell it why.
	slowCloseGrace = 10 * time.Second
	// writeTimeout is how long one frame may take to leave. It is long
	// because a reader that is merely slow is the send queue's business
	// (CloseSlowConsumer); this only frees a writer stuck on a dead peer.
	writeTimeout = 10 * time.Second
	// controlWait bounds a pong, which must not stall the reader for long
	// behind a writer blocked on a slow peer.
	controlWait = time.Second
	// maxOfflineBytes caps all offline queues together. Recipients need
	// not exist (anyone may be written to before first login), so a
	// per-user bound alone would let a sender grow memory by inventing
	// names.
	maxOfflineBytes = 256 << 20
	// maxConversations and maxGroups cap the sequence and group tables for
	// the same reason; beyond them a send or group frame gets a "limit"
	// error.
	maxConversations = 1 << 20
	maxGroups        = 1 << 16
	// maxDelayed caps the delay line. Past it a delivery goes out
	// undelayed (and is not counted as Delayed) rather than growing
	// memory by rate × delay.
	maxDelayed = 1 << 20
	// maxUserDirect caps the direct conversations listed per user for
	// seqs, so that one user written to under a million names does not
	// make each of its seqs requests a walk over all of them.
	maxUserDirect = 1 << 16
	// maxSeqsBytes caps a seqs answer at the frame limit a client most
	// likely has, the reference client's 64 KiB.
	maxSeqsBytes = 64 << 10
)

// Faults are the faults injected into deliveries. Each probability is drawn
// independently per delivery, that is per message and recipient; acks and
// other replies are never affected, but by Refuse.
type Faults struct {
	// Drop, Duplicate and Reorder are probabilities in [0, 1]. A dropped
	// delivery is also hidden from the recipient's history answers.
	Drop, Duplicate, Reorder float64
	// DropPush is the probability in [0, 1] that a delivery's push is
	// discarded while the message stays in the recipient's history, as a
	// server that loses a push but not the message does.
	DropPush float64
	// SkipDevice is the probability in [0, 1] that a delivery to a user
	// with two or more sessions skips one of them, chosen at random.
	SkipDevice float64
	// Refuse is the probability in [0, 1] that a send is refused with an
	// "overloaded" error instead of an ack, the message neither stored
	// nor delivered, as a server that sheds load at the door does. It is
	// drawn per send, not per delivery; the only fault that answers a
	// send with anything but its ack.
	Refuse float64
	// Delay plus a uniform random duration in [0, Jitter) is added to every
	// delivery. A fixed Delay without Jitter preserves order.
	Delay, Jitter time.Duration
	// Capacity, if above 0, is the most deliveries per second the server
	// makes: one queue, drained at that rate, which every delivery to a
	// user waits in. Below it nothing waits; above it the wait grows
	// with the backlog, as in a server at its limit, so that a search
	// for the server's limit has a known answer. A delivery that would
	// wait longer than capacityMaxWait is dropped instead (and hidden
	// from history), as an overloaded server sheds: the backlog, and so
	// memory, stay bounded.
	Capacity int
}

// capacityMaxWait is the longest a delivery waits in the Capacity queue.
const capacityMaxWait = 30 * time.Second

// Validate reports the first fault that is out of range, naming its field.
func (f Faults) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"Drop", f.Drop}, {"Duplicate", f.Duplicate}, {"Reorder", f.Reorder}, {"DropPush", f.DropPush}, {"SkipDevice", f.SkipDevice}, {"Refuse", f.Refuse}} {
		// Written so that NaN fails too.
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("Faults.%s = %v: must be a probability in [0, 1]", p.name, p.v)
		}
	}
	if f.Delay < 0 {
		return fmt.Errorf("Faults.Delay = %v: must not be negative", f.Delay)
	}
	if f.Jitter < 0 {
		return fmt.Errorf("Faults.Jitter = %v: must not be negative", f.Jitter)
	}
	if f.Capacity < 0 || f.Capacity > 1e9 {
		return fmt.Errorf("Faults.Capacity = %d: must be 0 (no limit) or a number of deliveries per second up to 1e9", f.Capacity)
	}
	return nil
}

// clamp brings f into range; SetFaults has no error to return.
func (f Faults) clamp() Faults {
	p := func(v float64) float64 {
		if math.IsNaN(v) || v < 0 {
			return 0
		}
		return min(v, 1)
	}
	f.Drop, f.Duplicate, f.Reorder = p(f.Drop), p(f.Duplicate), p(f.Reorder)
	f.DropPush, f.SkipDevice, f.Refuse = p(f.DropPush), p(f.SkipDevice), p(f.Refuse)
	f.Delay, f.Jitter = max(f.Delay, 0), max(f.Jitter, 0)
	f.Capacity = min(max(f.Capacity, 0), 1e9)
	return f
}

// Options configure a Server. The zero value is a server without secret or
// faults and with the defaults below.
type Options struct {
	// Secret keys the HMAC of login tokens (see Token). With no secret the
	// server accepts any non-empty token.
	Secret []byte
	// Faults are the initial faults; SetFaults changes them later.
	Faults Faults
	// Stall lists the users whose sessions are stalled from the start
	// (see Server.Stall, which changes it later).
	Stall []string
	// SendQueue is the per-connection send queue length (default 256).
	SendQueue int
	// SendBuffer, if above 0, fixes each connection's kernel send buffer
	// (SO_SNDBUF) at this many bytes instead of letting the kernel grow it
	// to megabytes. A reader that stops then fills the send queue within
	// seconds, and its slow-consumer close frame is not stuck behind
	// megabytes it will never read; many servers fix it for that reason.
	SendBuffer int
	// OfflineQueue is the per-user offline queue length (default 1000).
	OfflineQueue int
	// IdleTimeout closes a connection that sends nothing, not even a ping,
	// for this long (default 90s).
	IdleTimeout time.Duration
	// MaxFrame is the largest frame the server reads (default 64 KiB).
	MaxFrame int64
	// MaxDevices is how many sessions a user may have at once (default
	// 5); DevicePolicy says what a login beyond them does (default
	// DevicePolicyOldest). MaxDevices 1 with DevicePolicyOldest is a
	// server where a new login replaces the old one.
	MaxDevices   int
	DevicePolicy DevicePolicy
	// HistoryLimit is how many messages of each conversation are kept
	// for history requests (default 1000); a negative HistoryLimit keeps
	// none. HistoryBytes caps all conversations' kept messages together
	// (default 64 MiB); the oldest go first past either bound.
	HistoryLimit int
	HistoryBytes int64
	// NoReactor reads each connection with a goroutine of its own, and
	// writes it with another, as the server did before it had a reactor.
	// By default a netpoll Poller reads every plain-TCP connection, and a
	// connection holds a goroutine only while it has frames to write (see
	// poll.go); TLS connections (and any system without epoll) are read
	// by a goroutine either way.
	NoReactor bool
	// Logger receives the server's logs (default: discarded).
	Logger *slog.Logger
	// Rand returns numbers in [0, 1) for the fault draws (default
	// math/rand/v2). The server calls it with its lock held, so it need not
	// be safe for concurrent use.
	Rand func() float64
}

// Stats are the server's counters since New.
type Stats struct {
	// Connections is the number of open WebSocket connections.
	Connections int64
	// Logins counts successful logins.
	Logins uint64
	// Sent counts accepted (acknowledged) messages.
	Sent uint64
	// Deliveries counts msg frames handed to send queues, one per
	// session, duplicates, self-sync and offline flushes included and
	// history answers not (see HistoryServed).
	Deliveries uint64
	// Dropped, Duplicated and Delayed count deliveries hit by each fault.
	Dropped, Duplicated, Delayed uint64
	// Held counts deliveries the reorder fault held back; Reordered those
	// of them released after a later one. One released by the
	// reorderHold timeout was not reordered, only late.
	Held, Reordered uint64
	// Stalled counts msg frames discarded by the stall fault (see
	// Server.Stall), one per session, offline backlogs discarded at a
	// stalled login included.
	Stalled uint64
	// SlowConsumerKicks counts connections closed with CloseSlowConsumer.
	SlowConsumerKicks uint64
	// OfflineQueued counts deliveries put in an offline queue, and
	// OfflineDropped those dropped from or refused by one.
	OfflineQueued, OfflineDropped uint64
	// DroppedPush counts deliveries whose push the DropPush fault
	// discarded, and SkippedDevice those that skipped a session.
	DroppedPush, SkippedDevice uint64
	// DeviceLimit counts logins past Options.MaxDevices: under
	// DevicePolicyOldest those that closed the user's oldest session,
	// under DevicePolicyRefuse those refused.
	DeviceLimit uint64
	// HistoryServed counts msg frames sent in history answers, and
	// HistoryEvicted messages that fell out of history past its bounds.
	HistoryServed, HistoryEvicted uint64
	// CapacityQueued counts deliveries that waited in the Capacity
	// queue, CapacityDropped those it shed.
	CapacityQueued, CapacityDropped uint64
	// Refused counts the sends the Refuse fault refused.
	Refused uint64
}

type counters struct {
	connections                                   atomic.Int64
	logins, sent, deliveries                      atomic.Uint64
	dropped, duplicated, held, reordered, delayed atomic.Uint64
	stalled                                       atomic.Uint64
	slowConsumerKicks, offlineQueued, offlineDrop atomic.Uint64
	droppedPush, skippedDevice, deviceLimit       atomic.Uint64
	historyServed                                 atomic.Uint64
	capacityQueued, capacityDropped               atomic.Uint64
	refused                                       atomic.Uint64
}

// Server is the reference IM server. Its methods are safe for concurrent
// use.
type Server struct {
	opts   Options
	log    *slog.Logger
	rand   func() float64
	faults atomic.Pointer[Faults]
	up     websocket.Upgrader
	// pollUp upgrades the connections the Poller reads: wsframe hands
	// gorilla one frame at a time and its reader is empty between them,
	// so its read buffer need hold no more than a frame header's worth
	// (128 bytes, gorilla's least is 125), which costs a copy from
	// wsframe's buffer per 128 bytes of a frame and saves 896 bytes a
	// connection.
	pollUp websocket.Upgrader
	mux    *http.ServeMux
	// poller reads the connections; track starts it with the first one
	// (a server that never serves holds none), unless Options.NoReactor
	// or noPoller, which says it could not start. Guarded by mu until
	// Close.
	poller   *netpoll.Poller
	noPoller bool
	// bufs holds read buffers between frames, so that 10k idle
	// connections do not each keep one of up to MaxFrame.
	bufs  sync.Pool
	epoch time.Time
	stats counters

	// done is closed by Close; the delay line and Serve watch it.
	done      chan struct{}
	closeOnce sync.Once
	// conns counts connection handlers (each owns its writer); bg counts
	// the delay line.
	conns, bg sync.WaitGroup

	// mu guards everything below. One lock for all routing state is a
	// choice: sequence numbers, acks, deliveries and offline queues must
	// agree on one order, and every step under it is a non-blocking
	// channel send or a map update.
	mu     sync.Mutex
	closed bool
	live   map[*conn]struct{}
	// users holds each user's sessions in login order, closing ones
	// until they are gone.
	users    map[string][]*conn
	offline  map[string]*offlineQueue
	offBytes int64
	groups   map[string]*group
	// stalled holds the users under the stall fault.
	stalled map[string]struct{}
	// convs holds every conversation's seq and kept messages; hist is
	// the bookkeeping of the latter.
	convs map[string]*conversation
	hist  history
	// userDirect and userGroups index each user's conversations for
	// seqs: the direct ones with a message (up to maxUserDirect), the
	// names of the groups the user is a member of.
	userDirect map[string][]*conversation
	userGroups map[string]map[string]struct{}
	// logins numbers logins, so that a delivery held for a session that
	// closes can tell which of the user's sessions came after it.
	logins uint64
	msgID  uint64
	delays delayHeap
	delayN uint64
	// capNext is when (s.now) the Capacity queue next lets a delivery
	// go.
	capNext  int64
	delaying bool
	wake     chan struct{}
}

type group struct {
	members []string // fan-out order: as given
	set     map[string]struct{}
}

type offlineQueue struct {
	frames [][]byte
}

// validate returns every option out of range, each naming its field.
func (opts Options) validate() error {
	var errs []error
	if err := opts.Faults.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("target: Options.%w", err))
	}
	if opts.SendBuffer < 0 {
		errs = append(errs, fmt.Errorf("target: Options.SendBuffer = %d: must not be negative", opts.SendBuffer))
	}
	if opts.SendQueue < 0 {
		errs = append(errs, fmt.Errorf("target: Options.SendQueue = %d: must not be negative", opts.SendQueue))
	}
	if opts.OfflineQueue < 0 {
		errs = append(errs, fmt.Errorf("target: Options.OfflineQueue = %d: must not be negative", opts.OfflineQueue))
	}
	if opts.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("target: Options.IdleTimeout = %v: must not be negative", opts.IdleTimeout))
	}
	if opts.MaxFrame < 0 {
		errs = append(errs, fmt.Errorf("target: Options.MaxFrame = %d: must not be negative", opts.MaxFrame))
	}
	if opts.MaxDevices < 0 {
		errs = append(errs, fmt.Errorf("target: Options.MaxDevices = %d: must not be negative", opts.MaxDevices))
	}
	switch opts.DevicePolicy {
	case "", DevicePolicyOldest, DevicePolicyRefuse:
	default:
		errs = append(errs, fmt.Errorf("target: Options.DevicePolicy = %q: want %q or %q", opts.DevicePolicy, DevicePolicyOldest, DevicePolicyRefuse))
	}
	if opts.HistoryBytes < 0 {
		errs = append(errs, fmt.Errorf("target: Options.HistoryBytes = %d: must not be negative", opts.HistoryBytes))
	}
	for i, u := range opts.Stall {
		if u == "" {
			// No user has an empty name: this is a mistake, such as
			// a doubled comma, that would stall nobody.
			errs = append(errs, fmt.Errorf("target: Options.Stall[%d] is empty: want a user name", i))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns opts with each zero option at its default.
func (opts Options) withDefaults() Options {
	if opts.SendQueue == 0 {
		opts.SendQueue = DefaultSendQueue
	}
	if opts.OfflineQueue == 0 {
		opts.OfflineQueue = DefaultOfflineQueue
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.MaxFrame == 0 {
		opts.MaxFrame = DefaultMaxFrame
	}
	if opts.MaxDevices == 0 {
		opts.MaxDevices = DefaultMaxDevices
	}
	if opts.DevicePolicy == "" {
		opts.DevicePolicy = DevicePolicyOldest
	}
	switch {
	case opts.HistoryLimit == 0:
		opts.HistoryLimit = DefaultHistoryLimit
	case opts.HistoryLimit < 0:
		opts.HistoryLimit = 0
	}
	if opts.HistoryBytes == 0 {
		opts.HistoryBytes = DefaultHistoryBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Rand == nil {
		opts.Rand = rand.Float64
	}
	return opts
}

// New validates opts, fills in defaults and returns a server that is ready
// to serve through Handler or Serve.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	opts.Secret = bytes.Clone(opts.Secret)
	s := &Server{
		opts:       opts,
		log:        opts.Logger,
		rand:       opts.Rand,
		epoch:      time.Now(),
		done:       make(chan struct{}),
		live:       make(map[*conn]struct{}),
		users:      make(map[string][]*conn),
		offline:    make(map[string]*offlineQueue),
		groups:     make(map[string]*group),
		stalled:    make(map[string]struct{}, len(opts.Stall)),
		convs:      make(map[string]*conversation),
		hist:       history{limit: opts.HistoryLimit, maxBytes: opts.HistoryBytes},
		userDirect: make(map[string][]*conversation),
		userGroups: make(map[string]map[string]struct{}),
		wake:       make(chan struct{}, 1),
	}
	f := opts.Faults
	s.faults.Store(&f)
	for _, u := range opts.Stall {
		s.stalled[u] = struct{}{}
	}
	// s.stalled is the truth from here on; the caller's slice is not kept.
	s.opts.Stall = nil
	s.up = websocket.Upgrader{
		// Small buffers and a shared write pool keep an idle connection
		// to a few KiB: the server is meant to hold 10k+ of them.
		ReadBufferSize:  1024,
		WriteBufferSize: 1024,
		WriteBufferPool: &sync.Pool{},
		// Any origin: this is a test target that probers (and browsers
		// on any page) connect to on purpose; there is no cookie or
		// ambient authority for a cross-site page to abuse.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	s.pollUp = s.up
	s.pollUp.ReadBufferSize = 128
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /ws", s.serveWS)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	if len(opts.Secret) == 0 {
		s.log.Warn("no secret configured: accepting any non-empty token")
	}
	return s, nil
}

// Handler serves the WebSocket endpoint /ws and /healthz. Connections it
// accepts are closed by Close.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve accepts connections on ln until ctx is done or Close is called,
// then closes every connection with 1001 and returns once all of the
// server's goroutines have exited, within about a second. It returns nil
// after such a shutdown and the listener's error otherwise.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler: s.mux,
		// Slow headers would hold a goroutine and a file per connection
		// before the server even knows it is a WebSocket.
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }() // exits when hs is shut down
	var err error
	select {
	case <-ctx.Done():
	case <-s.done:
	case err = <-errc:
		err = fmt.Errorf("target: serve: %w", err)
	}
	// Stop accepting first, so Close does not race with new connections
	// it would only have to turn away; hijacked WebSockets are not
	// http.Server's to wait for, they are Close's.
	sctx, cancel := context.WithTimeout(context.Background(), closeGrace)
	if serr := hs.Shutdown(sctx); serr != nil {
		_ = hs.Close()
	}
	cancel()
	s.Close()
	if err == nil {
		<-errc
	}
	return err
}

// Close closes every connection with 1001 (going away) and returns once all
// of the server's goroutines have exited, within about a second. Later
// calls wait for the first and return.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		conns := make([]*conn, 0, len(s.live))
		for c := range s.live {
			conns = append(conns, c)
		}
		s.delays = nil
		s.mu.Unlock()
		close(s.done)
		for _, c := range conns {
			if !c.closeWith(websocket.CloseGoingAway, "server shutting down") {
				c.hurry()
			}
		}
		s.conns.Wait()
		s.bg.Wait()
		if s.poller != nil {
			_ = s.poller.Close()
		}
		s.log.Info("server closed", "connections", len(conns))
	})
}

// SetFaults replaces the faults from the next delivery on. Out-of-range
// values are clamped into range; call Faults.Validate first to reject them
// instead.
func (s *Server) SetFaults(f Faults) {
	if err := f.Validate(); err != nil {
		s.log.Warn("clamping faults", "err", err)
		f = f.clamp()
	}
	s.faults.Store(&f)
}

// Stall turns the stall fault on or off for user, from the next delivery
// on. While it is on, every session of user, the current one and those of
// later logins, is stalled: it stays open, its pings are answered and its
// own sends acked and delivered, but every delivery to it is discarded
// and counted in Stats.Stalled, as Tinode does to a session it has
// detached from a topic for reading too slowly. The user need not have
// logged in yet. Turning the stall off resumes deliveries; what was
// discarded meanwhile stays lost.
func (s *Server) Stall(user string, on bool) {
	s.mu.Lock()
	_, was := s.stalled[user]
	if on {
		s.stalled[user] = struct{}{}
	} else {
		delete(s.stalled, user)
	}
	s.mu.Unlock()
	if was != on {
		s.log.Info("stall fault", "user", user, "on", on)
	}
}

// stalls reports whether user is under the stall fault. Called with mu
// held.
func (s *Server) stalls(user string) bool {
	if len(s.stalled) == 0 {
		return false
	}
	_, ok := s.stalled[user]
	return ok
}

// Stats returns a snapshot of the server's counters. Each counter is read
// atomically, the snapshot as a whole is not.
func (s *Server) Stats() Stats {
	// Routing counts under mu, after handing a frame to its writer: taking
	// mu here means a frame the caller has read is already counted.
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.stats
	return Stats{
		Connections:       c.connections.Load(),
		Logins:            c.logins.Load(),
		Sent:              c.sent.Load(),
		Deliveries:        c.deliveries.Load(),
		Dropped:           c.dropped.Load(),
		Duplicated:        c.duplicated.Load(),
		Held:              c.held.Load(),
		Reordered:         c.reordered.Load(),
		Stalled:           c.stalled.Load(),
		Delayed:           c.delayed.Load(),
		SlowConsumerKicks: c.slowConsumerKicks.Load(),
		OfflineQueued:     c.offlineQueued.Load(),
		OfflineDropped:    c.offlineDrop.Load(),
		DroppedPush:       c.droppedPush.Load(),
		CapacityQueued:    c.capacityQueued.Load(),
		CapacityDropped:   c.capacityDropped.Load(),
		Refused:           c.refused.Load(),
		SkippedDevice:     c.skippedDevice.Load(),
		DeviceLimit:       c.deviceLimit.Load(),
		HistoryServed:     c.historyServed.Load(),
		HistoryEvicted:    s.hist.evicted,
	}
}

// Token returns the login token of user for a server keyed with secret: the
// lowercase hex HMAC-SHA256 of the user name.
func Token(secret []byte, user string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(user))
	return hex.EncodeToString(m.Sum(nil))
}

// authorized reports whether token logs user in.
func (s *Server) authorized(user, token string) bool {
	if token == "" {
		return false
	}
	if len(s.opts.Secret) == 0 {
		return true
	}
	return hmac.Equal([]byte(token), []byte(Token(s.opts.Secret, user)))
}

// track counts a new connection handler, unless the server is closed, and
// returns the Poller to read it with (nil: a goroutine reads it). The
// count is taken under mu so that no handler starts after Close has begun
// waiting.
func (s *Server) track() (*netpoll.Poller, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false
	}
	if s.poller == nil && !s.opts.NoReactor && !s.noPoller {
		p, err := netpoll.New()
		if err != nil {
			// No epoll here: a goroutine reads each connection.
			s.log.Info("connections read by a goroutine each", "reason", err)
			s.noPoller = true
		}
		s.poller = p
	}
	s.conns.Add(1)
	return s.poller, true
}

// getBuf and putBuf recycle read buffers. Buffers that grew for a large
// frame are let go rather than pinned in the pool.
func (s *Server) getBuf() *bytes.Buffer {
	if b, ok := s.bufs.Get().(*bytes.Buffer); ok {
		return b
	}
	return new(bytes.Buffer)
}

func (s *Server) putBuf(b *bytes.Buffer) {
	if b.Cap() > 64<<10 {
		return
	}
	b.Reset()
	s.bufs.Put(b)
}
