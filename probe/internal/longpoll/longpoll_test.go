package longpoll

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/internal/memnet"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// loopback starts h on 127.0.0.1, never on every address.
func loopback(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// memServer is h on an in-memory network, for a test in a synctest
// bubble: a pool reaches it with Settings.Dial.
type memServer struct {
	*memnet.HTTPServer
	url string
}

func inMemory(t *testing.T, h http.Handler) *memServer {
	t.Helper()
	srv := memnet.NewHTTPServer(h)
	t.Cleanup(func() { srv.Close() })
	return &memServer{HTTPServer: srv, url: "http://fake"}
}

func get(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestDo(t *testing.T) {
	srv := loopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 101)))
		case "/exact":
			_, _ = w.Write([]byte(strings.Repeat("x", 100)))
		case "/redirect":
			http.Redirect(w, r, "/exact", http.StatusFound)
		case "/header":
			_, _ = w.Write([]byte(r.Header.Get("User-Agent") + "|" + r.Header.Get("Authorization")))
		case "/status":
			w.WriteHeader(http.StatusTeapot)
		}
	}))
	p := NewPool(Settings{MaxBody: 100, Header: http.Header{"User-Agent": {"imcanary-test"}, "Authorization": {"from settings"}}})
	defer p.CloseIdle()
	ctx := context.Background()

	before := time.Now().UnixNano()
	r, err := p.Do(get(t, ctx, srv.URL+"/exact"), probe.Link{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Body) != 100 || r.Status != 200 {
		t.Errorf("exact: %d bytes, status %d", len(r.Body), r.Status)
	}
	if r.At < before || r.At > time.Now().UnixNano() {
		t.Errorf("At %d outside the request's time", r.At)
	}

	if _, err := p.Do(get(t, ctx, srv.URL+"/big?access_token=s3cret"), probe.Link{}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("101 bytes past a limit of 100: %v, want ErrTooLarge", err)
	} else if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q shows the query's token", err)
	}

	r, err = p.Do(get(t, ctx, srv.URL+"/redirect"), probe.Link{})
	if err != nil || r.Status != http.StatusFound {
		t.Errorf("redirect: %v, status %v: want the 302 itself, not followed", err, r)
	}

	req := get(t, ctx, srv.URL+"/header")
	req.Header.Set("Authorization", "Bearer own")
	if r, err = p.Do(req, probe.Link{}); err != nil || string(r.Body) != "imcanary-test|Bearer own" {
		t.Errorf("headers seen by the server %q (%v): want the settings' User-Agent and the request's own Authorization", r.Body, err)
	}

	if r, err = p.Do(get(t, ctx, srv.URL+"/status"), probe.Link{}); err != nil || r.Status != http.StatusTeapot {
		t.Errorf("status: %v %v: any status is an answer", r, err)
	}

	srv.Close()
	if _, err := p.Do(get(t, ctx, srv.URL+"/exact?access_token=s3cret"), probe.Link{}); err == nil {
		t.Error("no error from a server that is gone")
	} else if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q shows the query's token", err)
	}
}

// TestMaxConns: requests past MaxConns wait for a connection instead of
// opening more.
func TestMaxConns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var open, peak atomic.Int64
		release := make(chan struct{})
		srv := inMemory(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := open.Add(1)
			defer open.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
		}))
		p := NewPool(Settings{MaxConns: 3, Dial: srv.Dial})
		defer p.CloseIdle()
		done := make(chan error, 10)
		for range 10 {
			go func() {
				_, err := p.Do(get(t, context.Background(), srv.url), probe.Link{})
				done <- err
			}()
		}
		testwait.For(t, 5*time.Second, "three requests open", func() bool { return open.Load() >= 3 })
		// Let every goroutine run until it blocks: the other seven have then
		// opened a connection if they could, and none may.
		synctest.Wait()
		if n := open.Load(); n != 3 {
			t.Errorf("%d requests open with every client blocked, want MaxConns 3", n)
		}
		close(release)
		for range 10 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		if peak.Load() != 3 {
			t.Errorf("%d requests at once on the server, want MaxConns 3", peak.Load())
		}
	})
}

// poller polls srv's "/poll" holding each for hold, and counts answers.
type poller struct {
	t       *testing.T
	url     string
	hold    time.Duration
	answers atomic.Int64
	stopAt  int64
}

func (p *poller) Next(ctx context.Context) (*http.Request, time.Duration, error) {
	return get(p.t, ctx, p.url), p.hold, nil
}

func (p *poller) Answer(r *Response) error {
	if n := p.answers.Add(1); p.stopAt > 0 && n == p.stopAt {
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Err: errors.New("told to")}
	}
	if r.Status != 200 {
		return fmt.Errorf("status %d", r.Status)
	}
	return nil
}

// pollServer answers "/poll" at once and holds "/hang" until the request
// ends, counting the requests in flight and their peak.
func pollServer(t *testing.T) (srv *memServer, inFlight, peak *atomic.Int64) {
	t.Helper()
	inFlight, peak = new(atomic.Int64), new(atomic.Int64)
	srv = inMemory(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		if n > peak.Load() {
			peak.Store(n)
		}
		switch r.URL.Path {
		case "/hang":
			<-r.Context().Done()
		default:
			time.Sleep(5 * time.Millisecond)
		}
	}))
	return srv, inFlight, peak
}

func TestServe(t *testing.T) {
	t.Run("one poll in flight, the adapter's disconnect", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv, _, peak := pollServer(t)
			pool := NewPool(Settings{Dial: srv.Dial})
			defer pool.CloseIdle()
			pr := &poller{t: t, url: srv.url + "/poll", hold: time.Second, stopAt: 20}
			c := pool.NewConn(context.Background(), probe.Link{})
			err := c.Serve(pr)
			var d *probe.Disconnect
			if !errors.As(err, &d) || d.Reason != metrics.ReasonServerClose {
				t.Fatalf("Serve: %v, want the adapter's server_close", err)
			}
			if peak.Load() != 1 {
				t.Errorf("%d polls in flight at once, want 1", peak.Load())
			}
		})
	})

	t.Run("dead poll", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv, _, _ := pollServer(t)
			pool := NewPool(Settings{DialTimeout: 50 * time.Millisecond, Grace: 50 * time.Millisecond, Dial: srv.Dial})
			defer pool.CloseIdle()
			pr := &poller{t: t, url: srv.url + "/hang", hold: 100 * time.Millisecond}
			c := pool.NewConn(context.Background(), probe.Link{})
			began := time.Now()
			err := c.Serve(pr)
			took := time.Since(began)
			var d *probe.Disconnect
			if !errors.As(err, &d) || d.Reason != metrics.ReasonError || !errors.Is(d.Err, ErrDeadPoll) {
				t.Fatalf("Serve: %v, want an error of ErrDeadPoll", err)
			}
			if took < 200*time.Millisecond {
				t.Errorf("dead after %s, before hold+dial+grace (200ms)", took)
			}
		})
	})

	t.Run("close is a shutdown and waits for Go", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv, inFlight, _ := pollServer(t)
			pool := NewPool(Settings{Dial: srv.Dial})
			defer pool.CloseIdle()
			pr := &poller{t: t, url: srv.url + "/hang", hold: time.Minute}
			c := pool.NewConn(context.Background(), probe.Link{})
			var sideDone atomic.Bool
			if !c.Go(func(ctx context.Context) {
				<-ctx.Done()
				time.Sleep(20 * time.Millisecond)
				sideDone.Store(true)
			}) {
				t.Fatal("Go refused before Close")
			}
			errc := make(chan error, 1)
			go func() { errc <- c.Serve(pr) }()
			testwait.For(t, 5*time.Second, "a poll in flight", func() bool { return inFlight.Load() > 0 })
			_ = c.Close()
			err := <-errc
			var d *probe.Disconnect
			if !errors.As(err, &d) || d.Reason != metrics.ReasonShutdown {
				t.Errorf("Serve after Close: %v, want shutdown", err)
			}
			if !sideDone.Load() {
				t.Error("Serve returned before the goroutine Go started")
			}
			if c.Go(func(context.Context) {}) {
				t.Error("Go ran after Close")
			}
		})
	})

	t.Run("abort is an error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv, inFlight, _ := pollServer(t)
			pool := NewPool(Settings{Dial: srv.Dial})
			defer pool.CloseIdle()
			pr := &poller{t: t, url: srv.url + "/hang", hold: time.Minute}
			c := pool.NewConn(context.Background(), probe.Link{})
			errc := make(chan error, 1)
			go func() { errc <- c.Serve(pr) }()
			testwait.For(t, 5*time.Second, "a poll in flight", func() bool { return inFlight.Load() > 0 })
			c.Abort()
			var d *probe.Disconnect
			if err := <-errc; !errors.As(err, &d) || d.Reason != metrics.ReasonError {
				t.Errorf("Serve after Abort: %v, want error", err)
			}
		})
	})

	t.Run("a parent's end does not end the session", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The session outlives the context of the Connect that made it:
			// only Close ends it.
			pool := NewPool(Settings{})
			defer pool.CloseIdle()
			parent, cancel := context.WithCancel(context.Background())
			c := pool.NewConn(parent, probe.Link{})
			cancel()
			if c.Context().Err() != nil {
				t.Error("session's context ended with its parent's")
			}
			_ = c.Close()
			if c.Context().Err() == nil || !c.Closing() {
				t.Error("Close left the session's context running")
			}
		})
	})
}
