package mqtt

import (
	"testing"

	"github.com/imcanary/imcanary/probe/internal/fuzzcorpus"
)

// FuzzFrames reads arbitrary bytes as the packets of two WebSocket frames,
// split where the first byte says, by the decoder of MQTT 3.1.1 or 5 (the PUBACKs they queue are not
// written: the session has no connection). Whatever they are, reading never
// panics, a packet is carried across frames only while it is incomplete
// and never past max_packet, and a delivery is only ever a PUBLISH.
// Seeds are frames captured from mosquitto and mochi-mqtt (testdata).
func FuzzFrames(f *testing.F) {
	for _, s := range fuzzcorpus.Bytes(f, "testdata/fuzz/FuzzFrames") {
		f.Add(s)
	}
	f.Add([]byte{0x30, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{0x36, 4, 0, 1, 'a', 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		// Either version's decoder, as the second byte says.
		v := "3.1.1"
		if len(data) > 1 && data[1]&1 == 1 {
			v = "5"
		}
		s := newTestSession(t, v)
		s.inflight = []flight{{1, 10}, {2, 20}}
		r := &recorder{}
		rd := &reader{s: s, h: r}
		cut := 0
		if len(data) > 0 {
			cut = int(data[0]) % (len(data) + 1)
		}
		rd.at = 1
		if err := s.packets(data[:cut], rd.handle); err != nil {
			return
		}
		if len(s.carry) > s.d.cfg.MaxPacket {
			t.Fatalf("%d bytes carried, more than max_packet", len(s.carry))
		}
		_ = s.packets(data[cut:], rd.handle)
		if len(r.acks) > 2 {
			t.Fatalf("%d acks for 2 flights", len(r.acks))
		}
	})
}
