package bench

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// The flood compares imcanary's receive path with a bare read loop on the
// same frames. A small server speaking the reference server's protocol
// writes real delivery frames (refserver/doc.go's "msg", carrying probe bodies
// that imcanary's ledger accepts) to the connections of one client at a
// time, round-robin, at a fixed rate, each frame in a write of its own as
// the target writes them. Both clients get the same stream at the same
// pace, and the comparison is CPU per delivery.
//
// The rate is fixed, rather than as fast as the client reads, because the
// cost of a delivery depends on how deliveries arrive. A client that falls
// behind finds many frames per read and never sleeps; one that keeps up,
// as a prober must, wakes and reads for almost every frame. Flooding each
// client as fast as it reads would measure the first regime for the bare
// loop and, the slower client, more of it for imcanary: neither is the
// prober's life. At a pace both keep up with, each delivery costs what it
// costs a real population, wake-up and read included.
//
// The server is not the reference server on purpose: the target decodes a
// send and fans it out for each delivery, which would cost the machine
// more than the clients being measured, on the same cores.

// Flood kinds: the prefix of the user names a client logs in with. Both are
// four letters, so that every frame is the same length for either client.
const (
	kindBare = "bare"
	kindReal = "real"
)

// floodServer serves the flood on one listener.
type floodServer struct {
	ln  net.Listener
	srv *http.Server
	run string // the RUN field of every body: not the prober's own run

	mu sync.Mutex
	// byKind holds the logged-in connections of each flooded kind.
	byKind map[string][]*floodConn
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// floodConn is one connection's write side.
type floodConn struct {
	// mu serialises writes: the pacer's frames and the reader's replies.
	// Frames are written raw, past gorilla's writer, so a reply written
	// by gorilla in the middle of one would corrupt the stream.
	mu  sync.Mutex
	nc  net.Conn
	gen *floodGen
	buf []byte
}

// floodWriteTimeout frees a pacer stuck on a client that stopped reading.
const floodWriteTimeout = 10 * time.Second

func (c *floodConn) write(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(floodWriteTimeout))
	_, err := c.nc.Write(b)
	return err
}

// frame writes the connection's next delivery.
func (c *floodConn) frame(now int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = c.gen.appendFrame(c.buf[:0], now)
	_ = c.nc.SetWriteDeadline(time.Now().Add(floodWriteTimeout))
	_, err := c.nc.Write(c.buf)
	return err
}

// newFloodServer listens on a free loopback port.
func newFloodServer() (*floodServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &floodServer{
		ln:     ln,
		run:    floodRun,
		byKind: map[string][]*floodConn{},
		conns:  map[net.Conn]struct{}{},
	}
	up := websocket.Upgrader{ReadBufferSize: 1024, WriteBufferSize: 1024, CheckOrigin: func(*http.Request) bool { return true }}
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.NetConn().Close()
			return
		}
		f.conns[c.NetConn()] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		defer f.wg.Done()
		f.serve(c)
	})
	f.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// Exits when close shuts the server down.
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

// floodRun is the RUN of every flood body: a run of no prober's, as a
// sender in another process would have.
const floodRun = "f100d000"

// url is the WebSocket endpoint.
func (f *floodServer) url() string { return "ws://" + f.ln.Addr().String() + "/ws" }

// ready returns how many connections of kind are logged in.
func (f *floodServer) ready(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byKind[kind])
}

// close stops the server and every connection, and waits for their
// goroutines.
func (f *floodServer) close() {
	_ = f.srv.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// clientFrame is what the flood server reads of a client frame.
type clientFrame struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	User string `json:"user"`
}

// serve reads one connection and answers its login, group and ping frames
// until it ends.
func (f *floodServer) serve(c *websocket.Conn) {
	fc := &floodConn{nc: c.NetConn()}
	var kind string
	defer func() {
		fc.nc.Close()
		f.mu.Lock()
		delete(f.conns, fc.nc)
		if kind != "" {
			f.byKind[kind] = slices.DeleteFunc(f.byKind[kind], func(o *floodConn) bool { return o == fc })
		}
		f.mu.Unlock()
	}()
	c.SetPingHandler(func(data string) error {
		return fc.write(appendWSFrame(nil, wsPong, []byte(data)))
	})
	c.SetCloseHandler(func(int, string) error { return nil })
	c.SetReadLimit(64 << 10)
	var fr clientFrame
	for first := true; ; first = false {
		_, b, err := c.ReadMessage()
		if err != nil {
			return
		}
		fr = clientFrame{}
		if json.Unmarshal(b, &fr) != nil {
			return
		}
		var reply []byte
		switch {
		case first && fr.Type == "login":
			// Only the population's users are flooded: the prober's
			// provisioning session wants its replies and nothing else.
			// A flooded connection is registered before its login_ok
			// is written, so that a client holding its reply is one
			// the flood reaches, and under fc.mu, so that no frame
			// goes out before that reply.
			fc.mu.Lock()
			k, _, _ := strings.Cut(fr.User, "-")
			if (k == kindBare || k == kindReal) && strings.HasPrefix(fr.User, k+"-u") {
				kind = k
				fc.gen = newFloodGen(f.run, fr.User)
				f.mu.Lock()
				f.byKind[kind] = append(f.byKind[kind], fc)
				f.mu.Unlock()
			}
			_ = fc.nc.SetWriteDeadline(time.Now().Add(floodWriteTimeout))
			_, err := fc.nc.Write(appendWSFrame(nil, wsText, appendReplyJSON(nil, "login_ok", fr.ID)))
			fc.mu.Unlock()
			if err != nil {
				return
			}
			continue
		case first:
			return
		case fr.Type == "group":
			reply = appendReplyJSON(nil, "ok", fr.ID)
		case fr.Type == "ping":
			reply = appendReplyJSON(nil, "pong", fr.ID)
		default:
			continue
		}
		if err := fc.write(appendWSFrame(nil, wsText, reply)); err != nil {
			return
		}
	}
}

// flood writes frames to the connections of kind, round-robin, at rate
// frames per second, until stop is closed, and returns how many it wrote.
// It keeps the rate on average: after a stall (a busy machine) it catches
// up by at most a tenth of a second's frames, as a server does not queue
// without bound either.
func (f *floodServer) flood(kind string, rate float64, stop <-chan struct{}) int {
	f.mu.Lock()
	conns := slices.Clone(f.byKind[kind])
	f.mu.Unlock()
	if len(conns) == 0 || rate <= 0 {
		<-stop
		return 0
	}
	start := time.Now()
	sent, next := 0, 0
	for {
		select {
		case <-stop:
			return sent
		default:
		}
		due := int(rate*time.Since(start).Seconds()) - sent
		if burst := int(rate / 10); due > burst {
			// Forgive what is owed beyond the burst.
			start = start.Add(time.Duration(float64(due-burst) / rate * float64(time.Second)))
			due = burst
		}
		if due <= 0 {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		// One clock read per burst: the receiver's latency figures are
		// not what the flood is for.
		now := time.Now().UnixNano()
		for range due {
			c := conns[next%len(conns)]
			next++
			// A failed write is a client gone; the bench notices.
			_ = c.frame(now)
			sent++
		}
	}
}

// floodGen writes one connection's deliveries. A user of a real population
// of groups of five receives one direct stream and four group streams (one
// per other member), so each connection gets five streams in that mix, in
// turn, each with its own sequence from 1, named as imcanary names its
// users, groups and streams.
type floodGen struct {
	run     string
	streams [5]floodStream
	next    int
	msgID   uint64
	payload []byte
}

type floodStream struct {
	sender          string
	to, group, conv string
	stream          string // the body's STREAM field
	seq             uint64
}

func newFloodGen(run, user string) *floodGen {
	g := &floodGen{run: run}
	// "bare-u7" and "real-u7" get the same senders, groups and frame
	// lengths.
	_, idx, _ := strings.Cut(user, "-u")
	grp := "flood-g" + idx
	for i := range g.streams {
		s := &g.streams[i]
		s.sender = "flood-u" + idx + "x" + strconv.Itoa(i)
		if i == 0 {
			s.to, s.conv, s.stream = user, "d:"+s.sender+":"+user, "d."+user
		} else {
			s.group, s.conv, s.stream = grp, "g:"+grp, "g."+grp
		}
	}
	return g
}

// appendFrame appends one delivery as a WebSocket text frame.
func (g *floodGen) appendFrame(dst []byte, now int64) []byte {
	s := &g.streams[g.next]
	g.next = (g.next + 1) % len(g.streams)
	s.seq++
	g.msgID++
	p := append(g.payload[:0], `{"type":"msg","from":"`...)
	p = append(p, s.sender...)
	if s.group != "" {
		p = append(p, `","group":"`...)
		p = append(p, s.group...)
	} else {
		p = append(p, `","to":"`...)
		p = append(p, s.to...)
	}
	p = append(p, `","conv":"`...)
	p = append(p, s.conv...)
	p = append(p, `","msg_id":"`...)
	p = strconv.AppendUint(p, g.msgID, 10)
	p = append(p, `","seq":`...)
	p = strconv.AppendUint(p, s.seq, 10)
	// The probe body: imc1 RUN SENDER STREAM SEQ INTENDED 0-0 (probe/body.go).
	p = append(p, `,"body":"imc1 `...)
	p = append(p, g.run...)
	p = append(p, ' ')
	p = append(p, s.sender...)
	p = append(p, ' ')
	p = append(p, s.stream...)
	p = append(p, ' ')
	p = strconv.AppendUint(p, s.seq, 10)
	p = append(p, ' ')
	p = strconv.AppendInt(p, now, 10)
	p = append(p, ` 0-0"}`...)
	g.payload = p
	return appendWSFrame(dst, wsText, p)
}

// WebSocket opcodes the flood server writes.
const (
	wsText = 0x1
	wsPong = 0xA
)

// appendWSFrame appends one unmasked, final server frame (RFC 6455 §5.2),
// with the shortest length encoding, as the RFC requires.
func appendWSFrame(dst []byte, op byte, payload []byte) []byte {
	dst = append(dst, 0x80|op)
	switch n := len(payload); {
	case n < 126:
		dst = append(dst, byte(n))
	case n < 1<<16:
		dst = append(dst, 126, byte(n>>8), byte(n))
	default:
		dst = append(dst, 127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, payload...)
}

// appendReplyJSON appends {"type":typ,"id":id}, the target's login_ok, ok
// and pong.
func appendReplyJSON(dst []byte, typ, id string) []byte {
	b, _ := json.Marshal(id)
	dst = append(dst, `{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","id":`...)
	dst = append(dst, b...)
	return append(dst, '}')
}

// errFloodNotReady says the clients of the flood did not all log in.
var errFloodNotReady = errors.New("flood clients did not log in")

// waitFlood waits until n connections of each kind are logged in.
func (f *floodServer) waitFlood(ctx context.Context, n int, timeout time.Duration, alive func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		if f.ready(kindBare) >= n && f.ready(kindReal) >= n {
			return nil
		}
		if err := alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errFloodNotReady
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
