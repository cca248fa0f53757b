package mqtt

import (
	"testing"

	"github.com/imcanary/imcanary/probe/internal/fuzzcorpus"
)

// FuzzFrames reads arbitrary bytes as the packets of two WebSocket frames,
// split where the first byte says, by the decoders of MQTT 3.1.1 and 5 (the PUBACKs they queue are not
// written: the session has no connection). Whatever they are, reading never
// panics, a packet is carried across frames only while it is incomplete
// and never past max_packet, and a delivery is only ever a PUBLISH.
// Seeds are frames captured from mosquitto and mochi-mqtt, in both
// versions (testdata).
func FuzzFrames(f *testing.F) {
	for _, s := range fuzzcorpus.Bytes(f, "testdata/fuzz/FuzzFrames") {
		f.Add(s)
	}
	f.Add([]byte{0x30, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{0x36, 4, 0, 1, 'a', 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		cut := 0
		if len(data) > 0 {
			cut = int(data[0]) % (len(data) + 1)
		}
		for _, v := range []string{"3.1.1", "5"} {
			s := newTestSession(t, v)
			s.inflight = []flight{{1, 10}, {2, 20}}
			r := &recorder{}
			rd := &reader{s: s, h: r, at: 1}
			if err := s.packets(data[:cut], rd.handle); err != nil {
				continue
			}
			if len(s.carry) > s.d.cfg.MaxPacket {
				t.Fatalf("%s: %d bytes carried, more than max_packet", v, len(s.carry))
			}
			_ = s.packets(data[cut:], rd.handle)
			if len(r.acks)+len(r.rejects) > 2 {
				t.Fatalf("%s: %d acks and rejects for 2 flights", v, len(r.acks)+len(r.rejects))
			}
		}
	})
}
