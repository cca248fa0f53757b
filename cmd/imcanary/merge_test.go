package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
)

// shardFile writes the JSON report of one shard of a run and returns its
// path.
func shardFile(t *testing.T, dir, shard string, lost int64) string {
	t.Helper()
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	r := &report.Soak{
		ID: report.NewRunID(start), Kind: "soak", Target: "staging", Shard: shard, Result: "pass",
		Start: start, End: start.Add(time.Minute),
		Profile: report.Profile{Name: "release", Users: 10, Rate: 1, Duration: time.Minute,
			Thresholds: report.Thresholds{MaxLoss: 0.01, MaxLate: 0.01, P99Ack: time.Second, P99Delivery: time.Second}},
		Users:      report.Users{Configured: 10, LoggedIn: 10, MinOnlineRatio: 1},
		Messages:   report.Messages{Sent: 600, Acked: 600},
		Deliveries: map[string]report.Deliveries{"direct": {Expected: 1000, Delivered: 1000 - lost, Lost: lost}},
	}
	path := filepath.Join(dir, strings.ReplaceAll(shard, "/", "-")+".json")
	var b bytes.Buffer
	if err := report.WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSoakMerge: imcanary soak merge prints one report of the shards and
// exits on the verdict judged on their sums (0.5% and 1.6% lost make
// 1.05%, over a 1% limit that the first shard alone met); reports that
// are not every shard of one run exit 2 naming what is missing.
func TestSoakMerge(t *testing.T) {
	dir := t.TempDir()
	a, b := shardFile(t, dir, "0/2", 5), shardFile(t, dir, "1/2", 16)
	out, page := filepath.Join(dir, "merged.json"), filepath.Join(dir, "merged.html")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"soak", "merge", "--json", out, "--html", page, a, b}, &stdout, &stderr); code != exitFail {
		t.Errorf("soak merge = %d, want %d (fail):\n%s%s", code, exitFail, stdout.String(), stderr.String())
	}
	for _, want := range []string{"FAIL  soak release", "merged from 2 shards: 0/2", "max_loss", "1.05%"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("merged report lacks %q:\n%s", want, stdout.String())
		}
	}
	if html, err := os.ReadFile(page); err != nil || !strings.Contains(string(html), "merged from 2 shards") {
		t.Errorf("merged HTML report (err %v) does not name its shards", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Deliveries["all"]; d.Expected != 2000 || d.Lost != 21 || len(m.Shards) != 2 {
		t.Errorf("merged JSON: deliveries %+v, %d shards; want 2000 expected, 21 lost, 2 shards", d, len(m.Shards))
	}

	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"soak", "merge", a}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "shard 1/2 missing") {
		t.Errorf("soak merge of one shard of two = %d, %q; want %d naming the missing shard", code, stderr.String(), exitUsage)
	}
}
