package mattermost

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/probetest"
)

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

// BenchmarkFrameToLedger measures a group delivery from a posted event's
// bytes to the ledger's counters through this adapter (encoding/json
// twice: the event, then the post inside it; channel and sender lookup),
// beside the native reference adapter (conformance.BenchmarkFrames).
func BenchmarkFrameToLedger(b *testing.B) { conformance.BenchmarkFrames(b, benchFrames()) }

// benchFrames is a posted event of a group message, and the session's
// frame reader after its hello.
func benchFrames() conformance.Frames {
	return conformance.Frames{
		Name: "mattermost", Sender: "imc-b", Group: "g1",
		Build: func(dst, body []byte, seq uint64) []byte { return appendPosted(dst, body, int64(seq)) },
		Decoder: func(tb testing.TB, h probe.Handler) func([]byte, int64) error {
			s := newTestSession(tb, "http://127.0.0.1:9")
			s.catchUp = false
			if err := s.read([]byte(hello), 1, h); err != nil {
				tb.Fatal(err)
			}
			return func(frame []byte, at int64) error { return s.read(frame, at, h) }
		},
	}
}

// TestBenchFrames: the benchmark's frames are ones the adapter delivers.
func TestBenchFrames(t *testing.T) { conformance.CheckFrames(t, benchFrames()) }

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
