package reference_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// attempts records when each connect began: the limit is on attempts
// begun, and counters count them when they end, which a dying server makes
// many do at once.
type attempts struct {
	probe.Driver
	mu sync.Mutex
	at []time.Time
}

func (a *attempts) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
	return a.Driver.Connect(ctx, user, dev)
}

// peak returns the most attempts begun within any one second.
func (a *attempts) peak() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	most := 0
	for i, j := 0, 0; i < len(a.at); i++ {
		for j < len(a.at) && a.at[j].Sub(a.at[i]) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// openFiles counts this process's open file descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(fds)
}

// listenAgain binds addr, which a target just left.
func listenAgain(t *testing.T, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	testwait.For(t, 5*time.Second, "to listen on "+addr+" again", func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	return ln
}

// TestTargetOutages runs a population through every way a target goes
// away: killed, then a blackhole that accepts connections and answers
// nothing, then an HTTP server that refuses the upgrade, then a target that
// restarts three times in quick succession, and finally one that stays.
// Throughout, connect attempts stay within population.max_connect_rate;
// afterwards the population is whole again, every acknowledged message is
// delivered or lost exactly once, nothing is duplicated, and a clean
// minute after recovery (compressed to seconds) loses nothing more.
func TestTargetOutages(t *testing.T) {
	att := &attempts{}
	pc := popConfig{users: 40, groupSize: 5, rate: 5, deadline: time.Second, lostAfter: 2 * time.Second,
		maxConnectRate: 50, dialTimeout: time.Second,
		wrap: func(d probe.Driver) probe.Driver { att.Driver = d; return att }}
	fx := newFixture(t, refserver.Faults{}, pc)
	addr := fx.addr
	fx.soakStep(time.Second)
	// What the process holds in steady state, to compare after recovery:
	// an outage must leak no goroutine and no connection.
	goroutines0, files0 := runtime.NumGoroutine(), openFiles(t)

	// Killed.
	fx.srv.Close()
	fx.stopT()
	testwait.For(t, 5*time.Second, "every session to notice the outage", func() bool { return fx.pop.Online() == 0 })
	if v := metrics.Value(fx.set.Online); v != 0 {
		t.Errorf("sessions_online = %v during the outage, want 0", v)
	}
	refused := metrics.Value(fx.set.ConnectFail)
	testwait.For(t, 5*time.Second, "reconnects to be refused", func() bool { return metrics.Value(fx.set.ConnectFail) > refused })

	// Blackhole: TCP accepted, nothing answered; every login times out.
	ok0, fail0 := metrics.Value(fx.set.ConnectOK), metrics.Value(fx.set.ConnectFail)
	hole := listenAgain(t, addr)
	var held []net.Conn
	var hmu sync.Mutex
	var hwg sync.WaitGroup
	hwg.Go(func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			hmu.Lock()
			held = append(held, c)
			hmu.Unlock()
		}
	})
	// Logins time out at the driver's dial timeout, a second.
	testwait.For(t, 10*time.Second, "a login to time out in the blackhole", func() bool {
		hmu.Lock()
		defer hmu.Unlock()
		return len(held) > 0 && metrics.Value(fx.set.ConnectFail) > fail0
	})
	hole.Close()
	hwg.Wait()
	hmu.Lock()
	for _, c := range held {
		c.Close()
	}
	accepted := len(held)
	hmu.Unlock()
	if ok, fail := metrics.Value(fx.set.ConnectOK)-ok0, metrics.Value(fx.set.ConnectFail)-fail0; ok != 0 || fail == 0 || accepted == 0 {
		t.Errorf("blackhole: %v connects succeeded, %v failed, %d accepted; want none, some, some", ok, fail, accepted)
	}

	// The upgrade refused with 503.
	refuse := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
	}), ReadHeaderTimeout: time.Second}
	ln := listenAgain(t, addr)
	var swg sync.WaitGroup
	swg.Go(func() { _ = refuse.Serve(ln) })
	drv, err := reference.New(reference.Options{URL: "ws://" + addr + "/ws", Secret: secret, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Connect(context.Background(), "t-u0", probe.Device{}); err == nil || !strings.Contains(err.Error(), "HTTP 503") {
		t.Errorf("Connect against a refusing server = %v, want an error naming HTTP 503", err)
	}
	fail0 = metrics.Value(fx.set.ConnectFail)
	testwait.For(t, 5*time.Second, "failed connects while the upgrade is refused", func() bool { return metrics.Value(fx.set.ConnectFail) > fail0 })
	_ = refuse.Close()
	swg.Wait()

	// Three quick restarts, each target living until a session is in.
	for range 3 {
		ok0 := metrics.Value(fx.set.ConnectOK)
		srv, _, stop, wg := startTarget(t, addr, refserver.Options{})
		testwait.For(t, 5*time.Second, "a session to log in to a restarted target", func() bool { return metrics.Value(fx.set.ConnectOK) > ok0 })
		srv.Close()
		stop()
		wg.Wait()
	}

	// Back for good.
	back := time.Now()
	_, _, stop, wg := startTarget(t, addr, refserver.Options{})
	defer func() { stop(); wg.Wait() }()
	testwait.For(t, 20*time.Second, "every session to come back", func() bool { return fx.pop.Online() == pc.users })
	recovery := time.Since(back)
	peak := att.peak()
	t.Logf("recovery: every session back %v after the target; peak connect attempts %d in one second (limit %v/s), %d in all",
		recovery.Round(time.Millisecond), peak, pc.maxConnectRate, len(att.at))
	// The limiter's burst is a tenth of a second's worth.
	if most := int(pc.maxConnectRate + pc.maxConnectRate/10); peak > most {
		t.Errorf("peak connect attempts %v in one second, want at most %v (population.max_connect_rate %v)", peak, most, pc.maxConnectRate)
	}

	// Settled: every acknowledged message is accounted for once.
	fx.soak(2*time.Second, pc.lostAfter)
	c1 := fx.counts()
	t.Logf("after the outages: %+v", c1)
	// A message the target took just as it dropped the sender, or whose
	// ack came after the deadline, is written off (owed to nobody) and
	// may still be delivered: counted unowed, apart, so that delivered
	// and lost meet expected exactly. Each write-off counted in this run
	// explains at most one unowed delivery per recipient.
	accounted := func(c totals) bool {
		off := metrics.Value(fx.set.SendErrors[metrics.SendDisconnected]) + metrics.Value(fx.set.SendErrors[metrics.SendAckTimeout]) + metrics.Value(fx.set.SendErrors[metrics.SendWrite])
		return c.delivered+c.lost == c.expected && c.unowed <= off*float64(pc.groupSize-1) && c.dup == 0
	}
	if !accounted(c1) {
		t.Errorf("delivered %v + lost %v vs expected %v, unowed %v, duplicates %v: want every acked message accounted exactly once, none twice",
			c1.delivered, c1.lost, c1.expected, c1.unowed, c1.dup)
	}
	// Nothing leaked: once the dialers of the reconnect burst have gone
	// idle and exited, the goroutines and open files are back where they
	// were before the first outage.
	var goroutines1, files1 int
	testwait.For(t, 10*time.Second, "goroutines and files back to their steady state", func() bool {
		goroutines1, files1 = runtime.NumGoroutine(), openFiles(t)
		return goroutines1 <= goroutines0+5 && files1 <= files0+2
	})
	t.Logf("steady state before the outages: %d goroutines, %d open files; after: %d, %d", goroutines0, files0, goroutines1, files1)

	// Steady state: a clean stretch after recovery loses nothing more.
	fx.pop.SetSending(true)
	fx.soak(2*time.Second, pc.lostAfter)
	c2 := fx.counts()
	if c2.lost != c1.lost || c2.delivered <= c1.delivered || !accounted(c2) {
		t.Errorf("after recovery: %+v, before %+v; want new deliveries, all of them, and no new loss", c2, c1)
	}
}
