package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// keepSession keeps the body of the last message sent on it, so that a
// test can deliver it by hand.
type keepSession struct {
	idleSession
	body *[]byte
}

func (k keepSession) Send(m *probe.Message) error {
	*k.body = append((*k.body)[:0], m.Body...)
	return nil
}

// groupPop is a population laid out as groups, every device online on a
// keepSession, with nothing sent.
func groupPop(tb testing.TB, users, devices int, groups []config.GroupSpec) (*Population, *metrics.Set, *[]byte) {
	tb.Helper()
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	p, err := NewPopulation(Options{
		Connection: Connection{Driver: nopDriver{}, Run: "r1", Heartbeat: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond},
		Set:        set, Prefix: "p", Users: users, Devices: devices, Groups: groups, GroupSize: 2,
		Rate: 1, Deadline: 2 * time.Second, LostAfter: 4 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	body := new([]byte)
	now := time.Now().UnixNano()
	p.ledger.start = now - int64(time.Hour)
	for _, u := range p.users {
		for _, dev := range u.devices {
			dev.sess, dev.sessStart = keepSession{body: body}, now
			dev.online.Store(true)
			dev.inbox.onlineSince.Store(now - int64(time.Hour))
		}
	}
	return p, set, body
}

// sendGroup sends one message of user from on its group g and acks it.
func sendGroup(tb testing.TB, p *Population, from, g int) {
	tb.Helper()
	u := p.users[from]
	st := u.groups[g]
	u.mu.Lock()
	if _, _, err := p.sendOn(u, st, time.Now().UnixNano(), nil); err != nil {
		tb.Fatal(err)
	}
	ref := u.inflight[len(u.inflight)-1].ref
	u.devices[0].OnAck(ref, probe.Ack{})
}

// recipientDevices returns the devices group g of user from delivers to.
func recipientDevices(p *Population, from, g int) []*device {
	var devs []*device
	for r := range p.users[from].groups[g].recipients() {
		devs = append(devs, p.users[r].devices...)
	}
	return devs
}

func fanoutCount(tb testing.TB, set *metrics.Set, class int) uint64 {
	tb.Helper()
	var m dto.Metric
	if err := set.Fanout[class].(prometheus.Metric).Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.Histogram.GetSampleCount()
}

// TestGroupFanout: a group message's fan-out time is observed once, when
// the last member device online at its send has it, in the group's size
// class; a device that never gets it keeps it unobserved, and a device
// offline at the send is not waited for.
func TestGroupFanout(t *testing.T) {
	// 50 users in one group of 40 and two of 5: users 0-39, 40-44 and
	// 45-49.
	layout := []config.GroupSpec{{Count: 1, Size: 40}, {Count: 2, Size: 5}}
	p, set, body := groupPop(t, 50, 2, layout)
	if len(p.groups) != 3 || len(p.groups[0].Members) != 40 || len(p.groups[2].Members) != 5 {
		t.Fatalf("layout %v made groups %v", layout, p.groups)
	}
	deliver := func(devs []*device) {
		for _, dev := range devs {
			dev.OnDelivery(&probe.Delivery{Body: *body, Group: true})
		}
	}

	sendGroup(t, p, 0, 0)
	devs := recipientDevices(p, 0, 0)
	if len(devs) != 39*2 {
		t.Fatalf("group of 40 with 2 devices each: %d recipient devices, want 78", len(devs))
	}
	deliver(devs[:len(devs)-1])
	if n := fanoutCount(t, set, 1); n != 0 {
		t.Errorf("one device still without it: %d fan-outs observed, want 0", n)
	}
	deliver(devs[len(devs)-1:])
	if n := fanoutCount(t, set, 1); n != 1 {
		t.Errorf("every device has it: %d fan-outs observed in class %s, want 1", n, metrics.SizeClasses[1])
	}

	// A device offline at the send is not waited for.
	off := p.users[43].devices[1]
	off.online.Store(false)
	sendGroup(t, p, 40, 0)
	devs = recipientDevices(p, 40, 0)
	var online []*device
	for _, d := range devs {
		if d != off {
			online = append(online, d)
		}
	}
	deliver(online)
	if n := fanoutCount(t, set, 0); n != 1 {
		t.Errorf("group of 5, every online device has it: %d fan-outs observed in class %s, want 1", n, metrics.SizeClasses[0])
	}
}

// TestGroupLayoutSpreads: a layout with more places than users puts each
// user in about as many groups, and never one user twice in a group.
func TestGroupLayoutSpreads(t *testing.T) {
	p, _, _ := groupPop(t, 30, 1, []config.GroupSpec{{Count: 12, Size: 5}, {Count: 1, Size: 100}})
	in := map[string]int{}
	for _, g := range p.groups {
		seen := map[string]bool{}
		for _, m := range g.Members {
			if seen[m] {
				t.Fatalf("group %s has %s twice: %v", g.Name, m, g.Members)
			}
			seen[m] = true
			in[m]++
		}
	}
	if len(p.groups) != 13 || len(p.groups[12].Members) != 30 {
		t.Fatalf("got %d groups, the last of %d members; want 13, the last all 30 users", len(p.groups), len(p.groups[12].Members))
	}
	for _, u := range p.users {
		// 60 places in groups of 5 over 30 users: 2 each, and the
		// group of everyone.
		if in[u.name] != 3 || len(u.groups) != 3 {
			t.Errorf("user %s in %d groups (%d streams), want 3", u.name, in[u.name], len(u.groups))
		}
	}
}

// BenchmarkGroupMessage is the prober's cost of one group message: the
// send, its ack, and its first delivery to every member device through the
// ledger and the fan-out timer. It must grow linearly with the members and
// allocate nothing per member.
func BenchmarkGroupMessage(b *testing.B) {
	for _, size := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("members=%d", size), func(b *testing.B) {
			p, _, body := groupPop(b, size, 1, []config.GroupSpec{{Count: 1, Size: size}})
			devs := recipientDevices(p, 0, 0)
			b.ReportAllocs()
			for b.Loop() {
				sendGroup(b, p, 0, 0)
				for _, dev := range devs {
					dev.OnDelivery(&probe.Delivery{Body: *body, Group: true})
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(size-1), "ns/recipient")
		})
	}
}

// TestGroupMessageAllocs: what a group message allocates does not grow
// with its members.
func TestGroupMessageAllocs(t *testing.T) {
	allocs := func(size int) float64 {
		p, _, body := groupPop(t, size, 1, []config.GroupSpec{{Count: 1, Size: size}})
		d := &probe.Delivery{Group: true}
		devs := recipientDevices(p, 0, 0)
		return testing.AllocsPerRun(50, func() {
			sendGroup(t, p, 0, 0)
			d.Body = *body
			for _, dev := range devs {
				dev.OnDelivery(d)
			}
		})
	}
	small, large := allocs(10), allocs(1000)
	if large > small {
		t.Errorf("a group message allocates %v times to 999 members against %v to 9: something allocates per member", large, small)
	}
}
