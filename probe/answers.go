package probe

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Answer is what became of one send whose answer comes on a goroutine of
// its own (an HTTP request beside the session's connection): accepted
// with the server's id for it, refused for a reason, or never answered.
type Answer struct {
	Ref uint64
	// ServerID is the server's id of the message it accepted.
	ServerID string
	// Reject is the server's reason for refusing it.
	Reject string
	// Err is why no answer came; the send may or may not have been made.
	Err error
}

// Answers hands a session's Answers to its Handler: at once once Serve
// has given it one, and until then kept, in order, to be handed over when
// it does. The zero value is ready to use.
type Answers struct {
	mu    sync.Mutex
	h     Handler
	early []Answer
}

// Serve sets the handler and hands it what was kept.
func (a *Answers) Serve(h Handler) {
	a.mu.Lock()
	a.h = h
	early := a.early
	a.early = nil
	a.mu.Unlock()
	for _, x := range early {
		report(h, x)
	}
}

// Handler returns the handler Serve set, or nil.
func (a *Answers) Handler() Handler {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.h
}

// Report hands x to the handler, or keeps it until Serve.
func (a *Answers) Report(x Answer) {
	a.mu.Lock()
	h := a.h
	if h == nil {
		a.early = append(a.early, x)
	}
	a.mu.Unlock()
	if h != nil {
		report(h, x)
	}
}

// report hands x to h: a send that got no answer as a SendFailer's
// failure where h is one, else as a rejection.
func report(h Handler, x Answer) {
	switch {
	case x.Err != nil:
		if f, ok := h.(SendFailer); ok {
			f.OnSendFailed(x.Ref, x.Err)
			return
		}
		h.OnReject(x.Ref, x.Err.Error())
	case x.Reject != "":
		h.OnReject(x.Ref, x.Reject)
	default:
		h.OnAck(x.Ref, Ack{ServerID: []byte(x.ServerID)})
	}
}

// Parallel runs f for 0..n-1 on at most workers goroutines and returns the
// first error; the calls not yet started are then not made, and the
// context of those running is cancelled. Provisioning uses it: each user
// or room is a request to the server, and more at once than the server
// has cores only queues there.
func Parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(max(workers, 1), n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// Sleep waits for d or until ctx ends, and reports whether ctx is still
// live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
