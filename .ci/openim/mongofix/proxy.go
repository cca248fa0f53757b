// Package mongofix is a MongoDB wire-protocol proxy that sits in front of
// FerretDB v1 and rewrites the few commands OpenIM v3.8.3 sends that
// FerretDB cannot run into ones it can, mending their replies so that the
// client sees what MongoDB would have answered. Everything else passes
// through byte for byte. The list, and why each is there, is rewrites.
package mongofix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/mongo/driver/wiremessage"
)

// Proxy forwards MongoDB connections to an upstream server.
type Proxy struct {
	network  string
	upstream string
	logger   *slog.Logger
	dialer   net.Dialer
	counts   map[string]*atomic.Int64 // by rewrite name; fixed at New
	locks    locks
	slow     time.Duration

	statMu sync.Mutex
	stats  map[[2]string]*Timing // by command and collection
}

// Timing is how many commands of a kind were answered and how long they
// took in all.
type Timing struct {
	N     int64
	Total time.Duration
}

// Timings returns what each command, on each collection, has cost so
// far ("update msg" → count and time).
func (p *Proxy) Timings() map[string]Timing {
	p.statMu.Lock()
	defer p.statMu.Unlock()
	out := make(map[string]Timing, len(p.stats))
	for k, t := range p.stats {
		out[k[0]+" "+k[1]] = *t
	}
	return out
}

// New returns a proxy to the MongoDB-protocol server at upstream, an
// address of network ("tcp" or "unix"). A command whose reply takes slow
// or longer is logged (0: none is).
func New(network, upstream string, slow time.Duration, logger *slog.Logger) *Proxy {
	p := &Proxy{network: network, upstream: upstream, slow: slow, logger: logger,
		counts: map[string]*atomic.Int64{}, stats: map[[2]string]*Timing{}}
	for _, rw := range rewrites {
		p.counts[rw.name] = new(atomic.Int64)
	}
	return p
}

// Counts returns how many commands each rewrite has changed.
func (p *Proxy) Counts() map[string]int64 {
	out := make(map[string]int64, len(p.counts))
	for name, n := range p.counts {
		out[name] = n.Load()
	}
	return out
}

// TimingsString lists Timings, costliest first, for a log line at the end.
func (p *Proxy) TimingsString() string {
	t := p.Timings()
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return t[names[i]].Total > t[names[j]].Total })
	s := ""
	for _, n := range names {
		s += fmt.Sprintf("%s: %d in %v; ", n, t[n].N, t[n].Total.Round(time.Millisecond))
	}
	return s
}

// String lists the counts, for a log line at the end.
func (p *Proxy) String() string {
	c := p.Counts()
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	sort.Strings(names)
	s := ""
	for _, n := range names {
		s += fmt.Sprintf("%s=%d ", n, c[n])
	}
	return s
}

// Serve accepts connections on ln until ctx is done, then closes ln and
// every connection it opened, and returns once all are closed.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("mongofix accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.serveConn(ctx, c)
		}()
	}
}

// inflight is a command awaiting its reply, for the slow-command log.
type inflight struct {
	command, coll string
	at            time.Time
}

// conn is one client connection and its upstream connection, with a
// goroutine a direction. Requests a rewrite changed wait in pending, by
// request id, for their reply: an entry lives as long as its command is in
// flight, and the map goes with the connection. Emulated commands run on
// a second upstream connection of its own (side), one at a time, as the
// client's own requests come.
type conn struct {
	p          *Proxy
	client, up net.Conn

	wmu sync.Mutex // writes to client: the pump's and the emulations' replies

	mu      sync.Mutex
	pending map[int32]func(bson.D) bson.D
	started map[int32]inflight // every command awaiting its reply

	side   net.Conn // dialled at the first emulation
	nextID int32    // ids of what this conn writes itself
}

func (p *Proxy) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	u, err := p.dialer.DialContext(ctx, p.network, p.upstream)
	if err != nil {
		p.logger.Warn("mongofix: upstream unreachable", "upstream", p.upstream, "err", err)
		return
	}
	defer u.Close()
	cn := &conn{p: p, client: c, up: u, pending: map[int32]func(bson.D) bson.D{}, started: map[int32]inflight{}}
	stop := context.AfterFunc(ctx, func() {
		c.Close()
		u.Close()
		cn.closeSide()
	})
	defer stop()
	defer cn.closeSide()

	done := make(chan error, 1)
	go func() {
		done <- cn.pump()
		c.Close()
	}()
	err = cn.requests(ctx)
	u.Close()
	if rerr := <-done; err == nil {
		err = rerr
	}
	if err != nil && !closed(err) {
		p.logger.Warn("mongofix: connection ended", "client", c.RemoteAddr().String(), "err", err)
	}
}

// requests carries client messages upstream, rewriting those a rewrite
// matches and answering those it emulates.
func (cn *conn) requests(ctx context.Context) error {
	for {
		msg, err := readMessage(cn.client)
		if err != nil {
			return err
		}
		m, ok, err := parseOpMsg(msg)
		if err != nil {
			return fmt.Errorf("from client: %w", err)
		}
		if ok {
			cn.start(m)
			out, answered, err := cn.rewrite(ctx, m)
			switch {
			case err != nil:
				return err
			case answered:
				continue
			case out != nil:
				msg = out
			}
		}
		if _, err := cn.up.Write(msg); err != nil {
			return err
		}
	}
}

// rewrite returns the message to send instead of m (nil: m as it came),
// or answers m itself (answered).
func (cn *conn) rewrite(ctx context.Context, m opMsg) (out []byte, answered bool, err error) {
	first, err := m.body.IndexErr(0)
	if err != nil {
		return nil, false, fmt.Errorf("from client: command body: %w", err)
	}
	coll, _ := first.Value().StringValueOK()
	if !anyTakes(first.Key(), coll) {
		return nil, false, nil
	}
	c := &command{}
	if err := bson.Unmarshal(m.body, &c.body); err != nil {
		return nil, false, fmt.Errorf("from client: %s: %w", first.Key(), err)
	}
	for _, sq := range m.sequences {
		ds := seqDocs{ident: sq.ident, docs: make([]bson.D, len(sq.docs))}
		for i, d := range sq.docs {
			if err := bson.Unmarshal(d, &ds.docs[i]); err != nil {
				return nil, false, fmt.Errorf("from client: %s: %s: %w", first.Key(), sq.ident, err)
			}
		}
		c.seqs = append(c.seqs, ds)
	}
	rw, mend, exec := match(c)
	switch {
	case rw == nil:
		return nil, false, nil
	case exec != nil:
		reply := exec(env{run: func(c bson.D) (bson.D, error) { return cn.sideRun(ctx, c) }, lock: cn.p.locks.lock})
		cn.p.counts[rw.name].Add(1)
		if m.flags&wiremessage.MoreToCome != 0 {
			return nil, true, nil // the client wants no answer
		}
		cn.done(m.requestID)
		return nil, true, cn.answer(m.requestID, reply)
	}
	if m.body, err = bson.Marshal(c.body); err != nil {
		return nil, false, fmt.Errorf("%s: rewritten command: %w", rw.name, err)
	}
	for i, ds := range c.seqs {
		for j, d := range ds.docs {
			if m.sequences[i].docs[j], err = bson.Marshal(d); err != nil {
				return nil, false, fmt.Errorf("%s: rewritten %s: %w", rw.name, ds.ident, err)
			}
		}
	}
	if mend != nil && m.flags&wiremessage.MoreToCome == 0 {
		cn.mu.Lock()
		cn.pending[m.requestID] = mend
		cn.mu.Unlock()
	}
	cn.p.counts[rw.name].Add(1)
	return m.bytes(), false, nil
}

// start notes m's start, for Timings and the slow-command log; a command
// that wants no reply (moreToCome) is not timed.
func (cn *conn) start(m opMsg) {
	if m.flags&wiremessage.MoreToCome != 0 {
		return
	}
	first, err := m.body.IndexErr(0)
	if err != nil {
		return
	}
	coll, _ := first.Value().StringValueOK()
	cn.mu.Lock()
	cn.started[m.requestID] = inflight{command: first.Key(), coll: coll, at: time.Now()}
	cn.mu.Unlock()
}

// done logs the command answered by the reply to id if it took longer
// than the proxy's slow threshold: FerretDB on SQLite slows down by
// collection scans long before it fails, and this is where it shows.
func (cn *conn) done(id int32) {
	cn.mu.Lock()
	f, ok := cn.started[id]
	delete(cn.started, id)
	cn.mu.Unlock()
	if !ok {
		return
	}
	took := time.Since(f.at)
	cn.p.statMu.Lock()
	k := [2]string{f.command, f.coll}
	t := cn.p.stats[k]
	if t == nil {
		t = &Timing{}
		cn.p.stats[k] = t
	}
	t.N++
	t.Total += took
	cn.p.statMu.Unlock()
	if cn.p.slow > 0 && took >= cn.p.slow {
		cn.p.logger.Warn("mongofix: slow command", "command", f.command, "collection", f.coll, "took", took.Round(time.Millisecond))
	}
}

// answer writes reply to the client as the answer to request id.
func (cn *conn) answer(id int32, reply bson.D) error {
	body, err := bson.Marshal(reply)
	if err != nil {
		return fmt.Errorf("emulated reply: %w", err)
	}
	cn.nextID++
	msg := opMsg{requestID: cn.nextID, responseTo: id, body: body}.bytes()
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	_, err = cn.client.Write(msg)
	return err
}

// sideRun sends cmd on the side connection and returns its reply.
func (cn *conn) sideRun(ctx context.Context, cmd bson.D) (bson.D, error) {
	cn.mu.Lock()
	side := cn.side
	cn.mu.Unlock()
	if side == nil {
		c, err := cn.p.dialer.DialContext(ctx, cn.p.network, cn.p.upstream)
		if err != nil {
			return nil, fmt.Errorf("side connection: %w", err)
		}
		cn.mu.Lock()
		cn.side, side = c, c
		cn.mu.Unlock()
		if ctx.Err() != nil { // closeSide may have run before it was set
			c.Close()
			return nil, ctx.Err()
		}
	}
	body, err := bson.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	cn.nextID++
	id := cn.nextID
	if _, err := side.Write(opMsg{requestID: id, body: body}.bytes()); err != nil {
		return nil, fmt.Errorf("side connection: %w", err)
	}
	msg, err := readMessage(side)
	if err != nil {
		return nil, fmt.Errorf("side connection: %w", err)
	}
	m, ok, err := parseOpMsg(msg)
	switch {
	case err != nil:
		return nil, fmt.Errorf("side connection: %w", err)
	case !ok || m.responseTo != id:
		return nil, fmt.Errorf("side connection: a reply to %d, not to %d", m.responseTo, id)
	}
	var reply bson.D
	if err := bson.Unmarshal(m.body, &reply); err != nil {
		return nil, fmt.Errorf("side connection: reply: %w", err)
	}
	return reply, nil
}

func (cn *conn) closeSide() {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.side != nil {
		cn.side.Close()
	}
}

// pump carries upstream replies to the client, mending those whose
// request a rewrite changed.
func (cn *conn) pump() error {
	for {
		msg, err := readMessage(cn.up)
		if err != nil {
			return err
		}
		m, ok, err := parseOpMsg(msg)
		if err != nil {
			return fmt.Errorf("from upstream: %w", err)
		}
		if ok {
			cn.mu.Lock()
			fix, wanted := cn.pending[m.responseTo]
			delete(cn.pending, m.responseTo)
			cn.mu.Unlock()
			cn.done(m.responseTo)
			if wanted {
				var reply bson.D
				if err := bson.Unmarshal(m.body, &reply); err != nil {
					return fmt.Errorf("from upstream: reply: %w", err)
				}
				// A reply that cannot be mended closes the connection:
				// the client sees an error, never a wrong answer.
				body, err := bson.Marshal(fix(reply))
				if err != nil {
					return fmt.Errorf("mended reply: %w", err)
				}
				m.body = body
				msg = m.bytes()
			}
		}
		cn.wmu.Lock()
		_, err = cn.client.Write(msg)
		cn.wmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// closed says err is how a connection ends, not a fault worth a warning.
func closed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}
