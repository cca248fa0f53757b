package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
)

// TestFloodFrames checks the flood writes what the reference server writes:
// valid JSON msg frames whose bodies are probe bodies, each stream in
// sequence from 1, and the same length for either client.
func TestFloodFrames(t *testing.T) {
	real, bare := newFloodGen(floodRun, "real-u7"), newFloodGen(floodRun, "bare-u7")
	seqs := map[string]uint64{}
	now := time.Now().UnixNano()
	for i := range 20 {
		fr, fb := real.appendFrame(nil, now), bare.appendFrame(nil, now)
		if len(fr) != len(fb) {
			t.Fatalf("frame %d: %d bytes to real-u7, %d to bare-u7: the clients must get frames of one length", i, len(fr), len(fb))
		}
		// Deliveries are 126 to 65535 bytes: the 16-bit length form.
		if fr[0] != 0x81 || fr[1] != 126 || int(fr[2])<<8|int(fr[3]) != len(fr)-4 {
			t.Fatalf("frame %d: header % x, want a final text frame of %d bytes", i, fr[:4], len(fr)-4)
		}
		var m struct {
			Type, From, To, Group, Conv, MsgID string
			Seq                                uint64
			Body                               string
		}
		if err := json.Unmarshal(fr[4:], &m); err != nil {
			t.Fatalf("frame %d: %v: %s", i, err, fr[4:])
		}
		if m.Type != "msg" || (m.To == "") == (m.Group == "") {
			t.Fatalf("frame %d = %s, want a msg to a user or a group", i, fr[4:])
		}
		var h probe.Header
		if err := probe.ParseBody([]byte(m.Body), &h); err != nil {
			t.Fatalf("frame %d body %q: %v", i, m.Body, err)
		}
		key := string(h.Sender) + " " + string(h.Stream)
		if seqs[key]++; h.Seq != seqs[key] || h.Seq != m.Seq {
			t.Errorf("frame %d: stream %s seq %d (frame seq %d), want %d", i, key, h.Seq, m.Seq, seqs[key])
		}
		if h.Intended != now || string(h.Run) != floodRun {
			t.Errorf("frame %d: run %s intended %d, want %s %d", i, h.Run, h.Intended, floodRun, now)
		}
	}
	if len(seqs) != 5 {
		t.Errorf("%d streams, want 5: one direct and four group senders, as in a group of five", len(seqs))
	}
	if short := appendWSFrame(nil, wsText, make([]byte, 100)); short[1] != 100 || len(short) != 102 {
		t.Errorf("100-byte frame header % x, want the 7-bit length form", short[:2])
	}
}

// ledgerHandler feeds a real ledger, as a population's user does.
type ledgerHandler struct{ in *engine.Inbox }

func (h ledgerHandler) OnAck(uint64, probe.Ack)      {}
func (h ledgerHandler) OnReject(uint64, string)      {}
func (h ledgerHandler) OnDelivery(d *probe.Delivery) { h.in.Receive(d.Body, d.At) }

// TestFloodRealSession floods a session of imcanary's real reference driver
// and checks its ledger counts every frame as a delivery: nothing malformed,
// stale or duplicated.
func TestFloodRealSession(t *testing.T) {
	fs, err := newFloodServer()
	if err != nil {
		t.Fatal(err)
	}
	defer fs.close()
	drv, err := reference.New(reference.Options{URL: fs.url(), Heartbeat: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	set := metrics.New(reg).For("bench", metrics.SourceBackground)
	ledger := engine.NewLedger(set, "own-run", time.Now(), 10*time.Second, 30*time.Second)
	sess, err := drv.Connect(context.Background(), "real-u0", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	var served sync.WaitGroup
	served.Go(func() { _ = sess.Serve(ledgerHandler{ledger.NewInbox()}) })
	defer func() { _ = sess.Close(); served.Wait() }()
	testwait.For(t, 10*time.Second, "the real reader ready", func() bool { return fs.ready(kindReal) == 1 })

	stop := make(chan struct{})
	var sent int
	var flooding sync.WaitGroup
	flooding.Go(func() { sent = fs.flood(kindReal, 2000, stop) })
	time.Sleep(300 * time.Millisecond)
	close(stop)
	flooding.Wait()
	if sent == 0 {
		t.Fatal("the flood wrote nothing")
	}
	delivered := func() float64 {
		var n float64
		for _, k := range set.Kind {
			for _, c := range k.Cohort {
				n += metrics.Value(c.Delivered)
			}
		}
		return n
	}
	testwait.For(t, 10*time.Second, "every message sent delivered", func() bool { return delivered() == float64(sent) })
	for _, r := range metrics.IgnoredReasons {
		if n := metrics.Value(set.Ignored[r]); n != 0 {
			t.Errorf("ignored{reason=%q} = %v, want 0", r, n)
		}
	}
	if n := ledger.Streams(); n != 5 {
		t.Errorf("ledger tracks %d streams, want 5", n)
	}
}

// TestBareReader runs the baseline client against the flood and asks it
// for its count, as the bench does over the worker's pipes.
func TestBareReader(t *testing.T) {
	fs, err := newFloodServer()
	if err != nil {
		t.Fatal(err)
	}
	defer fs.close()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- BareReader{URL: fs.url(), Conns: 3}.Run(ctx, inR, outW) }()
	out := bufio.NewScanner(outR)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("bare reader said %q, want ready", out.Text())
	}
	if n := fs.ready(kindBare); n != 3 {
		t.Fatalf("%d bare connections logged in, want 3", n)
	}
	stop := make(chan struct{})
	var sent int
	var flooding sync.WaitGroup
	flooding.Go(func() { sent = fs.flood(kindBare, 3000, stop) })
	time.Sleep(200 * time.Millisecond)
	close(stop)
	flooding.Wait()
	var got int
	testwait.For(t, 10*time.Second, "the bare reader to answer", func() bool {
		if _, err := io.WriteString(inW, "\n"); err != nil {
			t.Fatal(err)
		}
		if !out.Scan() {
			t.Fatal("bare reader stopped answering")
		}
		got, _ = strconv.Atoi(strings.TrimSpace(out.Text()))
		return got == sent
	})
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v after its input closed, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bare reader did not return after its input closed")
	}
}
