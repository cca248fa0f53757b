package report

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestWriteConnectPath holds each format to the connect path's facts, in
// the run's part and the storm's, and keeps it out of a report without
// one, as reports from before it are.
func TestWriteConnectPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(io.Writer, *Soak) error
		want  []string
	}{
		{"text", WriteText, []string{"connect path   count    p50    p99   mean", "tls           15,003  1.4ms   20ms    3ms",
			"total         14,997    2ms   40ms      -", "estimated from histogram buckets",
			"login by phase     tcp p50 600µs, p99 1.9ms (5,009); tls p50 1.5ms, p99 40ms (5,003)", "until the end of the run, from histogram buckets"}},
		{"html", WriteHTML, []string{`<h2 id="h-connect">Connect path</h2>`, "<th>connect path</th><th>count</th><th>p50</th><th>p99</th><th>mean</th>",
			`<td class="name">tls</td><td>15,003</td><td>1.4ms</td><td>20ms</td><td>3ms</td>`, "estimated from histogram buckets",
			"<td>login by phase</td><td>tcp p50 600µs, p99 1.9ms (5,009);"}},
		{"json", WriteJSON, []string{`"connect_path": {`, `"phase": "tls"`, `"count": 15003`, `"connect_until_end": true`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, renderStormReport()); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("%s report lacks %q", tc.name, w)
				}
			}
			b.Reset()
			if err := tc.write(&b, renderTestReport()); err != nil {
				t.Fatal(err)
			}
			for _, absent := range []string{"connect path", "connect_path", "h-connect", "by phase"} {
				if strings.Contains(strings.ToLower(b.String()), absent) {
					t.Errorf("%s report without a connect path mentions %q", tc.name, absent)
				}
			}
		})
	}
}

// TestConnectPathJSON: the connect path survives the JSON the history
// keeps.
func TestConnectPathJSON(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, renderStormReport()); err != nil {
		t.Fatal(err)
	}
	r, err := ReadJSON(&b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(renderStormReport().ConnectPath)
	got, _ := json.Marshal(r.ConnectPath)
	if !bytes.Equal(got, want) {
		t.Errorf("ConnectPath after a round trip = %s, want %s", got, want)
	}
	if r.Storm == nil || r.Storm.ConnectPath == nil || !r.Storm.ConnectUntilEnd {
		t.Errorf("Storm after a round trip = %+v, want its connect path until the end", r.Storm)
	}
}
