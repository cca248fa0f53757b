package report

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestNewRunID(t *testing.T) {
	epoch := time.Date(2026, 11, 30, 3, 15, 0, 0, time.UTC)
	re := regexp.MustCompile(`^\d{8}T\d{6}Z-[0-9a-f]{6}$`)
	local := time.FixedZone("UTC+5", 5*3600)
	tests := []struct {
		t          time.Time
		wantPrefix string
	}{
		{epoch, "20261130T031500Z-"},
		{time.Date(2026, 11, 30, 8, 15, 0, 0, local), "20261130T031500Z-"},
		{time.Date(2027, 1, 2, 3, 4, 5, 999, time.UTC), "20270102T030405Z-"},
	}
	for _, tt := range tests {
		id := NewRunID(tt.t)
		if !re.MatchString(id) || !strings.HasPrefix(id, tt.wantPrefix) {
			t.Errorf("NewRunID(%v) = %q, want %s + 6 hex digits", tt.t, id, tt.wantPrefix)
		}
	}
	if a, b := NewRunID(epoch), NewRunID(epoch.Add(time.Second)); a >= b {
		t.Errorf("NewRunID: %q sorts after the later %q", a, b)
	}
	if a, b := NewRunID(epoch), NewRunID(epoch); a == b {
		t.Errorf("NewRunID twice = %q, want distinct ids", a)
	}
}
