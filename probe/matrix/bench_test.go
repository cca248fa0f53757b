package matrix

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
	"github.com/imcanary/imcanary/probe/internal/longpoll"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/reference"
)

// appendBody appends the probe body of a group message of seq at intended.
func appendBody(dst []byte, seq uint64, intended int64) []byte {
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imc-b"), Stream: []byte("g.g1"), Seq: seq, Intended: intended}
	return probe.AppendBody(dst, &h, 0)
}

// appendSync appends a /sync answer that carries one group message, with
// the fields Dendrite v0.13.8 sends (testdata/fuzz/FuzzAnswer/sync-full)
// and its usual empty sections.
func appendSync(dst, body []byte, i int) []byte {
	n := strconv.Itoa(i)
	dst = append(dst, `{"account_data":{"events":[]},"device_lists":{},"device_one_time_keys_count":{"signed_curve25519":0},"next_batch":"s`...)
	dst = append(dst, n...)
	dst = append(dst, `_0_0_0_741_502_0_512_0","presence":{"events":[]},"rooms":{"join":{"!g:localhost":{"account_data":{"events":[]},"ephemeral":{"events":[]},"state":{"events":[]},"summary":{},"timeline":{"events":[{"content":{"body":`...)
	dst = jsonscan.AppendString(dst, body)
	dst = append(dst, `,"msgtype":"m.text"},"event_id":"$LoUiZah4lbOA27albNrVgbYRT0GDsyn-DlAeMf`...)
	dst = append(dst, n...)
	dst = append(dst, `","origin_server_ts":1796301560555,"sender":"@imc-b:localhost","type":"m.room.message"}],"limited":false,"prev_batch":"p`...)
	dst = append(dst, n...)
	return append(dst, `"},"unread_notifications":{"highlight_count":0,"notification_count":0}}}},"to_device":{"events":[]}}`...)
}

// appendReference appends the reference protocol's frame of the same
// delivery.
func appendReference(dst, body []byte) []byte {
	dst = append(dst, `{"type":"msg","from":"imc-b","group":"g1","conv":"g:g1","msg_id":"123456","seq":77,"body":`...)
	dst = jsonscan.AppendString(dst, body)
	return append(dst, '}')
}

// BenchmarkFrameToLedger measures a group delivery from the bytes of a
// /sync answer to the ledger's counters through this adapter
// (encoding/json into the answer's structs, room lookup, sender) and the
// same delivery through the native reference adapter, in one run:
// compare them. "build" is the frame construction both include.
func BenchmarkFrameToLedger(b *testing.B) {
	for _, name := range []string{"build", "reference", "matrix"} {
		b.Run(name, func(b *testing.B) {
			set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
			start := time.Now().UnixNano()
			in := engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()
			h := probetest.InboxHandler{In: in}
			s := newTestSession(b)
			s.answers.Serve(h)
			ref := reference.NewDecoder(h)
			var buf, body []byte
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				body = appendBody(body[:0], uint64(i+1), start+int64(i))
				switch name {
				case "build":
					buf = appendSync(buf[:0], body, i)
				case "reference":
					buf = appendReference(buf[:0], body)
					if err := ref.Frame(buf, start+int64(i)+1e6); err != nil {
						b.Fatal(err)
					}
				case "matrix":
					buf = appendSync(buf[:0], body, i)
					if err := s.Answer(&longpoll.Response{Status: 200, Body: buf, At: start + int64(i) + 1e6}); err != nil {
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

// BenchmarkSessionMemory holds IMCANARYTEST_SESSIONS (default 200) idle
// sessions, each with its /sync poll in flight, on the homeserver of
// IMCANARYTEST_MATRIX_URL and reports what each costs this process: Go
// heap and goroutine stacks, its HTTP connection's buffers included.
// Provisioning is a password hash per user on the server, hence the
// smaller default than the WebSocket adapters'.
func BenchmarkSessionMemory(b *testing.B) {
	url, secret := os.Getenv("IMCANARYTEST_MATRIX_URL"), os.Getenv("IMCANARYTEST_MATRIX_SECRET")
	if url == "" || secret == "" {
		b.Skip("IMCANARYTEST_MATRIX_URL and IMCANARYTEST_MATRIX_SECRET not set")
	}
	n := 200
	if s := os.Getenv("IMCANARYTEST_SESSIONS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("IMCANARYTEST_SESSIONS=%q is not a positive number", s)
		}
	}
	for b.Loop() {
		heap, stack := measureSessions(b, url, []byte(secret), n)
		b.ReportMetric(heap+stack, "heap+stack-B/session")
		b.ReportMetric(stack, "stack-B/session")
	}
}

func measureSessions(b *testing.B, url string, secret []byte, n int) (heapPer, stackPer float64) {
	c := DefaultConfig()
	drv, err := New(c, Options{URL: url, Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	return probetest.SessionMemory(b, drv, "imcbench"+strconv.FormatInt(time.Now().UnixNano()%1e9, 10), n)
}
