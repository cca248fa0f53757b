package conformance

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy is a TCP forwarder on loopback between an adapter and its server.
// It sees every connection the adapter opens to the session endpoint, so
// that the suite can tell whether one was left open, and it can go silent
// on the open ones (freeze) as a peer that died without a FIN does: the
// bytes stay in its buffers, nothing is closed, and only the adapter's own
// idle deadline can notice.
type proxy struct {
	ln     net.Listener
	target string

	mu   sync.Mutex
	open map[*pair]bool
	wg   sync.WaitGroup
}

// pair is one proxied connection: the adapter's side and the server's.
type pair struct {
	client, server net.Conn
	// frozen: what either side writes is read and dropped.
	frozen atomic.Bool
}

// newProxy forwards a loopback port to target (host:port) until the test
// ends.
func newProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, open: map[*pair]bool{}}
	p.wg.Go(p.accept)
	tb.Cleanup(p.close)
	return p
}

// Addr is the host:port the adapter dials instead of target.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		p.open[pr] = true
		p.mu.Unlock()
		var done sync.WaitGroup
		done.Go(func() { p.copy(pr, pr.server, pr.client) })
		done.Go(func() { p.copy(pr, pr.client, pr.server) })
		p.wg.Go(func() {
			done.Wait()
			p.mu.Lock()
			delete(p.open, pr)
			p.mu.Unlock()
		})
	}
}

// copy moves bytes from src to dst until either side ends, then closes
// both, as the kernel would pass on a FIN or a reset. Once frozen, the
// server's end is not passed on: a dead peer's FIN never arrives, and
// only the adapter's own deadline may end its side.
func (p *proxy) copy(pr *pair, dst, src net.Conn) {
	defer func() {
		if src == pr.server && pr.frozen.Load() {
			return
		}
		pr.client.Close()
		pr.server.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pr.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Freeze makes every connection open now go silent both ways for good:
// what either side writes is read and dropped, never passed on, and
// neither side is closed. A connection the adapter closes is still seen
// closed (its forwarder's read ends), so that Open can tell. Connections
// made later pass: the peer a reconnect reaches is alive.
func (p *proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.open {
		pr.frozen.Store(true)
	}
}

// Open returns how many proxied connections are open: ones whose
// adapter side has not been closed.
func (p *proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.open)
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for pr := range p.open {
		pr.client.Close()
		pr.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
