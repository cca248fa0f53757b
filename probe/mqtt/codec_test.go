package mqtt

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

func TestSplit(t *testing.T) {
	big := codec311{}.publish("t/g/x", 1, 1, bytes.Repeat([]byte{'a'}, 300)) // two-byte length
	for _, tc := range []struct {
		name  string
		in    []byte
		size  int
		whole bool
		err   string
	}{
		{"empty", nil, 0, false, ""},
		{"type only", []byte{0xd0}, 0, false, ""},
		{"pingresp", []byte{0xd0, 0}, 2, true, ""},
		{"two packets", []byte{0xd0, 0, 0xd0, 0}, 2, true, ""},
		{"puback part", []byte{0x40, 2, 0}, 4, false, ""},
		{"varint", big, len(big), true, ""},
		{"varint cut", big[:2], 0, false, ""},
		{"varint body cut", big[:100], len(big), false, ""},
		{"five byte length", []byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x01}, 0, false, "longer than 4 bytes"},
		{"over limit", []byte{0x30, 0xff, 0xff, 0x7f}, 0, false, "larger than max_packet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size, whole, err := split(tc.in, 1<<16)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || size != tc.size || whole != tc.whole {
				t.Fatalf("split = %d, %v, %v; want %d, %v", size, whole, err, tc.size, tc.whole)
			}
		})
	}
}

// recorder is a Handler that keeps what it is given.
type recorder struct {
	acks       []uint64
	rejects    []string
	deliveries []string
	groups     int
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) { r.acks = append(r.acks, ref) }
func (r *recorder) OnReject(ref uint64, why string) {
	r.rejects = append(r.rejects, fmt.Sprint(ref, " ", why))
}
func (r *recorder) OnDelivery(d *probe.Delivery) {
	r.deliveries = append(r.deliveries, string(d.From)+":"+string(d.Body))
	if d.Group {
		r.groups++
	}
}

func newTestSession(t testing.TB, version ...string) *session {
	c := DefaultConfig()
	if len(version) > 0 {
		c.Version = version[0]
	}
	d, err := New(c, Options{URL: "ws://127.0.0.1:1/mqtt"})
	if err != nil {
		t.Fatal(err)
	}
	return &session{d: d, user: "bob"}
}

// frames of a stream split at every byte, or merged, read the same, in
// either version.
func TestFramesSplitAndMerged(t *testing.T) {
	for _, v := range []string{"3.1.1", "5"} {
		for _, chunk := range []int{1, 3, 7, 1 << 20} {
			s := newTestSession(t, v)
			c := s.d.c
			stream := slicesConcat(
				c.publish("imcanary/dm/bob/alice", 7, 1, []byte("one")),
				c.publish("imcanary/g/team", 8, 1, []byte("two")),
				c.publish("other/topic", 0, 0, []byte("three")),
			)
			r := &recorder{}
			rd := &reader{s: s, h: r}
			for b := stream; len(b) > 0; {
				n := min(chunk, len(b))
				if err := s.packets(b[:n], rd.handle); err != nil {
					t.Fatalf("%s, chunk %d: %v", v, chunk, err)
				}
				b = b[n:]
			}
			if got := strings.Join(r.deliveries, ","); got != "alice:one,:two" || r.groups != 1 {
				t.Errorf("%s, chunk %d: deliveries %q (%d group), want alice:one,:two (1 group)", v, chunk, got, r.groups)
			}
			// Both QoS 1 publishes acked, together.
			if want := appendPuback(appendPuback(nil, 7), 8); !bytes.Equal(s.acks, want) {
				t.Errorf("%s, chunk %d: PUBACKs % x, want % x", v, chunk, s.acks, want)
			}
			if s.d.FramesUnmatched() != 1 {
				t.Errorf("%s, chunk %d: unmatched %d, want the publish on other/topic", v, chunk, s.d.FramesUnmatched())
			}
			if s.carry != nil {
				t.Errorf("%s, chunk %d: %d bytes still carried after the last packet", v, chunk, len(s.carry))
			}
		}
	}
}

// PUBACKs resolve the flights they name, in any order; one for no flight
// is counted, not acked.
func TestAcks(t *testing.T) {
	s := newTestSession(t)
	s.inflight = []flight{{1, 100}, {2, 200}, {3, 300}}
	r := &recorder{}
	s.acked(2, 0, r)
	s.acked(1, 0, r)
	s.acked(9, 0, r)
	s.acked(3, 0, r)
	if got := r.acks; len(got) != 3 || got[0] != 200 || got[1] != 100 || got[2] != 300 {
		t.Errorf("acks %v, want [200 100 300]", got)
	}
	if s.inflight != nil || s.d.FramesUnmatched() != 1 {
		t.Errorf("inflight %v, unmatched %d: want none left, one unmatched", s.inflight, s.d.FramesUnmatched())
	}
}

// An MQTT 5 PUBACK with a reason code of 0x80 or more refuses the publish,
// with the reason named.
func TestPubackReason5(t *testing.T) {
	s := newTestSession(t, "5")
	s.inflight = []flight{{1, 100}, {2, 200}}
	r := &recorder{}
	rd := &reader{s: s, h: r}
	// PUBACK 1, reason 0x97 quota exceeded, no properties; PUBACK 2, 0x10
	// no matching subscribers, which is success.
	if err := s.packets([]byte{0x40, 3, 0, 1, 0x97, 0x40, 3, 0, 2, 0x10}, rd.handle); err != nil {
		t.Fatal(err)
	}
	if len(r.rejects) != 1 || r.rejects[0] != "100 quota exceeded" || len(r.acks) != 1 || r.acks[0] != 200 {
		t.Errorf("rejects %q, acks %v: want 100 refused for quota, 200 accepted", r.rejects, r.acks)
	}
}

// An MQTT 5 DISCONNECT from the broker ends the session with its reason:
// a session taken over by the same client id is a conflict.
func TestDisconnect5(t *testing.T) {
	for _, tc := range []struct {
		code   byte
		reason string
	}{{0x8e, metrics.ReasonConflict}, {0x8b, metrics.ReasonServerClose}} {
		s := newTestSession(t, "5")
		err := s.packets([]byte{0xe0, 1, tc.code}, (&reader{s: s, h: &recorder{}}).handle)
		if got := probe.ReasonOf(err); got != tc.reason || !strings.Contains(err.Error(), reason5(tc.code)) {
			t.Errorf("DISCONNECT 0x%02x: %v (reason %s), want %s naming %q", tc.code, err, got, tc.reason, reason5(tc.code))
		}
	}
}

func slicesConcat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
