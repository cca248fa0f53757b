package mattermost

import (
	"encoding/json"
	"testing"
)

// FuzzRead reads arbitrary bytes as a frame from the server, after a
// hello. Whatever they are, reading never panics; a frame is delivered
// only if it is a posted event whose post, itself JSON, is a message of a
// channel and user imcanary made; a frame that is not JSON, or an event
// without seq, is refused. Seeds are frames captured from Mattermost
// v6.7.2 (testdata/fuzz/FuzzRead).
func FuzzRead(f *testing.F) {
	f.Add([]byte(posted(1, "gch", "uidb", "imc1 run imc-b g.g1 1 100 0-0", 10)))
	f.Add([]byte(`{"event":"posted","seq":1,"data":{"post":"{\"channel_id\":\"dch\",\"user_id\":\"uidb\",\"message\":\"m\"}"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newTestSession(t, "http://127.0.0.1:9")
		s.catchUp = false
		r := &recorder{}
		if err := s.read([]byte(hello), 1, r); err != nil {
			t.Fatal(err)
		}
		err := s.read(data, 2, r)
		var fr wsFrame
		if json.Unmarshal(data, &fr) != nil && err == nil {
			t.Fatal("a frame that is not JSON was taken")
		}
		if fr.Event != "" && fr.Seq == nil && err == nil {
			t.Fatal("an event without seq was taken")
		}
		want := 0
		var p post
		if err == nil && fr.Event == "posted" && json.Unmarshal([]byte(fr.Data.Post), &p) == nil {
			if _, _, ok := s.d.lookup(p.ChannelID, p.UserID); ok && p.Type == "" && p.Message != "" {
				want = 1
			}
		}
		if len(r.deliveries) != want {
			t.Fatalf("%d deliveries, want %d", len(r.deliveries), want)
		}
		if want == 1 && string(r.deliveries[0].Body) != p.Message {
			t.Fatalf("delivered %q, the post says %q", r.deliveries[0].Body, p.Message)
		}
	})
}
