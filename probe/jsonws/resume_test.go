package jsonws_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/protocols"
)

// A scripted server speaking the part of Centrifugo's JSON protocol that
// configs/centrifugo-jsonws.yaml maps, so that what the mapping sends at
// each point is checked exactly: the resume of a device with a place, the
// deliveries listed in a reply, the history asked for a gap, the answer
// to the server's ping.

// cmd is one command the scripted server read.
type cmd struct {
	ID        uint64 `json:"id"`
	Connect   *struct{ Token string }
	Subscribe *struct {
		Channel string
		Recover bool
		Offset  uint64
		Epoch   string
	}
	History *struct {
		Channel string
		Limit   int
		Since   struct {
			Offset uint64
			Epoch  string
		}
	}
	raw string
}

// scripted runs script for each connection: read returns the next
// command (each line of a frame), write sends a frame.
func scripted(t *testing.T, script func(conn int, read func() cmd, write func(string))) string {
	t.Helper()
	up := websocket.Upgrader{}
	var mu sync.Mutex
	conns := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		mu.Lock()
		conns++
		n := conns
		mu.Unlock()
		var pending []string
		read := func() cmd {
			for len(pending) == 0 {
				_, b, err := c.ReadMessage()
				if err != nil {
					panic(http.ErrAbortHandler)
				}
				for _, l := range bytes.Split(b, []byte("\n")) {
					pending = append(pending, string(l))
				}
			}
			var x cmd
			if err := json.Unmarshal([]byte(pending[0]), &x); err != nil {
				t.Errorf("the mapping sent %q: %v", pending[0], err)
			}
			x.raw, pending = pending[0], pending[1:]
			return x
		}
		write := func(s string) { _ = c.WriteMessage(websocket.TextMessage, []byte(s)) }
		script(n, read, write)
		// Held open until the client goes.
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// delivered is what a handler was given of one delivery.
type delivered struct {
	seq       uint64
	recovered bool
	body      string
}

type deliveryLog struct {
	mu  sync.Mutex
	got []delivered
}

func (l *deliveryLog) OnAck(uint64, probe.Ack) {}
func (l *deliveryLog) OnReject(uint64, string) {}
func (l *deliveryLog) OnDelivery(d *probe.Delivery) {
	l.mu.Lock()
	l.got = append(l.got, delivered{d.ServerSeq, d.Recovered, string(d.Body)})
	l.mu.Unlock()
}

func (l *deliveryLog) list() []delivered {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]delivered(nil), l.got...)
}

func pub(offset uint64) string {
	return fmt.Sprintf(`{"data":{"b":"m%d"},"info":{"user":"bob","client":"c1"},"offset":%d}`, offset, offset)
}

// TestResumeListsAndFetches: a device's first session subscribes with no
// position and keeps the epoch and offset the reply gives; its next
// session resumes there, and the publications the reply lists are
// delivered as recovered; a gap in the pushes that follow is fetched with
// history since the device's place, in the same epoch, once the server's
// ping (answered) gives the session a frame after the gap's grace.
func TestResumeListsAndFetches(t *testing.T) {
	const ch = "dm:#ann,bob"
	steps := make(chan string, 16)
	url := scripted(t, func(conn int, read func() cmd, write func(string)) {
		c := read()
		if c.Connect == nil {
			t.Errorf("connection %d began with %s, want connect", conn, c.raw)
			return
		}
		write(fmt.Sprintf(`{"id":%d,"connect":{"client":"c%d"}}`, c.ID, conn))
		c = read()
		if c.Subscribe == nil || c.Subscribe.Channel != ch {
			t.Errorf("connection %d: %s, want a subscribe to %s", conn, c.raw, ch)
			return
		}
		if conn == 1 {
			if c.Subscribe.Recover {
				t.Errorf("first subscribe %s: recovers, with no place to recover from", c.raw)
			}
			write(fmt.Sprintf(`{"id":%d,"subscribe":{"recoverable":true,"epoch":"E1","offset":5,"positioned":true}}`, c.ID))
			steps <- "subscribed"
			return
		}
		if s := c.Subscribe; !s.Recover || s.Offset != 5 || s.Epoch != "E1" {
			t.Errorf("second subscribe %s: want recover from offset 5 in epoch E1", c.raw)
		}
		write(fmt.Sprintf(`{"id":%d,"subscribe":{"recoverable":true,"epoch":"E1","offset":7,"positioned":true,"recovered":true,"publications":[%s,%s]}}`,
			c.ID, pub(6), pub(7)))
		// 8 and 9 are skipped, past the session's throttle of its
		// asking; a ping after the gap's grace.
		time.Sleep(100 * time.Millisecond)
		write(`{"push":{"channel":"` + ch + `","pub":` + pub(10) + `}}`)
		time.Sleep(150 * time.Millisecond)
		write(`{}`)
		if c = read(); c.raw != "{}" {
			t.Errorf("answer to the ping: %s, want {}", c.raw)
		}
		c = read()
		h := c.History
		if h == nil || h.Channel != ch || h.Since.Offset != 7 || h.Since.Epoch != "E1" || h.Limit != 2 {
			t.Errorf("after the gap: %s, want a history of %s since offset 7 in epoch E1, limit 2", c.raw, ch)
			return
		}
		write(fmt.Sprintf(`{"id":%d,"history":{"epoch":"E1","offset":10,"publications":[%s,%s]}}`, c.ID, pub(8), pub(9)))
		steps <- "fetched"
	})
	cfg, err := protocols.Loader().Load("../../configs/centrifugo-jsonws.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := jsonws.New(config.Section[jsonws.Config](cfg, "jsonws", jsonws.DefaultConfig()), jsonws.Options{
		URL: url, Secret: []byte("resume-test-secret"), Heartbeat: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Provision(context.Background(), probe.Plan{Users: []string{"ann", "bob"}, Direct: []probe.Pair{{From: "bob", To: "ann"}}}); err != nil {
		t.Fatal(err)
	}
	cu := probe.NewCatchup(50 * time.Millisecond)
	dev := probe.Device{Catchup: cu}
	s, err := drv.Connect(context.Background(), "ann", dev)
	if err != nil {
		t.Fatal(err)
	}
	<-steps
	s.(probe.Aborter).Abort()
	_ = s.Serve(&deliveryLog{})
	if seq, mark := cu.Position(ch); seq != 5 || !strings.Contains(mark, "E1") {
		t.Fatalf("after the first session: place %d %q, want offset 5 and epoch E1 kept", seq, mark)
	}

	s, err = drv.Connect(context.Background(), "ann", dev)
	if err != nil {
		t.Fatal(err)
	}
	log := &deliveryLog{}
	done := make(chan error, 1)
	go func() { done <- s.Serve(log) }()
	select {
	case <-steps:
	case <-time.After(10 * time.Second):
		t.Fatal("the scripted server never saw the history request")
	}
	waitFor(t, func() bool { return len(log.list()) == 5 })
	_ = s.Close()
	<-done
	want := []delivered{{6, true, "m6"}, {7, true, "m7"}, {10, false, "m10"}, {8, true, "m8"}, {9, true, "m9"}}
	if got := log.list(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
	if seq, _ := cu.Position(ch); seq != 10 || cu.Lacks() {
		t.Errorf("place %d, lacks %v: want 10 and nothing missing", seq, cu.Lacks())
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("timed out")
		}
	}
}
