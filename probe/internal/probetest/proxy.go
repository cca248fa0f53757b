package probetest

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// SendProxy is a reverse proxy in front of an HTTP API that meddles with
// every third send it sees the first time (Match picks the sends, Key
// names one across its retries). Mode "drop" forwards it and then cuts the
// connection before the answer reaches imcanary, so that imcanary retries
// a send the server made; "double" forwards it, then forwards Again's
// copy of it, as a server that ignores the idempotency key would make a
// second message, and answers with the first.
type SendProxy struct {
	Mode   string
	Target *url.URL
	Match  func(r *http.Request) bool
	Key    func(r *http.Request, body []byte) string
	Again  func(r *http.Request, body []byte) (path string, againBody []byte)
	// Meddled counts the sends meddled with.
	Meddled atomic.Int64

	rp   *httputil.ReverseProxy
	once sync.Once
	n    atomic.Int64
	mu   sync.Mutex
	seen map[string]bool
}

// Start serves p on a loopback port until the test ends.
func (p *SendProxy) Start(t testing.TB) *httptest.Server {
	srv := httptest.NewUnstartedServer(p)
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

func (p *SendProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.once.Do(func() {
		p.rp = httputil.NewSingleHostReverseProxy(p.Target)
		p.seen = map[string]bool{}
	})
	if !p.Match(r) {
		p.rp.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	key := p.Key(r, body)
	p.mu.Lock()
	again := p.seen[key]
	p.seen[key] = true
	p.mu.Unlock()
	forward := func(path string, b []byte) (*http.Response, []byte, error) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, p.Target.String()+path, bytes.NewReader(b))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, answer, nil
	}
	resp, answer, err := forward(r.URL.Path, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if !again && p.n.Add(1)%3 == 0 {
		p.Meddled.Add(1)
		switch p.Mode {
		case "drop":
			// The server made it; imcanary never hears of it.
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					conn.Close()
					return
				}
			}
			panic("probetest: cannot cut the connection")
		case "double":
			if _, _, err := forward(p.Again(r, body)); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
		}
	}
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}
