// Package wsframe reads whole WebSocket messages into pooled buffers for
// the protocol adapters. A session holds a buffer only while it handles a
// frame, never while it waits for the next: an idle session's memory is
// its small bufio reader, not a frame-sized buffer.
package wsframe

import (
	"io"
	"sync"

	"github.com/gorilla/websocket"
)

// keepMax is the largest buffer returned to the pool: one huge frame must
// not keep its buffer alive for every later small one.
const keepMax = 64 << 10

var pool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Read reads the next data message of c, whole, into a pooled buffer; the
// caller gives it back with Release once done with the bytes. The
// connection's read limit bounds the size.
func Read(c *websocket.Conn) (*[]byte, error) {
	_, r, err := c.NextReader()
	if err != nil {
		return nil, err
	}
	bp := pool.Get().(*[]byte)
	b := (*bp)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*bp = b
			return bp, nil
		}
		if err != nil {
			*bp = b
			Release(bp)
			return nil, err
		}
	}
}

// Release returns a buffer from Read to the pool.
func Release(bp *[]byte) {
	if cap(*bp) <= keepMax {
		pool.Put(bp)
	}
}
