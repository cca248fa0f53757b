package config

import (
	"strings"
	"testing"
)

func TestParseShard(t *testing.T) {
	tests := []struct {
		spec, host string
		want       Shard
		err        string
	}{
		{"", "x", Shard{0, 1}, ""},
		{"0/1", "", Shard{0, 1}, ""},
		{"2/3", "", Shard{2, 3}, ""},
		{"auto/4", "imcanary-3", Shard{3, 4}, ""},
		{"auto/4", "imcanary-canary-0", Shard{0, 4}, ""},
		{"auto/4", "imcanary-4", Shard{}, "shard index \"4\": must be 0 to 3"},
		{"auto/2", "laptop", Shard{}, "does not end in -ORDINAL"},
		{"auto/2", "pod-", Shard{}, "does not end in -ORDINAL"},
		{"3/3", "", Shard{}, "must be 0 to 2"},
		{"-1/3", "", Shard{}, "must be 0 to 2"},
		{"1/0", "", Shard{}, "must be 1 to 1000"},
		{"1/x", "", Shard{}, "must be 1 to 1000"},
		{"1", "", Shard{}, "want I/N or auto/N"},
	}
	for _, tt := range tests {
		got, err := ParseShard(tt.spec, tt.host)
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("ParseShard(%q, %q) = %+v, %v, want %+v", tt.spec, tt.host, got, err, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParseShard(%q, %q) error = %v, want one containing %q", tt.spec, tt.host, err, tt.err)
		}
	}
	s := Shard{Index: 0, Count: 3}
	if s.Next() != 1 || s.Prev() != 2 || !s.Sharded() || s.Label() != "0" {
		t.Errorf("Shard{0,3}: next %d prev %d sharded %v label %q, want 1, 2, true, \"0\"", s.Next(), s.Prev(), s.Sharded(), s.Label())
	}
}
