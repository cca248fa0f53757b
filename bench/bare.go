package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// BareReader is the baseline of the throughput comparison: the least a
// client must do to take a delivery off the wire. It holds connections
// dialled exactly as imcanary's reference driver dials them (512-byte read
// buffers, a shared pool of write buffers) and reads each frame whole
// through NextReader into a pooled buffer, as imcanary's read loop does,
// then counts it: no read deadline, no timestamp, no decoding, no ledger.
// Everything imcanary does beyond this is what the ratio charges it for.
type BareReader struct {
	// URL is the flood server's WebSocket endpoint.
	URL string
	// Conns is how many connections to hold.
	Conns int
}

// counter is one connection's frame count, alone on its cache line: each
// read loop writes its own on every frame, and a shared one would bounce
// between cores and slow the baseline down.
type counter struct {
	n atomic.Int64
	_ [56]byte
}

var barePool = &sync.Pool{}

// bufPool holds frame buffers between frames, as imcanary's wsframe does.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Run logs every connection in, writes "ready" to out, then answers each
// line read from in with the number of frames read so far. It returns when
// in ends (the bench closed it, or died) or ctx is done.
func (b BareReader) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	if b.Conns < 1 {
		return fmt.Errorf("bare reader: %d connections: want at least 1", b.Conns)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dialer := &websocket.Dialer{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   512,
		WriteBufferSize:  4096,
		WriteBufferPool:  barePool,
	}
	counts := make([]counter, b.Conns)
	conns := make([]*websocket.Conn, 0, b.Conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range b.Conns {
		c, _, err := dialer.DialContext(ctx, b.URL, nil)
		if err != nil {
			return fmt.Errorf("bare reader: dial %s: %w", b.URL, err)
		}
		conns = append(conns, c)
		if err := login(c, kindBare+"-u"+strconv.Itoa(i)); err != nil {
			return fmt.Errorf("bare reader: %w", err)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Closing the connections ends every read loop.
	defer func() {
		for _, c := range conns {
			c.NetConn().Close()
		}
	}()
	for i, c := range conns {
		// Exits when its connection is closed.
		wg.Go(func() { readBare(c, &counts[i].n) })
	}
	go func() {
		// Unblocks the scan of in below when ctx ends first.
		<-ctx.Done()
		if c, ok := in.(io.Closer); ok {
			c.Close()
		}
	}()
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var total int64
		for i := range counts {
			total += counts[i].n.Load()
		}
		if _, err := fmt.Fprintln(out, total); err != nil {
			return err
		}
	}
	return nil
}

// login logs user in to a target without a secret (the flood server).
func login(c *websocket.Conn, user string) error { return loginWith(c, user, "open") }

// loginWith sends the reference server's login frame and waits for its
// reply.
func loginWith(c *websocket.Conn, user, token string) error {
	if err := c.WriteMessage(websocket.TextMessage, []byte(`{"type":"login","id":"login","user":"`+user+`","token":"`+token+`"}`)); err != nil {
		return fmt.Errorf("login %s: %w", user, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, msg, err := c.ReadMessage()
	if err != nil {
		return fmt.Errorf("login %s: %w", user, err)
	}
	if string(msg) != `{"type":"login_ok","id":"login"}` {
		return fmt.Errorf("login %s: reply %q", user, msg)
	}
	return c.SetReadDeadline(time.Time{})
}

// readBare is the bare read loop.
func readBare(c *websocket.Conn, n *atomic.Int64) {
	var count int64
	for {
		_, r, err := c.NextReader()
		if err != nil {
			return
		}
		bp := bufPool.Get().(*[]byte)
		buf := (*bp)[:0]
		for {
			if len(buf) == cap(buf) {
				buf = append(buf, 0)[:len(buf)]
			}
			k, err := r.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+k]
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				*bp = buf
				bufPool.Put(bp)
				return
			}
		}
		*bp = buf
		bufPool.Put(bp)
		count++
		n.Store(count)
	}
}
