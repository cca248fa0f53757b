// Package longpoll is the connection layer of protocols that push nothing:
// a client asks over HTTP and the server holds the request open until it
// has something to say or its wait runs out (Matrix's /sync). It is
// wsconn's counterpart for them: the dialing (a probe.Link's slow socket
// or source address), a bounded pool of HTTP connections, the time a
// response came off the wire, one request in flight per session's poll,
// the requests a session makes beside it (sends), and the classing of how
// a session ended. An adapter is the protocol: it builds each request and
// reads each answer; it never touches the connections.
package longpoll

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// Settings are what every request of one adapter shares. An adapter makes
// them once, with NewPool, in its constructor.
type Settings struct {
	// Header goes with every request: the User-Agent and the configured
	// target.headers. A request's own headers (its Authorization) are set
	// beside them.
	Header http.Header
	// MaxConns bounds the HTTP connections open to the server through one
	// kind of link (see Pool), idle or busy. A request that finds them
	// all busy waits for one, for as long as its own deadline allows.
	// Default 4096.
	MaxConns int
	// DialTimeout bounds a dial and its TLS handshake. Default 10 s.
	DialTimeout time.Duration
	// MaxBody bounds one response body; a longer one is an error, never a
	// truncated read. Default 4 MiB.
	MaxBody int64
	// Grace is how long past its hold (and a dial) a poll may go
	// unanswered before its session is dead. Default 10 s.
	Grace time.Duration
	// Dial, if set, opens connections in place of a TCP dial over the
	// link, whose socket options then do not apply: tests point it at an
	// in-memory network (internal/memnet) to run in a synctest bubble.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Defaults of the zero Settings fields.
const (
	DefaultMaxConns    = 4096
	DefaultDialTimeout = 10 * time.Second
	DefaultMaxBody     = 4 << 20
	DefaultGrace       = 10 * time.Second
)

// Pool is an adapter's HTTP connections, shared by its sessions: one
// http.Transport per kind of link (slow or not, from which source
// address), each bounded by MaxConns, created on first use. Safe for
// concurrent use.
type Pool struct {
	s  Settings
	mu sync.Mutex
	// clients has one entry per probe.Link seen: a population uses a
	// handful (a source address per IP, slow or not).
	clients map[probe.Link]*http.Client
}

// NewPool returns a pool with s's zero fields at their defaults.
func NewPool(s Settings) *Pool {
	if s.MaxConns <= 0 {
		s.MaxConns = DefaultMaxConns
	}
	if s.DialTimeout <= 0 {
		s.DialTimeout = DefaultDialTimeout
	}
	if s.MaxBody <= 0 {
		s.MaxBody = DefaultMaxBody
	}
	if s.Grace <= 0 {
		s.Grace = DefaultGrace
	}
	return &Pool{s: s, clients: make(map[probe.Link]*http.Client)}
}

// client returns the client that dials over link.
func (p *Pool) client(link probe.Link) *http.Client {
	// A transport is per kind of link, not per population: pooled
	// connections are not timed per connect.
	link.Connect = nil
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[link]; c != nil {
		return c
	}
	dial := wsconn.NetDialer(link)
	if p.s.Dial != nil {
		dial = p.s.Dial
	}
	t := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, p.s.DialTimeout)
			defer cancel()
			return dial(ctx, network, addr)
		},
		TLSHandshakeTimeout: p.s.DialTimeout,
		MaxConnsPerHost:     p.s.MaxConns,
		// Every connection may be idle between two polls of its
		// session: keep them all rather than dial again.
		MaxIdleConns:        p.s.MaxConns,
		MaxIdleConnsPerHost: p.s.MaxConns,
		IdleConnTimeout:     90 * time.Second,
		// A session's connection holds its buffers for life: smaller
		// than net/http's 4 KiB, as the answers to a poll are mostly
		// small and a larger one is read in several calls.
		WriteBufferSize: 1 << 10,
		ReadBufferSize:  2 << 10,
	}
	c := &http.Client{
		Transport: t,
		// A redirect could carry the Authorization header elsewhere;
		// none of these APIs redirects.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	p.clients[link] = c
	return c
}

// CloseIdle closes the pool's idle connections: a driver done with its
// server.
func (p *Pool) CloseIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.clients {
		c.CloseIdleConnections()
	}
}

// Response is a server's answer, read whole.
type Response struct {
	Status int
	// Header is the answer's (Mattermost's login sends its token in one).
	Header http.Header
	Body   []byte
	// At is when the first byte of the answer came off the socket (Unix
	// ns), as the connection's own reader saw it: the time from there to
	// the ledger is the prober's receive lag, not the server's latency.
	At int64
}

// Do sends req over link and reads the answer whole, within req's context.
// Any status is an answer; an error is a request that got none (the
// network, a deadline, a body past MaxBody), named by the URL without its
// query, which may hold a token.
func (p *Pool) Do(req *http.Request, link probe.Link) (*Response, error) {
	for k, v := range p.s.Header {
		if _, ok := req.Header[k]; !ok {
			req.Header[k] = v
		}
	}
	var first atomic.Int64
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { first.Store(time.Now().UnixNano()) }}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err := p.client(link).Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, probe.RedactURL(req.URL.String()), unwrapURL(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.s.MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", req.Method, probe.RedactURL(req.URL.String()), err)
	}
	if int64(len(body)) > p.s.MaxBody {
		return nil, fmt.Errorf("%s %s: %w", req.Method, probe.RedactURL(req.URL.String()), ErrTooLarge)
	}
	at := first.Load()
	if at == 0 {
		at = time.Now().UnixNano()
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: body, At: at}, nil
}

// ErrTooLarge is the error of an answer longer than Settings.MaxBody.
var ErrTooLarge = errors.New("answer larger than the limit")

// unwrapURL drops net/http's *url.Error, which repeats the full URL,
// query included: the caller names the URL itself, redacted.
func unwrapURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// Protocol is what an adapter does with its session's poll. Every method
// runs on Serve's goroutine.
type Protocol interface {
	// Next returns the next poll request, built with ctx, and how long
	// the server may hold it before it answers. Past that and a grace
	// the session is dead, as a WebSocket that reads nothing for two
	// heartbeats is.
	Next(ctx context.Context) (req *http.Request, hold time.Duration, err error)
	// Answer handles the answer to the last poll. An error ends the
	// session: a *probe.Disconnect as it is, anything else as an answer
	// the adapter could not read (a protocol error).
	Answer(r *Response) error
}

// Conn is one session's polling: the poll in flight, the requests the
// session makes beside it, and its end. Serve runs on the goroutine that
// owns the session; Go and Close may be called from others.
type Conn struct {
	pool *Pool
	link probe.Link
	// ctx is the session's: Close cancels it, which ends the poll in
	// flight and every request Go started.
	ctx     context.Context
	cancel  context.CancelFunc
	closing atomic.Bool
	// wg counts the requests Go started: Serve returns only once they
	// have, so that a session leaves no goroutine behind.
	wg sync.WaitGroup
}

// NewConn returns a session's polling over link, ended by Close. It keeps
// parent's values but not its end: the context a session is made with is
// usually its login's, which ends as the login returns.
func (p *Pool) NewConn(parent context.Context, link probe.Link) *Conn {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	return &Conn{pool: p, link: link, ctx: ctx, cancel: cancel}
}

// Context is the session's context, for the requests it builds.
func (c *Conn) Context() context.Context { return c.ctx }

// Do sends req over the session's link: a login or a catch-up fetch, on
// the caller's goroutine.
func (c *Conn) Do(req *http.Request) (*Response, error) { return c.pool.Do(req, c.link) }

// Go runs f on a goroutine of the session's own, which Serve waits for
// before it returns: a request made beside the poll (a send), whose
// answer must not wait for the poll's. It reports false, and runs
// nothing, once the session is closing.
func (c *Conn) Go(f func(ctx context.Context)) bool {
	if c.ctx.Err() != nil {
		return false
	}
	c.wg.Go(func() { f(c.ctx) })
	return true
}

// Serve polls until the session ends: one request in flight, the next
// built once the last one's answer is handled. It returns why the session
// ended, always as a *probe.Disconnect, after the requests Go started
// have returned.
func (c *Conn) Serve(p Protocol) error {
	err := c.serve(p)
	c.cancel()
	c.wg.Wait()
	return err
}

func (c *Conn) serve(p Protocol) error {
	for {
		ctx, cancel := context.WithCancel(c.ctx)
		req, hold, err := p.Next(ctx)
		if err != nil {
			cancel()
			return c.ended(err)
		}
		t := time.AfterFunc(hold+c.pool.s.DialTimeout+c.pool.s.Grace, cancel)
		r, err := c.Do(req)
		expired := !t.Stop()
		cancel()
		if err != nil {
			if expired && c.ctx.Err() == nil {
				err = fmt.Errorf("%w: no answer within %s of the poll's %s", ErrDeadPoll, c.pool.s.DialTimeout+c.pool.s.Grace, hold)
			}
			return c.ended(err)
		}
		if err := p.Answer(r); err != nil {
			return c.ended(err)
		}
	}
}

// ErrDeadPoll is the error of a poll the server held past its time.
var ErrDeadPoll = errors.New("server held the poll past its timeout")

// ended classes the error that ended Serve: imcanary's own close is a
// shutdown whatever the request said as it was cancelled; a
// *probe.Disconnect is the adapter's word; anything else is an error.
func (c *Conn) ended(err error) *probe.Disconnect {
	if c.closing.Load() {
		return &probe.Disconnect{Reason: metrics.ReasonShutdown}
	}
	if d, ok := errors.AsType[*probe.Disconnect](err); ok {
		return d
	}
	return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
}

// Close ends the session: the poll in flight is cancelled and Serve
// returns with reason shutdown. Nothing is said to the server: a long-poll
// session ends by not asking again. Idempotent.
func (c *Conn) Close() error {
	c.closing.Store(true)
	c.cancel()
	return nil
}

// Abort ends the session as a dropped link does: Serve returns with an
// error, not a shutdown. For tests that kill a session.
func (c *Conn) Abort() { c.cancel() }

// Closing reports whether Close has been called.
func (c *Conn) Closing() bool { return c.closing.Load() }
