package mqtt_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v3 "github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/mqtt"
)

// TestPasswordNeedsUserName: MQTT 3.1.1 forbids a password without a user
// name (§3.1.2.9) and mosquitto closes every such CONNECT, so the driver
// refuses the combination by name rather than have each login fail as a
// protocol error. MQTT 5 allows it.
func TestPasswordNeedsUserName(t *testing.T) {
	for _, tt := range []struct {
		version, user, password string
		ok                      bool
	}{
		{"3.1.1", "", "secret", false},
		{"3.1.1", "imcanary", "secret", true},
		{"3.1.1", "", "", true},
		{"5", "", "secret", true},
	} {
		cfg := mqtt.DefaultConfig()
		cfg.Version, cfg.Username = tt.version, tt.user
		_, err := mqtt.New(cfg, mqtt.Options{URL: "ws://127.0.0.1:1/mqtt", Password: []byte(tt.password)})
		if got := err == nil; got != tt.ok || (err != nil && !strings.Contains(err.Error(), "target.mqtt.username")) {
			t.Errorf("MQTT %s, user %q, password %q: New() = %v, want ok %v", tt.version, tt.user, tt.password, err, tt.ok)
		}
	}
}

// TestConnectClosedWithoutConnack: a broker that closes the connection in
// answer to CONNECT, as mosquitto does for a CONNECT it refuses, is
// reported as having refused it, not as a bare protocol or network error.
func TestConnectClosedWithoutConnack(t *testing.T) {
	up := websocket.Upgrader{Subprotocols: []string{"mqtt"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		if _, err := v3.ReadPacket(bytes.NewReader(msg)); err != nil {
			t.Errorf("fake broker: %v", err)
		}
	}))
	defer srv.Close()
	drv, err := mqtt.New(mqtt.DefaultConfig(), mqtt.Options{URL: "ws" + strings.TrimPrefix(srv.URL, "http") + "/mqtt", Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Provision(context.Background(), probe.Plan{Users: []string{"ann"}}); err != nil {
		t.Fatal(err)
	}
	s, err := drv.Connect(context.Background(), "ann", probe.Device{})
	if err == nil {
		s.Close()
		t.Fatal("Connect() succeeded against a broker that closed without CONNACK")
	}
	said := probe.DescribeFailure(probe.FailureReason(err), err.Error())
	if !strings.Contains(said, "broker refused the CONNECT") {
		t.Errorf("Connect() = %v, described as %q; want it to say the broker refused the CONNECT", err, said)
	}
}
