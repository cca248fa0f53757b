package refserver

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/imcanary/imcanary/internal/testwait"
)

// sessions logs in n sessions of each user, named "user#i" in login order.
func sessions(t *testing.T, url string, users map[string]int) map[string]*client {
	t.Helper()
	cs := make(map[string]*client)
	for _, u := range slices.Sorted(maps.Keys(users)) {
		for i := range users[u] {
			c := login(t, url, u, "t")
			c.user = u + "#" + strconv.Itoa(i)
			cs[c.user] = c
		}
	}
	return cs
}

// TestDeviceLimit: up to MaxDevices sessions of a user stay open; a login
// beyond closes the oldest with CloseConflict (DevicePolicyOldest) or is
// refused with a device_limit error and CloseConflict
// (DevicePolicyRefuse); a delivery reaches every session left open.
func TestDeviceLimit(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		logins     int
		kicked     []int // sessions closed by a later login
		refused    []int // logins refused
		wantReason string
	}{
		{"one device: a new login replaces the old", Options{MaxDevices: 1}, 2, []int{0}, nil, "device limit 1 reached"},
		{"one device, three logins", Options{MaxDevices: 1}, 3, []int{0, 1}, nil, "device limit 1 reached"},
		{"default: five sessions stay open", Options{}, 5, nil, nil, ""},
		{"default: a sixth closes the oldest", Options{}, 6, []int{0}, nil, "device limit 5 reached"},
		{"refuse: the third login is refused", Options{MaxDevices: 2, DevicePolicy: DevicePolicyRefuse}, 3, nil, []int{2}, "device limit 2 reached"},
		{"refuse: every login past the limit", Options{MaxDevices: 1, DevicePolicy: DevicePolicyRefuse}, 3, nil, []int{1, 2}, "device limit 1 reached"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, tt.opts)
			var open []*client
			cs := make([]*client, tt.logins)
			for i := range tt.logins {
				c := dialWS(t, url)
				c.user = "u1#" + strconv.Itoa(i)
				id := c.write(map[string]any{"type": "login", "user": "u1", "token": "t"})
				cs[i] = c
				if slices.Contains(tt.refused, i) {
					f := c.readType("error")
					if f.ID != id || f.Code != "device_limit" || f.Message == "" {
						t.Errorf("refused login %d got %s, want a device_limit error with id %q", i, f.raw, id)
					}
					if code, text := c.readClose(); code != CloseConflict || text != tt.wantReason {
						t.Errorf("refused login %d: close %d %q, want %d %q", i, code, text, CloseConflict, tt.wantReason)
					}
					continue
				}
				if f := c.readType("login_ok"); f.ID != id {
					t.Fatalf("login %d: login_ok id %q, want %q", i, f.ID, id)
				}
			}
			for i, c := range cs {
				switch {
				case slices.Contains(tt.refused, i):
				case slices.Contains(tt.kicked, i):
					if code, text := c.readClose(); code != CloseConflict || text != tt.wantReason {
						t.Errorf("session %d: close %d %q, want %d %q", i, code, text, CloseConflict, tt.wantReason)
					}
				default:
					open = append(open, c)
				}
			}
			sender := login(t, url, "u2", "t")
			testwait.For(t, ioTimeout, "the closed sessions to be gone", func() bool { return s.Stats().Connections == int64(len(open)+1) })
			sender.sendTo("u1", "to every device")
			sender.readType("ack")
			for _, c := range open {
				if f := c.readType("msg"); f.Body != "to every device" || f.From != "u2" {
					t.Errorf("%s got %s, want the message from u2", c.user, f.raw)
				}
				c.roundTrip()
			}
			st := s.Stats()
			wantLimit := uint64(len(tt.kicked) + len(tt.refused))
			if st.DeviceLimit != wantLimit || st.Logins != uint64(tt.logins-len(tt.refused)+1) || st.Deliveries != uint64(len(open)) {
				t.Errorf("Stats() = %+v, want DeviceLimit %d, Logins %d, Deliveries %d", st, wantLimit, tt.logins-len(tt.refused)+1, len(open))
			}
		})
	}
}

// TestMultiDeviceDelivery: a delivery goes to every open session of its
// recipient, and a message also goes to the sender's other sessions
// (self-sync), the same frame each, once.
func TestMultiDeviceDelivery(t *testing.T) {
	tests := []struct {
		name     string
		sessions map[string]int
		from     string // the sending session
		to       string // a user, or "" for the group g of every user
		want     []string
	}{
		{
			"direct: every session of the recipient, and the sender's others",
			map[string]int{"u1": 3, "u2": 2, "u3": 1}, "u1#0", "u2",
			[]string{"u1#1", "u1#2", "u2#0", "u2#1"},
		},
		{
			"group: every session of every other member, and the sender's others",
			map[string]int{"u1": 3, "u2": 2, "u3": 1}, "u1#1", "",
			[]string{"u1#0", "u1#2", "u2#0", "u2#1", "u3#0"},
		},
		{
			"one session each: no self-sync",
			map[string]int{"u1": 1, "u2": 1}, "u1#0", "u2",
			[]string{"u2#0"},
		},
		{
			"to oneself: every session once, the sending one too",
			map[string]int{"u1": 2, "u2": 1}, "u1#0", "u1",
			[]string{"u1#0", "u1#1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, Options{})
			cs := sessions(t, url, tt.sessions)
			from := cs[tt.from]
			sender := tt.from[:2]
			wantConv := "g:g"
			if tt.to == "" {
				from.write(map[string]any{"type": "group", "group": "g", "members": slices.Sorted(maps.Keys(tt.sessions))})
				from.readType("ok")
				from.sendGroup("g", "hello")
			} else {
				wantConv = "d:" + min(sender, tt.to) + ":" + max(sender, tt.to)
				from.sendTo(tt.to, "hello")
			}
			ack := from.readType("ack")
			var first []byte
			for _, name := range slices.Sorted(maps.Keys(cs)) {
				c := cs[name]
				if slices.Contains(tt.want, name) {
					f := c.readType("msg")
					if f.From != sender || f.Conv != wantConv || f.Seq != 1 || f.MsgID != ack.MsgID || f.Body != "hello" {
						t.Errorf("%s got %s, want the message of ack %s from %s", name, f.raw, ack.raw, sender)
					}
					if first == nil {
						first = f.raw
					} else if !bytes.Equal(f.raw, first) {
						t.Errorf("%s got %s, want the same bytes as %s", name, f.raw, first)
					}
				}
				c.roundTrip() // once, and nothing else
			}
			if got := s.Stats().Deliveries; got != uint64(len(tt.want)) {
				t.Errorf("Stats().Deliveries = %d, want %d", got, len(tt.want))
			}
		})
	}
}

// TestMultiDeviceOffline: the offline queue is used only when the user
// has no open session, and its backlog goes to the next session alone.
func TestMultiDeviceOffline(t *testing.T) {
	s, url := startServer(t, Options{})
	u1 := login(t, url, "u1", "t")
	send := func(body string) {
		t.Helper()
		u1.sendTo("u2", body)
		u1.readType("ack")
	}
	send("offline 1")
	send("offline 2")
	first := login(t, url, "u2", "t")
	for _, want := range []string{"offline 1", "offline 2"} {
		if f := first.readType("msg"); f.Body != want {
			t.Errorf("first session got %s, want the backlog %q", f.raw, want)
		}
	}
	second := login(t, url, "u2", "t")
	second.roundTrip() // no backlog left for it
	send("live")
	for _, c := range []*client{first, second} {
		if f := c.readType("msg"); f.Body != "live" {
			t.Errorf("got %s, want the live message", f.raw)
		}
	}
	// A session gone leaves the other one, not the offline queue.
	first.ws.Close()
	testwait.For(t, ioTimeout, "the first session to be gone", func() bool { return s.Stats().Connections == 2 })
	send("one left")
	if f := second.readType("msg"); f.Body != "one left" {
		t.Errorf("second session got %s, want %q", f.raw, "one left")
	}
	if got := s.Stats().OfflineQueued; got != 2 {
		t.Errorf("Stats().OfflineQueued = %d with a session open, want 2", got)
	}
	second.ws.Close()
	testwait.For(t, ioTimeout, "the second session to be gone", func() bool { return s.Stats().Connections == 1 })
	send("all gone")
	if got := s.Stats().OfflineQueued; got != 3 {
		t.Errorf("Stats().OfflineQueued = %d with no session, want 3", got)
	}
}

// TestReorderHeldAcrossSessions: a delivery held back by the reorder fault
// for a session that closes goes to the user's sessions that logged in
// since it was held, or to the offline queue if none is open, and never
// twice to a session that holds its own copy.
func TestReorderHeldAcrossSessions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		// before logs in u2's sessions before the held message; the
		// first of them closes while holding it.
		before int
		// after logs in one more session after it, if true.
		after bool
		// want is what the last session of u2 reads, in order, once a
		// second message is sent with the faults off.
		want []uint64
	}{
		// MaxDevices 1: the later login closes the holder, and the held
		// delivery goes to it.
		{"to a session that logged in since", Options{MaxDevices: 1}, 1, true, []uint64{1, 2}},
		// The other session holds its own copy, released by the next
		// message of the stream.
		{"not to a session that has its own copy", Options{}, 2, false, []uint64{2, 1}},
		// No session open: the offline queue, delivered at the next
		// login.
		{"to the offline queue", Options{}, 1, true, []uint64{1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Faults = Faults{Reorder: 1}
			s, url := startServer(t, tt.opts)
			u1 := login(t, url, "u1", "t")
			var u2 []*client
			for range tt.before {
				u2 = append(u2, login(t, url, "u2", "t"))
			}
			u1.sendTo("u2", "held")
			u1.readType("ack")
			holder := u2[0]
			if tt.opts.MaxDevices != 1 {
				holder.ws.Close()
				testwait.For(t, ioTimeout, "the holder to be gone", func() bool { return s.Stats().Connections == int64(tt.before) })
			}
			if tt.after {
				u2 = append(u2, login(t, url, "u2", "t"))
			}
			if tt.opts.MaxDevices == 1 {
				if code, _ := holder.readClose(); code != CloseConflict {
					t.Fatalf("holder closed with %d, want %d", code, CloseConflict)
				}
				// Gone, not just closing: its held delivery is rerouted
				// as it goes, and must be before the next message.
				testwait.For(t, ioTimeout, "the holder to be gone", func() bool { return s.Stats().Connections == 2 })
			}
			last := u2[len(u2)-1]
			s.SetFaults(Faults{})
			u1.sendTo("u2", "next")
			u1.readType("ack")
			var got []uint64
			for range tt.want {
				got = append(got, last.readType("msg").Seq)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("last session got seqs %v, want %v", got, tt.want)
			}
			last.roundTrip() // and nothing twice
		})
	}
}
