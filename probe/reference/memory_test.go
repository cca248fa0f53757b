package reference_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/memtest"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// targetChildEnv makes the test binary run as a bare reference server, so a
// memory benchmark can measure imcanary's sessions without the target's
// connections in the same heap.
const targetChildEnv = "IMCANARYTEST_TARGET_CHILD"

// targetTLSEnv makes the child serve wss:// with httptest's certificate
// (the same in every process), which localCert's pool trusts.
const targetTLSEnv = "IMCANARYTEST_TARGET_TLS"

// localCert returns httptest's certificate for 127.0.0.1 and a pool that
// trusts it.
func localCert() (tls.Certificate, *x509.CertPool) {
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	ts.Close()
	return ts.TLS.Certificates[0], ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
}

func TestMain(m *testing.M) {
	if os.Getenv(targetChildEnv) == "1" {
		runTargetChild()
		return
	}
	os.Exit(m.Run())
}

// runTargetChild serves a target on loopback, prints its address and exits
// when its standard input closes: the parent's death ends it too.
func runTargetChild() {
	srv, err := refserver.New(refserver.Options{Secret: secret})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(ln.Addr())
	if os.Getenv(targetTLSEnv) == "1" {
		cert, _ := localCert()
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		cancel()
	}()
	_ = srv.Serve(ctx, ln)
}

// childTarget starts the target in another process and returns its
// address; over TLS (wss://) with tlsOn.
func childTarget(tb testing.TB, tlsOn bool) string {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), targetChildEnv+"=1")
	if tlsOn {
		cmd.Env = append(cmd.Env, targetTLSEnv+"=1")
	}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("target child: %v", err)
	}
	return strings.TrimSpace(line)
}

// BenchmarkSessionMemory holds IMCANARYTEST_SESSIONS (default 2,000) idle
// sessions of a real population against a target in another process, and
// reports imcanary's memory per session: Go heap and stacks, and resident
// set size. Budget: 12 KiB per idle session. IMCANARYTEST_HEAPPROFILE
// names a file for a heap profile taken while the sessions are held.
// The tls/ variants do the same over wss://.
func BenchmarkSessionMemory(b *testing.B) {
	n := 2000
	if s := os.Getenv("IMCANARYTEST_SESSIONS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	_, roots := localCert()
	for _, tlsOn := range []bool{false, true} {
		addr := childTarget(b, tlsOn)
		// Side by side: each session read by a goroutine of its own,
		// and by the population's poller (population.reactor).
		for _, reactor := range []bool{false, true} {
			name := "goroutine"
			if reactor {
				name = "reactor"
			}
			url := "ws://" + addr + "/ws"
			var tc *tls.Config
			if tlsOn {
				name, url, tc = "tls/"+name, "wss://"+addr+"/ws", &tls.Config{RootCAs: roots}
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					heap, stack, rss, g := measureSessions(b, url, tc, n, reactor)
					b.ReportMetric(g, "goroutines")
					b.ReportMetric(heap+stack, "heap+stack-B/session")
					b.ReportMetric(stack, "stack-B/session")
					b.ReportMetric(rss, "rss-B/session")
				}
			})
		}
	}
}

func measureSessions(b *testing.B, url string, tc *tls.Config, n int, reactor bool) (heapPer, stackPer, rssPer, goroutines float64) {
	drv, err := reference.New(reference.Options{URL: url, TLS: tc, Secret: secret, Heartbeat: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	set := metrics.New(prometheus.NewRegistry()).For("bench", metrics.SourceBackground)
	pop, err := engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver:     drv,
			Run:        "bench",
			Heartbeat:  time.Hour,
			BackoffMin: 50 * time.Millisecond,
			BackoffMax: time.Second,
			Reactor:    reactor,
		},
		Set:       set,
		Prefix:    "m",
		Users:     n,
		GroupSize: 5,
		Deadline:  time.Second,
		LostAfter: 2 * time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	h0, s0, r0 := memtest.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = pop.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	for end := time.Now().Add(60 * time.Second); !pop.Ready(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			b.Fatalf("only %d of %d sessions online after 60s", pop.Online(), n)
		}
	}
	time.Sleep(500 * time.Millisecond)
	h1, s1, r1 := memtest.Now()
	goroutines = float64(runtime.NumGoroutine())
	if f := os.Getenv("IMCANARYTEST_HEAPPROFILE"); f != "" {
		memtest.WriteHeapProfile(b, f)
	}
	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	return per(h0, h1), per(s0, s1), per(r0, r1), goroutines
}
