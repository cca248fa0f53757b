package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// TestRefserverFlagErrors: a bad device, history or fault flag is a usage
// error that names the flag and the value.
func TestRefserverFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--max-devices=0"}, "--max-devices 0: must be at least 1"},
		{[]string{"--max-devices=-3"}, "--max-devices -3: must be at least 1"},
		{[]string{"--max-devices=many"}, `--max-devices: "many": must be a whole number`},
		{[]string{"--device-policy=newest"}, `--device-policy "newest": want "oldest" or "refuse"`},
		{[]string{"--device-policy="}, `--device-policy "": want "oldest" or "refuse"`},
		{[]string{"--history=-1"}, "--history -1: must not be negative; 0 keeps no history"},
		{[]string{"--history-bytes=0"}, "--history-bytes 0: must be at least 1"},
		{[]string{"--history-bytes=1MiB"}, `--history-bytes: "1MiB": must be a whole number`},
		{[]string{"--drop-push=2"}, "--drop-push 2: must be a fraction in [0, 1]"},
		{[]string{"--skip-device=-0.5"}, "--skip-device -0.5: must be a fraction in [0, 1]"},
		{[]string{"--skip-device=NaN"}, "--skip-device NaN: must be a fraction in [0, 1]"},
	}
	for _, tt := range tests {
		code, out, errOut := runOut(append([]string{"refserver"}, tt.args...)...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, tt.want) {
			t.Errorf("imcanary refserver %q = exit %d, stdout %q, stderr %q; want exit %d and stderr containing %q",
				tt.args, code, out, errOut, exitUsage, tt.want)
		}
	}
}

// TestRefserverHelpFlags: the help lists the device and history flags and
// the new faults, with their defaults.
func TestRefserverHelpFlags(t *testing.T) {
	code, out, _ := runOut("help", "refserver")
	if code != exitOK {
		t.Fatalf("imcanary help refserver = exit %d, want 0", code)
	}
	for _, want := range []string{
		"--max-devices int", "(default 5)", "--device-policy string", `(default "oldest")`,
		"--history int", "(default 1000)", "--history-bytes int", "(default 67108864)",
		"--drop-push float", "--skip-device float",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("imcanary help refserver lacks %q:\n%s", want, out)
		}
	}
}

func TestRefserverOptions(t *testing.T) {
	tests := []struct {
		maxDevices   int
		policy       string
		history      int
		historyBytes int64
		want         refserver.Options
	}{
		{5, "oldest", 1000, 64 << 20, refserver.Options{MaxDevices: 5, DevicePolicy: refserver.DevicePolicyOldest, HistoryLimit: 1000, HistoryBytes: 64 << 20}},
		{1, "refuse", 3, 10, refserver.Options{MaxDevices: 1, DevicePolicy: refserver.DevicePolicyRefuse, HistoryLimit: 3, HistoryBytes: 10}},
		// --history 0 keeps none, which Options spells negative.
		{2, "oldest", 0, 1, refserver.Options{MaxDevices: 2, DevicePolicy: refserver.DevicePolicyOldest, HistoryLimit: -1, HistoryBytes: 1}},
	}
	for _, tt := range tests {
		got, err := refserverOptions(tt.maxDevices, tt.policy, tt.history, tt.historyBytes)
		if err != nil || got.MaxDevices != tt.want.MaxDevices || got.DevicePolicy != tt.want.DevicePolicy ||
			got.HistoryLimit != tt.want.HistoryLimit || got.HistoryBytes != tt.want.HistoryBytes {
			t.Errorf("refserverOptions(%d, %q, %d, %d) = %+v, %v; want %+v", tt.maxDevices, tt.policy, tt.history, tt.historyBytes, got, err, tt.want)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe to write from the command and read
// from the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRefserverDeviceAndHistoryFlags runs imcanary refserver with
// --max-devices 1 --device-policy refuse --history 0 and checks, with real
// WebSocket clients, that the server it serves does what they say: a
// second login is refused with 4009, and history keeps nothing.
func TestRefserverDeviceAndHistoryFlags(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr lockedBuffer
	errc := make(chan error, 1)
	go func() {
		errc <- runRefserver(ctx, []string{"--listen", "127.0.0.1:0", "--max-devices", "1", "--device-policy", "refuse",
			"--history", "0", "--log.level", "error"}, &stdout, &stderr)
	}()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("runRefserver = %v, want nil after cancel; stderr %q", err, stderr.String())
		}
	}()
	var url string
	testwait.For(t, 10*time.Second, "the URL on imcanary refserver's stdout", func() bool {
		if line, ok := strings.CutPrefix(stdout.String(), "imcanary refserver: "); ok && strings.HasSuffix(line, "\n") {
			url = strings.TrimSpace(line)
		}
		return url != ""
	})

	dial := func(user string) (*websocket.Conn, map[string]any) {
		t.Helper()
		ws, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatalf("Dial(%q) = %v", url, err)
		}
		t.Cleanup(func() { ws.Close() })
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := ws.WriteJSON(map[string]string{"type": "login", "id": "l", "user": user, "token": "t"}); err != nil {
			t.Fatal(err)
		}
		var f map[string]any
		if err := ws.ReadJSON(&f); err != nil {
			t.Fatalf("%s: login: %v", user, err)
		}
		return ws, f
	}
	u1, f := dial("u1")
	if f["type"] != "login_ok" {
		t.Fatalf("first login got %v, want login_ok", f)
	}
	second, f := dial("u1")
	if f["type"] != "error" || f["code"] != "device_limit" || f["id"] != "l" {
		t.Errorf("second login got %v, want a device_limit error", f)
	}
	var ce *websocket.CloseError
	if _, _, err := second.ReadMessage(); !errors.As(err, &ce) || ce.Code != refserver.CloseConflict || ce.Text != "device limit 1 reached" {
		t.Errorf("second login ended with %v, want close %d %q", err, refserver.CloseConflict, "device limit 1 reached")
	}

	for _, req := range []map[string]any{
		{"type": "send", "id": "s", "to": "u2", "body": "m"},
		{"type": "history", "id": "h", "conv": "d:u1:u2"},
	} {
		if err := u1.WriteJSON(req); err != nil {
			t.Fatal(err)
		}
	}
	var ack, ok map[string]any
	if err := u1.ReadJSON(&ack); err != nil || ack["type"] != "ack" {
		t.Fatalf("send got %v, %v; want an ack", ack, err)
	}
	if err := u1.ReadJSON(&ok); err != nil || ok["type"] != "ok" || ok["id"] != "h" || ok["last"] != 1.0 || ok["first"] != 2.0 {
		t.Errorf("history with --history 0 got %v, %v; want ok with last 1, first 2 and no message", ok, err)
	}
}
