package mqtt

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/reference"
)

// appendBody appends the probe body of a group message of seq at intended.
func appendBody(dst []byte, seq uint64, intended int64) []byte {
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3"), Seq: seq, Intended: intended}
	return probe.AppendBody(dst, &h, 0)
}

// appendPublish appends the QoS 1 PUBLISH of body on the group's topic, as
// a broker sends it: MQTT 5's with an empty property list.
func appendPublish(dst, body []byte, id uint16, v5 bool) []byte {
	const topic = "imcanary/g/imcanary-g3"
	n := 2 + len(topic) + 2 + len(body)
	if v5 {
		n++
	}
	dst = append(dst, 0x32)
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n > 0 {
			c |= 0x80
		}
		dst = append(dst, c)
		if n == 0 {
			break
		}
	}
	dst = append(dst, 0, byte(len(topic)))
	dst = append(dst, topic...)
	dst = append(dst, byte(id>>8), byte(id))
	if v5 {
		dst = append(dst, 0)
	}
	return append(dst, body...)
}

// appendReference appends the reference protocol's frame of the same
// delivery.
func appendReference(dst, body []byte) []byte {
	dst = append(dst, `{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"123456","seq":77,"body":`...)
	dst = jsonscan.AppendString(dst, body)
	return append(dst, '}')
}

// BenchmarkFrameToLedger measures a group delivery from its frame's bytes
// to the ledger's counters through this adapter (packet split, the Paho
// packets decoder, topic, PUBACK queued) and through the native reference
// adapter, in one run: compare them. "build" is the frame construction
// they include.
func BenchmarkFrameToLedger(b *testing.B) {
	for _, name := range []string{"build", "reference", "mqtt", "mqtt5"} {
		b.Run(name, func(b *testing.B) {
			set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
			start := time.Now().UnixNano()
			in := engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()
			h := probetest.InboxHandler{In: in}
			s := newTestSession(b)
			if name == "mqtt5" {
				s = newTestSession(b, "5")
			}
			rd := &reader{s: s, h: h}
			ref := reference.NewDecoder(h)
			var buf, body []byte
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				body = appendBody(body[:0], uint64(i+1), start+int64(i))
				switch name {
				case "build":
					buf = appendPublish(buf[:0], body, uint16(i), false)
				case "reference":
					buf = appendReference(buf[:0], body)
					if err := ref.Frame(buf, start+int64(i)+1e6); err != nil {
						b.Fatal(err)
					}
				case "mqtt", "mqtt5":
					buf = appendPublish(buf[:0], body, uint16(i), name == "mqtt5")
					rd.at = start + int64(i) + 1e6
					if err := s.packets(buf, rd.handle); err != nil {
						b.Fatal(err)
					}
					s.acks = s.acks[:0]
				}
			}
			if name != "build" && metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered) < float64(b.N) {
				b.Fatal("deliveries not counted")
			}
		})
	}
}

// BenchmarkSessionMemory holds IMCANARYTEST_SESSIONS (default 2000) idle
// sessions on the broker of IMCANARYTEST_MOSQUITTO_URL and reports what
// each costs this process: Go heap and goroutine stacks.
func BenchmarkSessionMemory(b *testing.B) {
	url := os.Getenv("IMCANARYTEST_MOSQUITTO_URL")
	if url == "" {
		b.Skip("IMCANARYTEST_MOSQUITTO_URL not set")
	}
	n := 2000
	if s := os.Getenv("IMCANARYTEST_SESSIONS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for b.Loop() {
		heap, stack := measureSessions(b, url, n)
		b.ReportMetric(heap+stack, "heap+stack-B/session")
		b.ReportMetric(stack, "stack-B/session")
	}
}

func measureSessions(b *testing.B, url string, n int) (heapPer, stackPer float64) {
	c := DefaultConfig()
	c.TopicPrefix = "imcbench" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	drv, err := New(c, Options{URL: url, Heartbeat: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	return probetest.SessionMemory(b, drv, c.TopicPrefix, n)
}
