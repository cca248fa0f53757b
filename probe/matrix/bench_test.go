package matrix

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
	"github.com/imcanary/imcanary/probe/internal/probetest"
)

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

// BenchmarkFrameToLedger measures a group delivery from the bytes of a
// /sync answer to the ledger's counters through this adapter
// (encoding/json into the answer's structs, room lookup, sender), beside
// the native reference adapter (conformance.BenchmarkFrames).
func BenchmarkFrameToLedger(b *testing.B) { conformance.BenchmarkFrames(b, benchFrames()) }

// TestBenchFrames: the benchmark's frames are ones the adapter delivers.
func TestBenchFrames(t *testing.T) { conformance.CheckFrames(t, benchFrames()) }

// benchFrames is a /sync answer carrying one group message, and the
// session's answer reader.
func benchFrames() conformance.Frames {
	return conformance.Frames{
		Name: "matrix", Sender: "imc-b", Group: "g1",
		Build: func(dst, body []byte, seq uint64) []byte { return appendSync(dst, body, int(seq)) },
		Decoder: func(tb testing.TB, h probe.Handler) func([]byte, int64) error {
			s := newTestSession(tb)
			s.answers.Serve(h)
			return func(frame []byte, at int64) error {
				return s.Answer(&longpoll.Response{Status: 200, Body: frame, At: at})
			}
		},
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
