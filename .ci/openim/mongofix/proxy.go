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
}

// New returns a proxy to the MongoDB-protocol server at upstream, an
// address of network ("tcp" or "unix").
func New(network, upstream string, logger *slog.Logger) *Proxy {
	p := &Proxy{network: network, upstream: upstream, logger: logger, counts: map[string]*atomic.Int64{}}
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

// serveConn pumps one client connection to its own upstream connection,
// one goroutine a direction. Requests a rewrite changed wait in pending,
// by request id, for their reply: an entry lives as long as its command is
// in flight, and the map goes with the connection.
func (p *Proxy) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	u, err := p.dialer.DialContext(ctx, p.network, p.upstream)
	if err != nil {
		p.logger.Warn("mongofix: upstream unreachable", "upstream", p.upstream, "err", err)
		return
	}
	defer u.Close()
	stop := context.AfterFunc(ctx, func() { c.Close(); u.Close() })
	defer stop()

	var (
		mu      sync.Mutex
		pending = map[int32]func(bson.D) bson.D{}
	)
	done := make(chan error, 1)
	go func() {
		done <- p.pump(u, c, func(m opMsg) (func(bson.D) bson.D, bool) {
			mu.Lock()
			defer mu.Unlock()
			fix, ok := pending[m.responseTo]
			delete(pending, m.responseTo)
			return fix, ok
		})
		c.Close()
	}()
	err = p.requests(c, u, func(id int32, fix func(bson.D) bson.D) {
		mu.Lock()
		pending[id] = fix
		mu.Unlock()
	})
	u.Close()
	if rerr := <-done; err == nil {
		err = rerr
	}
	if err != nil && !closed(err) {
		p.logger.Warn("mongofix: connection ended", "client", c.RemoteAddr().String(), "err", err)
	}
}

// requests carries client messages upstream, rewriting those a rewrite
// matches; wait registers the reply's mend before the request leaves.
func (p *Proxy) requests(c, u net.Conn, wait func(int32, func(bson.D) bson.D)) error {
	for {
		msg, err := readMessage(c)
		if err != nil {
			return err
		}
		m, ok, err := parseOpMsg(msg)
		if err != nil {
			return fmt.Errorf("from client: %w", err)
		}
		if ok {
			if out, changed, err := p.rewriteRequest(m, wait); err != nil {
				return err
			} else if changed {
				msg = out
			}
		}
		if _, err := u.Write(msg); err != nil {
			return err
		}
	}
}

func (p *Proxy) rewriteRequest(m opMsg, wait func(int32, func(bson.D) bson.D)) ([]byte, bool, error) {
	first, err := m.body.IndexErr(0)
	if err != nil {
		return nil, false, fmt.Errorf("from client: command body: %w", err)
	}
	rw := find(first.Key())
	if rw == nil {
		return nil, false, nil
	}
	var cmd bson.D
	if err := bson.Unmarshal(m.body, &cmd); err != nil {
		return nil, false, fmt.Errorf("from client: %s: %w", rw.command, err)
	}
	out, fix, ok := rw.request(cmd)
	if !ok {
		return nil, false, nil
	}
	body, err := bson.Marshal(out)
	if err != nil {
		return nil, false, fmt.Errorf("%s: rewritten command: %w", rw.name, err)
	}
	m.body = body
	if fix != nil && m.flags&wiremessage.MoreToCome == 0 {
		wait(m.requestID, fix)
	}
	p.counts[rw.name].Add(1)
	return m.bytes(), true, nil
}

// pump carries upstream replies to the client, mending those whose
// request a rewrite changed.
func (p *Proxy) pump(u, c net.Conn, mend func(opMsg) (func(bson.D) bson.D, bool)) error {
	for {
		msg, err := readMessage(u)
		if err != nil {
			return err
		}
		m, ok, err := parseOpMsg(msg)
		if err != nil {
			return fmt.Errorf("from upstream: %w", err)
		}
		if ok {
			if fix, wanted := mend(m); wanted {
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
		if _, err := c.Write(msg); err != nil {
			return err
		}
	}
}

// closed says err is how a connection ends, not a fault worth a warning.
func closed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}
