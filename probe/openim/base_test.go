package openim

import "testing"

// A conversation's base starts below the newest seq a device first sees
// by as many messages as the process sent into it before: those were sent
// to users not yet logged in, and are owed to them (the conformance faults
// test lost the first message of a chat this way, 2 runs in 12).
func TestBaseCountsEarlySends(t *testing.T) {
	tests := []struct {
		name  string
		sends int    // messages the process sent before any device placed the chat
		at    uint64 // where the first device places it
		want  uint64
	}{
		{"nothing sent before", 0, 7, 7},
		{"sent before the recipient's first login", 3, 7, 4},
		{"more sent than the seq allows", 9, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Driver{bases: map[string]uint64{}, early: map[string]uint64{}}
			for range tt.sends {
				d.sent("si_a_b")
			}
			if got := d.base("si_a_b", tt.at); got != tt.want {
				t.Errorf("base after %d sends, placed at %d = %d, want %d", tt.sends, tt.at, got, tt.want)
			}
			// Once placed, later sends do not move it, and a device
			// placing it lower lowers it.
			d.sent("si_a_b")
			if got := d.base("si_a_b", tt.want+5); got != tt.want {
				t.Errorf("base placed again higher = %d, want it kept at %d", got, tt.want)
			}
			if len(d.early) != 0 {
				t.Errorf("early sends still counted after the base was set: %v", d.early)
			}
		})
	}
}
