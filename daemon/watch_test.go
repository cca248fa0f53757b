package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
)

// lines is a slog handler that keeps each record as "LEVEL message".
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r.Level.String()+" "+r.Message)
	return nil
}

func (l *lines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.got
	l.got = nil
	return out
}

var errRefused = fmt.Errorf("login u1: dial ws://127.0.0.1:1/ws: %w",
	&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})

// TestWatchLogsEachChangeOnce drives a watch through an outage, a
// recovery, a flapping target and a shortfall of sessions, on a fake clock,
// and checks that it writes exactly one line per change, readable, and
// nothing while nothing changes.
func TestWatchLogsEachChangeOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reach := engine.NewReach(nil)
		var mu sync.Mutex
		online, users := 10, 10
		setOnline := func(n int) { mu.Lock(); online = n; mu.Unlock() }
		log := &lines{}
		w := newWatch(reach, func() (int, int, bool) {
			mu.Lock()
			defer mu.Unlock()
			return online, users, true
		}, 20*time.Second, slog.New(log))
		// run for s seconds of fake time, one step a second.
		run := func(s int) {
			for range s {
				time.Sleep(time.Second)
				w.step(time.Now())
			}
		}
		fail := func(n int) {
			for range n {
				reach.Failed(metrics.ConnectRefused, errRefused)
			}
		}

		reach.Succeeded()
		run(30)
		if got := log.take(); len(got) != 0 {
			t.Fatalf("healthy: logged %q, want nothing", got)
		}

		// The target dies: sessions drop, reconnects are refused.
		setOnline(0)
		fail(5)
		run(60)
		got := log.take()
		want := "WARN target unreachable: connection refused (dial tcp 127.0.0.1:1: connect: connection refused); 0 of 10 online"
		if len(got) != 1 || got[0] != want {
			t.Fatalf("outage: logged %q, want exactly [%q]", got, want)
		}

		// A last refusal a minute in; the first login 10 s later; the
		// users log in over a few seconds, and the watch waits for them.
		fail(1)
		run(10)
		reach.Succeeded()
		for i := 1; i <= 10; i++ {
			setOnline(i)
			run(1)
		}
		run(30)
		got = log.take()
		// Between the last refusal and the first login: not the time
		// the line was written, after the population's wait.
		if want := "INFO target back after 1m0s–1m10s ("; len(got) != 1 || !strings.HasPrefix(got[0], want) || !strings.HasSuffix(got[0], "; 10 of 10 online") {
			t.Fatalf("recovery: logged %q, want one line \"%s…; 10 of 10 online\"", got, want)
		}

		// Flapping: down and up every 2 s for 20 s gives a line at most
		// every 10 s, and says how many changes it did not report.
		for range 5 {
			fail(3)
			run(2)
			reach.Succeeded()
			run(2)
		}
		run(15)
		got = log.take()
		t.Logf("flapping: %q", got)
		if len(got) < 2 || len(got) > 4 {
			t.Fatalf("flapping for 20s: logged %d lines %q, want 2 to 4", len(got), got)
		}
		if !strings.Contains(strings.Join(got, "\n"), "more changes since the last line") {
			t.Errorf("flapping: lines %q do not say that changes went unreported", got)
		}

		// A shortfall shorter than settle is not a state; a longer one is.
		setOnline(7)
		run(10)
		setOnline(10)
		run(30)
		if got := log.take(); len(got) != 0 {
			t.Fatalf("a 10s dip: logged %q, want nothing", got)
		}
		setOnline(6)
		run(40)
		setOnline(10)
		run(5)
		got = log.take()
		if len(got) != 2 || !strings.HasPrefix(got[0], "WARN sessions below target: 6 of 10 online for 20s") ||
			!strings.HasPrefix(got[1], "INFO sessions back: 10 of 10 online after") {
			t.Fatalf("shortfall: logged %q, want a below-target line and a back line", got)
		}
	})
}
