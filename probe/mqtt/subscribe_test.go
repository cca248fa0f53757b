package mqtt_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v3 "github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/mqtt"
)

// idBroker is a fake MQTT 3.1.1 broker with mochi-mqtt's way with packet
// ids: it keeps each client's persistent session, replays the publishes
// the session has not acknowledged (DUP) after CONNACK, and refuses a
// SUBSCRIBE whose packet id one of them has with 0x91 for every filter.
type idBroker struct {
	url string
	// always refuses every SUBSCRIBE as in use.
	always atomic.Bool

	mu sync.Mutex
	// unacked are the publishes to each client id it awaits the PUBACK
	// of, by packet id.
	unacked map[string]map[uint16]*v3.PublishPacket
	// subscribes are the packet ids of the SUBSCRIBEs it read, in order.
	subscribes []uint16
}

func newIDBroker(t *testing.T) *idBroker {
	t.Helper()
	b := &idBroker{unacked: map[string]map[uint16]*v3.PublishPacket{}}
	up := websocket.Upgrader{Subprotocols: []string{"mqtt"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		b.serve(t, c)
	}))
	t.Cleanup(srv.Close)
	b.url = "ws" + strings.TrimPrefix(srv.URL, "http") + "/mqtt"
	return b
}

// queue holds a publish of body to topic for client, as in flight to its
// session under packet id: what a reconnecting session finds.
func (b *idBroker) queue(client, topic string, id uint16, body []byte) {
	p := v3.NewControlPacket(v3.Publish).(*v3.PublishPacket)
	p.TopicName, p.MessageID, p.Qos, p.Payload = topic, id, 1, body
	b.mu.Lock()
	if b.unacked[client] == nil {
		b.unacked[client] = map[uint16]*v3.PublishPacket{}
	}
	b.unacked[client][id] = p
	b.mu.Unlock()
}

func (b *idBroker) pending(client string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.unacked[client])
}

// subscribeIDs returns the packet ids of the SUBSCRIBEs read since the
// last call.
func (b *idBroker) subscribeIDs() []uint16 {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := b.subscribes
	b.subscribes = nil
	return ids
}

func (b *idBroker) serve(t *testing.T, c *websocket.Conn) {
	write := func(cp v3.ControlPacket) error {
		var buf bytes.Buffer
		if err := cp.Write(&buf); err != nil {
			return err
		}
		return c.WriteMessage(websocket.BinaryMessage, buf.Bytes())
	}
	var client string
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
			client = p.ClientIdentifier
			b.mu.Lock()
			var replay []*v3.PublishPacket
			for _, q := range b.unacked[client] {
				q.Dup = true
				replay = append(replay, q)
			}
			b.mu.Unlock()
			ack := v3.NewControlPacket(v3.Connack).(*v3.ConnackPacket)
			ack.SessionPresent = len(replay) > 0
			err = write(ack)
			for _, q := range replay {
				if err == nil {
					err = write(q)
				}
			}
		case *v3.SubscribePacket:
			b.mu.Lock()
			b.subscribes = append(b.subscribes, p.MessageID)
			_, inUse := b.unacked[client][p.MessageID]
			b.mu.Unlock()
			ack := v3.NewControlPacket(v3.Suback).(*v3.SubackPacket)
			ack.MessageID, ack.ReturnCodes = p.MessageID, p.Qoss
			if inUse || b.always.Load() {
				ack.ReturnCodes = bytes.Repeat([]byte{0x91}, len(p.Qoss))
			}
			err = write(ack)
		case *v3.PubackPacket:
			b.mu.Lock()
			delete(b.unacked[client], p.MessageID)
			b.mu.Unlock()
		case *v3.PingreqPacket:
			err = write(v3.NewControlPacket(v3.Pingresp))
		case *v3.DisconnectPacket:
			return
		}
		if err != nil {
			return
		}
	}
}

// deliveries is a Handler that passes on what it is delivered.
type deliveries chan probe.Delivery

func (deliveries) OnAck(uint64, probe.Ack)        {}
func (deliveries) OnReject(uint64, string)        {}
func (d deliveries) OnDelivery(x *probe.Delivery) { d <- *x }

// TestSubscribeIDInUse: a persistent session comes back to a broker that
// holds one of its own publishes, in flight to the session, under the
// packet id of the SUBSCRIBE (mochi-mqtt numbers its publishes to each
// new connection from 1). The login asks again under another id and gets
// in, the replayed publish is delivered as recovered and acknowledged,
// and the next login, with nothing in flight, subscribes once. A broker
// that refuses every id still fails the login, after a bounded number of
// SUBSCRIBEs.
func TestSubscribeIDInUse(t *testing.T) {
	b := newIDBroker(t)
	cfg := mqtt.DefaultConfig()
	drv, err := mqtt.New(cfg, mqtt.Options{URL: b.url, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Provision(context.Background(), probe.Plan{Users: []string{"ann", "bob"}}); err != nil {
		t.Fatal(err)
	}
	client := cfg.ClientIDPrefix + "ann-0"
	body := probe.AppendBody(nil, &probe.Header{Run: []byte("r"), Sender: []byte("bob"), Stream: []byte("d.ann"), Seq: 1, Intended: time.Now().UnixNano()}, 0)
	b.queue(client, cfg.TopicPrefix+"/dm/ann/bob", 1, body)
	dev := probe.Device{Catchup: probe.NewCatchup(time.Second)}

	s, err := drv.Connect(context.Background(), "ann", dev)
	if err != nil {
		t.Fatalf("Connect with packet id 1 in flight to the session = %v, want logged in", err)
	}
	if ids := b.subscribeIDs(); len(ids) != 2 || ids[0] != 1 || ids[1] == 1 {
		t.Errorf("SUBSCRIBE packet ids %v, want 1 and then another", ids)
	}
	h := make(deliveries, 1)
	served := make(chan error, 1)
	go func() { served <- s.Serve(h) }()
	select {
	case d := <-h:
		if !bytes.Equal(d.Body, body) || !d.Recovered {
			t.Errorf("delivered %q, recovered %v; want the replayed body, recovered", d.Body, d.Recovered)
		}
	case err := <-served:
		t.Fatalf("Serve ended before the replayed publish: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the replayed publish was not delivered")
	}
	// Its PUBACK follows the delivery; the broker reads it on its own
	// time.
	testwait.For(t, 10*time.Second, "the replayed publish to be acknowledged", func() bool { return b.pending(client) == 0 })
	_ = s.Close()
	<-served

	// Nothing in flight: one SUBSCRIBE, the first id.
	s, err = drv.Connect(context.Background(), "ann", dev)
	if err != nil {
		t.Fatalf("Connect with nothing in flight = %v", err)
	}
	_ = s.Close()
	if ids := b.subscribeIDs(); !slices.Equal(ids, []uint16{1}) {
		t.Errorf("SUBSCRIBE packet ids %v with nothing in flight, want [1]", ids)
	}

	b.always.Store(true)
	if _, err := drv.Connect(context.Background(), "ann", dev); err == nil || !strings.Contains(err.Error(), "0x91") {
		t.Errorf("Connect to a broker refusing every SUBSCRIBE = %v, want the refusal", err)
	}
	if ids := b.subscribeIDs(); len(ids) < 2 || len(ids) > 8 {
		t.Errorf("%d SUBSCRIBEs to a broker refusing every one (%v), want a few", len(ids), ids)
	}
}
