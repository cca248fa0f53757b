package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/refserver"
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

// TestSoakShardsStartTogether: two one-shot soak runs given --shard 0/2
// and 1/2 and one --start_at start at that moment, not before, write their
// JSON reports into one directory of the run, and soak merge of that
// directory makes one run of both shards' users; a start time already
// past is refused.
func TestSoakShardsStartTogether(t *testing.T) {
	url := startTarget(t, refserver.Faults{})
	// RFC 3339 in whole seconds, at least a second ahead.
	at := time.Now().Add(2 * time.Second).Truncate(time.Second).UTC()
	var (
		wg        sync.WaitGroup
		codes     [2]int
		outs      [2]bytes.Buffer
		errOuts   [2]bytes.Buffer
		jsonFiles [2]string
	)
	// One directory of the run on a volume the shards share, made by the
	// first report written to it.
	runDir := filepath.Join(t.TempDir(), "run-"+at.Format("20060102T150405Z"))
	for i := range 2 {
		cfg := soakConfig(t, url)
		jsonFiles[i] = filepath.Join(runDir, fmt.Sprintf("shard-%d.json", i))
		args := []string{"soak", "--config", cfg, "--profile", "smoke", "--shard", fmt.Sprintf("%d/2", i),
			"--start_at", at.Format(time.RFC3339), "--json", jsonFiles[i]}
		wg.Go(func() { codes[i] = run(args, &outs[i], &errOuts[i]) })
	}
	wg.Wait()
	var shards []*report.Soak
	for i := range 2 {
		if codes[i] != exitOK && codes[i] != exitFail {
			t.Fatalf("shard %d: soak = %d:\n%s%s", i, codes[i], outs[i].String(), errOuts[i].String())
		}
		b, err := os.ReadFile(jsonFiles[i])
		if err != nil {
			t.Fatal(err)
		}
		r, err := report.ReadJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%d/2", i); r.Shard != want || r.Start.Before(at) {
			t.Errorf("shard %d's report: shard %q, started %v; want %q, not before %v", i, r.Shard, r.Start, want, at)
		}
		shards = append(shards, r)
	}
	if d := shards[1].Start.Sub(shards[0].Start).Abs(); d > time.Second {
		t.Errorf("the shards started %v apart, want together", d)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"soak", "merge", runDir}, &out, &errOut)
	if code == exitUsage || !strings.Contains(out.String(), "merged from 2 shards") {
		t.Errorf("soak merge = %d:\n%s%s", code, out.String(), errOut.String())
	}
	if f := shards[0].Deliveries["all"].Expected + shards[1].Deliveries["all"].Expected; f == 0 || !strings.Contains(out.String(), "40 configured, 40 logged in") {
		t.Errorf("merged report of %d expected deliveries does not count both shards' 20 users:\n%s", f, out.String())
	}

	out.Reset()
	errOut.Reset()
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if code := run([]string{"soak", "--config", soakConfig(t, url), "--profile", "smoke", "--start_at", past}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "ago") {
		t.Errorf("soak --start_at an hour ago = %d, %q; want %d saying it is past", code, errOut.String(), exitUsage)
	}
}
