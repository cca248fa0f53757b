package mqtt_test

import (
	"bytes"
	"context"
	"errors"
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

// connect is a CONNECT a fake broker read: which device, with what
// password.
type connect struct{ clientID, password string }

// fakeBroker speaks enough MQTT 3.1.1 over WebSocket on loopback for a
// session to log in and publish: it takes any password, hands each
// CONNECT to the returned channel for the test to check, grants every
// subscription and acks every publish.
func fakeBroker(t *testing.T) (string, <-chan connect) {
	t.Helper()
	connects := make(chan connect, 8)
	up := websocket.Upgrader{Subprotocols: []string{"mqtt"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		write := func(cp v3.ControlPacket) error {
			var b bytes.Buffer
			if err := cp.Write(&b); err != nil {
				return err
			}
			return c.WriteMessage(websocket.BinaryMessage, b.Bytes())
		}
		for {
			_, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			cp, err := v3.ReadPacket(bytes.NewReader(msg))
			if err != nil {
				t.Errorf("fake broker: %v", err)
				return
			}
			switch p := cp.(type) {
			case *v3.ConnectPacket:
				connects <- connect{p.ClientIdentifier, string(p.Password)}
				err = write(v3.NewControlPacket(v3.Connack))
			case *v3.SubscribePacket:
				ack := v3.NewControlPacket(v3.Suback).(*v3.SubackPacket)
				ack.MessageID, ack.ReturnCodes = p.MessageID, p.Qoss
				err = write(ack)
			case *v3.PublishPacket:
				ack := v3.NewControlPacket(v3.Puback).(*v3.PubackPacket)
				ack.MessageID = p.MessageID
				err = write(ack)
			case *v3.PingreqPacket:
				err = write(v3.NewControlPacket(v3.Pingresp))
			case *v3.DisconnectPacket:
				return
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/mqtt", connects
}

// acks is a Handler that passes on the refs acked.
type acks chan uint64

func (a acks) OnAck(ref uint64, _ probe.Ack) { a <- ref }
func (acks) OnReject(uint64, string)         {}
func (acks) OnDelivery(*probe.Delivery)      {}

// TestRekeyNewConnects rotates the target secret, the broker's password:
// the CONNECTs after Rekey carry the new one, and a session connected
// before it stays up, publishing, until it reconnects, and then carries
// the new one too.
func TestRekeyNewConnects(t *testing.T) {
	const oldPassword, newPassword = "mqtt-first-password", "mqtt-rotated-password"
	url, connects := fakeBroker(t)
	cfg := mqtt.DefaultConfig()
	cfg.Username = "imcanary"
	drv, err := mqtt.New(cfg, mqtt.Options{URL: url, Password: []byte(oldPassword), Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Provision(context.Background(), probe.Plan{Users: []string{"ann", "bob"}}); err != nil {
		t.Fatal(err)
	}
	login := func(user string) (probe.Session, connect) {
		t.Helper()
		s, err := drv.Connect(context.Background(), user, probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		return s, <-connects
	}
	ann, c := login("ann")
	if c.password != oldPassword {
		t.Fatalf("ann's CONNECT before Rekey carries %q, want the first password", c.password)
	}
	h := make(acks, 1)
	served := make(chan error, 1)
	go func() { served <- ann.Serve(h) }()

	drv.Rekey([]byte(newPassword))
	bob, c := login("bob")
	defer bob.Close()
	if c.password != newPassword {
		t.Errorf("bob's CONNECT after Rekey carries the old password, want the new one")
	}

	// ann's session, connected with the old password, is still up: its
	// publish is acked on the same connection.
	if err := ann.Send(&probe.Message{Ref: 7, To: "bob", Body: []byte("imc1 x")}); err != nil {
		t.Fatalf("ann's publish after Rekey: %v", err)
	}
	select {
	case ref := <-h:
		if ref != 7 {
			t.Errorf("PUBACK of ref %d, want 7", ref)
		}
	case err := <-served:
		t.Fatalf("ann's session ended after Rekey: %v", err)
	}
	ann.Close()
	if err := <-served; !errors.As(err, new(*probe.Disconnect)) {
		t.Errorf("ann's Serve = %v, want a Disconnect", err)
	}

	// Reconnected, ann carries the new password.
	again, c := login("ann")
	defer again.Close()
	if c.password != newPassword {
		t.Errorf("ann's CONNECT after reconnecting carries the old password, want the new one")
	}
}
