package memnet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// HTTPServer is an http.Server on a Listener: httptest.Server's part for
// a fake server that must run inside a synctest bubble.
type HTTPServer struct {
	*Listener
	srv      *http.Server
	served   chan struct{}
	handlers sync.WaitGroup

	mu      sync.Mutex
	closing bool
}

// NewHTTPServer serves h on a new Listener of DefaultBuffer until Close.
func NewHTTPServer(h http.Handler) *HTTPServer {
	s := &HTTPServer{Listener: Listen(0), served: make(chan struct{})}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request that arrives as Close begins is not served: Add
		// must not race Wait.
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			http.Error(w, "server closing", http.StatusServiceUnavailable)
			return
		}
		s.handlers.Add(1)
		s.mu.Unlock()
		defer s.handlers.Done()
		h.ServeHTTP(w, r)
	})}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(s.Listener)
	}()
	return s
}

// Close stops the server, closes every connection it holds (hijacked
// ones too, which http.Server forgets) and waits for its handlers to
// return.
func (s *HTTPServer) Close() error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	err := s.srv.Close()
	s.Listener.Close()
	<-s.served
	s.handlers.Wait()
	return err
}

// Fakes is a test's fake servers by URL: one helper starts them, another
// makes the client that dials them (Dial), as a test's fake-server
// helper and its driver constructor are apart.
type Fakes struct {
	servers sync.Map // URL → *HTTPServer
	n       atomic.Int64
}

// Start serves h until the test ends and returns its URL:
// scheme://fake-N/path.
func (f *Fakes) Start(tb testing.TB, scheme, path string, h http.Handler) string {
	tb.Helper()
	srv := NewHTTPServer(h)
	url := fmt.Sprintf("%s://fake-%d%s", scheme, f.n.Add(1), path)
	f.servers.Store(url, srv)
	tb.Cleanup(func() {
		f.servers.Delete(url)
		srv.Close()
	})
	return url
}

// Dial returns the dial function of the server at url, or false if no
// fake server is there.
func (f *Fakes) Dial(url string) (func(ctx context.Context, network, addr string) (net.Conn, error), bool) {
	s, ok := f.servers.Load(url)
	if !ok {
		return nil, false
	}
	return s.(*HTTPServer).Dial, true
}
