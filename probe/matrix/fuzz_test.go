package matrix

import (
	"testing"

	"github.com/imcanary/imcanary/probe/internal/longpoll"
)

// FuzzAnswer reads arbitrary bytes as a /sync answer and as a /messages
// page. Whatever they are, reading never panics; an answer is taken (its
// next_batch becomes the next poll's position) only if it decodes and has
// one; every delivery is a text message in a room imcanary made, and
// nothing else is delivered. Seeds are answers captured from Dendrite
// v0.13.8 (testdata/fuzz/FuzzAnswer).
func FuzzAnswer(f *testing.F) {
	f.Add([]byte(`{"next_batch":"s1","rooms":{"join":{"!g:localhost":{"timeline":{"events":[{"type":"m.room.message","content":{"msgtype":"m.text","body":"imc1 r u g.g1 1 1 0-0"}}],"limited":true,"prev_batch":"p"}}}}}`))
	f.Add([]byte(`{"chunk":[{"type":"m.room.message","content":{"body":"x"}}],"end":"t1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newTestSession(t)
		r := &recorder{}
		s.answers.Serve(r)
		var ans syncAnswer
		valid := decodeSync(data, &ans) == nil
		err := s.Answer(&longpoll.Response{Status: 200, Body: data, At: 1})
		if (err == nil) != valid {
			t.Fatalf("Answer error %v for an answer that decodes: %v", err, valid)
		}
		if err == nil && s.since != ans.NextBatch {
			t.Fatalf("since %q after an answer of next_batch %q", s.since, ans.NextBatch)
		}
		if err != nil && s.since != "s0" {
			t.Fatalf("since moved to %q by a refused answer", s.since)
		}
		want := 0
		if valid {
			for id, jr := range ans.Rooms.Join {
				if _, ok := s.d.rooms[id]; !ok {
					continue
				}
				for _, ev := range jr.Timeline.Events {
					if ev.Type == "m.room.message" && ev.Content.Body != "" {
						want++
					}
				}
			}
		}
		if len(r.deliveries) != want {
			t.Fatalf("%d deliveries, want %d", len(r.deliveries), want)
		}
		var page messagesAnswer
		if decodeMessages(data, &page) == nil {
			for i := range page.Chunk {
				s.deliver(r, room{}, &page.Chunk[i], true, 1)
			}
		}
	})
}
