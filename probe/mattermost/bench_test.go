package mattermost

import (
	"encoding/json"
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
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imc-b"), Stream: []byte("g.g1"), Seq: seq, Intended: intended}
	return probe.AppendBody(dst, &h, 0)
}

// appendPosted appends a posted event of body with the fields Mattermost
// v6.7.2 sends (testdata/fuzz/FuzzRead/03-posted): the post is JSON
// encoded inside the event's JSON.
func appendPosted(dst, body []byte, seq int64) []byte {
	var p []byte
	p = append(p, `{"id":"sn6rznkyuj8ziyejmnrxuwu6fo","create_at":1796302703209,"update_at":1796302703209,"edit_at":0,"delete_at":0,"is_pinned":false,"user_id":"uidb","channel_id":"gch","root_id":"","original_id":"","message":`...)
	p = jsonscan.AppendString(p, body)
	p = append(p, `,"type":"","props":{},"hashtags":"","pending_post_id":"uidb:abc.1","reply_count":0,"last_reply_at":0,"participants":null,"metadata":{}}`...)
	dst = append(dst, `{"event":"posted","data":{"channel_display_name":"capa, capb, capc","channel_name":"9ed81ca42bb5edd26c8c11a21bf1a1ed24c8884f","channel_type":"G","post":`...)
	dst = jsonscan.AppendString(dst, p)
	dst = append(dst, `,"sender_name":"@imc-b","set_online":true,"team_id":""},"broadcast":{"omit_users":null,"user_id":"","channel_id":"gch","team_id":""},"seq":`...)
	dst = strconv.AppendInt(dst, seq, 10)
	return append(dst, '}')
}

// appendReference appends the reference protocol's frame of the same
// delivery.
func appendReference(dst, body []byte) []byte {
	dst = append(dst, `{"type":"msg","from":"imc-b","group":"g1","conv":"g:g1","msg_id":"123456","seq":77,"body":`...)
	dst = jsonscan.AppendString(dst, body)
	return append(dst, '}')
}

// BenchmarkFrameToLedger measures a group delivery from a posted event's
// bytes to the ledger's counters through this adapter (encoding/json
// twice: the event, then the post inside it; channel and sender lookup)
// and the same delivery through the native reference adapter, in one run:
// compare them. "build" is the frame construction both include.
func BenchmarkFrameToLedger(b *testing.B) {
	for _, name := range []string{"build", "reference", "mattermost"} {
		b.Run(name, func(b *testing.B) {
			set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
			start := time.Now().UnixNano()
			in := engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()
			h := probetest.InboxHandler{In: in}
			s := newTestSession(b, "http://127.0.0.1:9")
			s.catchUp = false
			if err := s.read([]byte(hello), 1, h); err != nil {
				b.Fatal(err)
			}
			ref := reference.NewDecoder(h)
			var buf, body []byte
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				body = appendBody(body[:0], uint64(i+1), start+int64(i))
				switch name {
				case "build":
					buf = appendPosted(buf[:0], body, int64(i+1))
				case "reference":
					buf = appendReference(buf[:0], body)
					if err := ref.Frame(buf, start+int64(i)+1e6); err != nil {
						b.Fatal(err)
					}
				case "mattermost":
					buf = appendPosted(buf[:0], body, int64(i+1))
					if err := s.read(buf, start+int64(i)+1e6, h); err != nil {
						b.Fatal(err)
					}
				}
			}
			if name != "build" && metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered) < float64(b.N) {
				b.Fatal("deliveries not counted")
			}
		})
	}
}

// The benchmark's frame must be one the adapter delivers: a test, so
// that a change of the frame's shape is caught without running benchmarks.
func TestBenchFrame(t *testing.T) {
	var f wsFrame
	if err := json.Unmarshal(appendPosted(nil, []byte("x"), 3), &f); err != nil || f.Event != "posted" {
		t.Fatalf("%v %+v", err, f)
	}
	s := newTestSession(t, "http://127.0.0.1:9")
	r := &recorder{}
	if err := s.read([]byte(hello), 1, r); err != nil {
		t.Fatal(err)
	}
	if err := s.read(appendPosted(nil, []byte("x"), 1), 1, r); err != nil || len(r.deliveries) != 1 {
		t.Fatalf("%v, %d deliveries", err, len(r.deliveries))
	}
}

// BenchmarkSessionMemory holds IMCANARYTEST_SESSIONS (default 500) idle
// sessions on the server of IMCANARYTEST_MATTERMOST_URL and reports what
// each costs this process: Go heap and goroutine stacks. Each is a user
// signed up on the server, hence fewer than the reference adapter's.
func BenchmarkSessionMemory(b *testing.B) {
	url := os.Getenv("IMCANARYTEST_MATTERMOST_URL")
	if url == "" {
		b.Skip("IMCANARYTEST_MATTERMOST_URL not set")
	}
	n := 500
	if s := os.Getenv("IMCANARYTEST_SESSIONS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("IMCANARYTEST_SESSIONS=%q is not a positive number", s)
		}
	}
	for b.Loop() {
		heap, stack := measureSessions(b, url, n)
		b.ReportMetric(heap+stack, "heap+stack-B/session")
		b.ReportMetric(stack, "stack-B/session")
	}
}

func measureSessions(b *testing.B, url string, n int) (heapPer, stackPer float64) {
	drv, err := New(DefaultConfig(), Options{URL: url, Secret: []byte("imcanary bench"), Heartbeat: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	return probetest.SessionMemory(b, drv, "imcbench"+strconv.FormatInt(time.Now().UnixNano()%1e9, 10), n)
}
