package mqtt

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/internal/probetest"
)

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

// BenchmarkFrameToLedger measures a group delivery from its frame's bytes
// to the ledger's counters through this adapter (packet split, the Paho
// packets decoder, topic, PUBACK queued), at MQTT 3.1.1 and 5, beside the
// native reference adapter (conformance.BenchmarkFrames).
func BenchmarkFrameToLedger(b *testing.B) {
	conformance.BenchmarkFrames(b, benchFrames("mqtt", false), benchFrames("mqtt5", true))
}

// TestBenchFrames: the benchmark's frames are ones the adapter delivers.
func TestBenchFrames(t *testing.T) {
	conformance.CheckFrames(t, benchFrames("mqtt", false), benchFrames("mqtt5", true))
}

// benchFrames is a group delivery's PUBLISH, at MQTT 5 or 3.1.1, and the
// session's packet reader.
func benchFrames(name string, v5 bool) conformance.Frames {
	return conformance.Frames{
		Name:  name,
		Build: func(dst, body []byte, seq uint64) []byte { return appendPublish(dst, body, uint16(seq), v5) },
		Decoder: func(tb testing.TB, h probe.Handler) func([]byte, int64) error {
			s := newTestSession(tb)
			if v5 {
				s = newTestSession(tb, "5")
			}
			rd := &reader{s: s, h: h}
			return func(frame []byte, at int64) error {
				rd.at = at
				err := s.packets(frame, rd.handle)
				s.acks = s.acks[:0]
				return err
			}
		},
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
