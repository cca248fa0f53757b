package engine

import (
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
)

// Exemplars: a slow observation of the delivery latency or the group
// fan-out time carries the sender, stream and seq of its message, so that
// a point on a latency panel leads to one message, and from it to the
// server's logs.

// sloLatency is the latency SLI's threshold: the histograms have a bucket
// boundary there (metrics.LatencyBuckets).
const sloLatency = time.Second

// slowAfter is the latency above which an observation carries an exemplar:
// past the latency SLI's threshold or the deadline (late), whichever is
// less. Those are the observations an SLI counts as errors, so every
// exemplar shown is a message an alert counted; the fast ones, nearly all
// of them, pay nothing for it (an exemplar allocates its labels).
func slowAfter(deadline time.Duration) time.Duration {
	if deadline <= 0 {
		return sloLatency
	}
	return min(deadline, sloLatency)
}

// exemplarEvery is how often at most one bucket of one histogram takes a
// new exemplar. The histogram keeps only the last exemplar of each bucket
// and Prometheus reads it once a scrape (15 s or more), so nothing is lost
// to the gate; without it, a server slow for everyone would make every
// delivery pay for an exemplar (about 3 µs and 15 allocations against
// about 0.4 µs and none for the rest of the delivery path:
// BenchmarkInboxReceiveSlow without the gate, on a loaded 2-core machine).
const exemplarEvery = time.Second

// exemplarGate lets through one exemplar per bucket of a histogram with
// metrics.LatencyBuckets per exemplarEvery. Safe for concurrent use: read
// loops share it.
type exemplarGate struct {
	next [16]atomic.Int64 // per bucket, +Inf last: when the next may come (Unix ns)
}

// allow reports whether an observation of v seconds at now (Unix ns) may
// carry an exemplar.
func (g *exemplarGate) allow(v float64, now int64) bool {
	if g == nil {
		return true
	}
	// Buckets past the array's (were more added) share its last gate.
	i := min(sort.SearchFloat64s(metrics.LatencyBuckets, v), len(g.next)-1)
	n := g.next[i].Load()
	return now >= n && g.next[i].CompareAndSwap(n, now+int64(exemplarEvery))
}

// exemplarRunes is OpenMetrics' limit on an exemplar's label names and
// values together, past which the client library panics.
const exemplarRunes = prometheus.ExemplarMaxRunes

// exemplar returns the labels naming seq of the stream with inbox key key
// ("RUN SENDER STREAM"): its sender, stream and seq. The run is left out:
// it names the process, which the scrape already does. Names are the
// population's own (its prefix and indices, never a secret); a stream of
// another process's is what a server sent, so its bytes are made valid
// UTF-8, and long names are cut from the left, keeping their distinctive
// end, to stay within the limit.
func exemplar(key string, seq uint64) prometheus.Labels {
	_, rest, _ := strings.Cut(key, " ")
	sender, stream, _ := strings.Cut(rest, " ")
	sender, stream = strings.ToValidUTF8(sender, "?"), strings.ToValidUTF8(stream, "?")
	s := strconv.FormatUint(seq, 10)
	budget := exemplarRunes - len("sender") - len("stream") - len("seq") - len(s)
	ns, nt := utf8.RuneCountInString(sender), utf8.RuneCountInString(stream)
	if ns+nt > budget {
		// The sender keeps at least half, or what the stream leaves.
		keep := min(ns, max(budget/2, budget-nt))
		sender, stream = cutLeft(sender, keep), cutLeft(stream, budget-keep)
	}
	return prometheus.Labels{"sender": sender, "stream": stream, "seq": s}
}

// cutLeft returns the last n runes of s, the first of them replaced by
// "…" if any were cut.
func cutLeft(s string, n int) string {
	c := utf8.RuneCountInString(s)
	if c <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	r := []rune(s)
	return "…" + string(r[c-n+1:])
}
