package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/refserver"
)

// BareLogin is the baseline of the ramp: the least a client must do to log
// a session in to the reference server. It dials as imcanary's reference
// driver dials (512-byte read buffers, a shared pool of write buffers),
// sends the login frame with the user's token and reads the reply, from
// Workers goroutines at once and as fast as the machine allows: no rate
// limit, no group joins, no read loop, no ledger. A prober's ramp over this
// one's, on the same machine in the same run, is what imcanary's own login
// path costs; this one alone is how fast this machine can log sessions in
// with the target on it.
type BareLogin struct {
	// URL is the target's WebSocket endpoint and Secret its token secret
	// (nil: "open", for a target without one).
	URL    string
	Secret []byte
	// Users is how many sessions to log in, named Prefix-uN.
	Users  int
	Prefix string
	// Workers is how many logins are in flight at once.
	Workers int
}

// Run logs every user in, writes "ready SECONDS" to out (the time from the
// first dial to the last login), holds the sessions until in ends (the bench
// closed it, or died) or ctx is done, and closes them.
func (b BareLogin) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	if b.Users < 1 || b.Workers < 1 {
		return fmt.Errorf("bare login: %d users, %d workers: want at least 1 of each", b.Users, b.Workers)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dialer := &websocket.Dialer{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   512,
		WriteBufferSize:  4096,
		WriteBufferPool:  barePool,
	}
	conns := make([]*websocket.Conn, b.Users)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.NetConn().Close()
			}
		}
	}()
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	t0 := time.Now()
	for range min(b.Workers, b.Users) {
		// Exits when every user is taken, or at its first error.
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= b.Users {
					return
				}
				c, err := b.login(ctx, dialer, b.Prefix+"-u"+strconv.Itoa(i))
				if err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	took := time.Since(t0)
	if firstErr != nil {
		return fmt.Errorf("bare login: %w", firstErr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "ready %.6f\n", took.Seconds()); err != nil {
		return err
	}
	go func() {
		// Unblocks the read of in below when ctx ends first.
		<-ctx.Done()
		if c, ok := in.(io.Closer); ok {
			c.Close()
		}
	}()
	_, _ = io.Copy(io.Discard, bufio.NewReader(in))
	return nil
}

func (b BareLogin) login(ctx context.Context, d *websocket.Dialer, user string) (*websocket.Conn, error) {
	c, _, err := d.DialContext(ctx, b.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", b.URL, err)
	}
	token := "open"
	if b.Secret != nil {
		token = refserver.Token(b.Secret, user)
	}
	if err := loginWith(c, user, token); err != nil {
		c.NetConn().Close()
		return nil, err
	}
	return c, nil
}
