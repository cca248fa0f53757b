package soak

// The observer: what a run needs beyond counters, from the population's
// events (exact latency percentiles, refusal codes, error messages, the
// slow readers' own figures).

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/report"
)

// observer collects what counters cannot: exact latency percentiles, ack
// count, refusal codes and error messages, and every number that tells the
// slow readers of a drill from the normal users.
type observer struct {
	mu sync.Mutex
	// deliv and interval hold normal users' delivery latencies: by kind
	// for the run, and both kinds for the sample interval.
	login    *hdrhistogram.Histogram
	ack      *hdrhistogram.Histogram
	deliv    [len(metrics.Kinds)]*hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
	acked    int64
	rejected map[string]int64
	errors   map[string]int64

	// slow says which users read slowly, late which log in late; both
	// are set before the population runs and only read after, so they
	// need no lock.
	slow, late []bool
	// lateDeliv and onTimeDeliv split the normal users' delivery
	// latencies by whether the recipient logged in late: what was held
	// for a user while it was offline is slow by design, and a p99 that
	// fails on it must say so.
	lateDeliv, onTimeDeliv *hdrhistogram.Histogram
	// on says whose session is online as the logins and disconnects
	// tell, loginAt when it logged in, and online counts them by cohort.
	on        []bool
	loginAt   []time.Time
	online    [len(metrics.Cohorts)]int
	sendStart time.Time
	// judgeFrom is when the settle ends, Unix ns: the latencies of what
	// was sent before are left out of the judged figures. 0 until then
	// and without a settle.
	judgeFrom atomic.Int64
	// disc counts disconnects by cohort and reason, our own shutdown
	// excluded.
	disc [len(metrics.Cohorts)]map[string]int64
	// The drill's own numbers: the slow readers' disconnects by reason
	// and close code, which of them were ever disconnected, their
	// delivery latency and their time to disconnect.
	slowEnds  map[slowEnd]int64
	slowHit   []bool
	slowDeliv *hdrhistogram.Histogram
	toDisc    *hdrhistogram.Histogram

	// health, if set, says whether the prober is saturated; satDeliv
	// counts deliveries recorded while it was.
	health   engine.Health
	satDeliv atomic.Int64
	// storm is set when a storm drill drops this cohort's sessions:
	// their disconnects are the drill's.
	storm *storm
}

// slowEnd is how a slow reader's session ended: the reason and the close
// code, 0 for none.
type slowEnd struct {
	reason string
	code   int
}

// Histograms record microseconds from 1 µs to 1 hour at 3 significant
// digits: about 30 KB each, whatever the run's length.
func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(time.Hour/time.Microsecond), 3)
}

func newObserver(health engine.Health) *observer {
	return &observer{
		login: newHist(), ack: newHist(), deliv: [len(metrics.Kinds)]*hdrhistogram.Histogram{newHist(), newHist()},
		interval: newHist(), rejected: map[string]int64{}, errors: map[string]int64{},
		disc:     [len(metrics.Cohorts)]map[string]int64{{}, {}},
		slowEnds: map[slowEnd]int64{}, slowDeliv: newHist(), toDisc: newHist(),
		lateDeliv: newHist(), onTimeDeliv: newHist(),
		health: health,
	}
}

// setUsers sizes the per-user state for pop and learns its slow readers.
// It runs before pop does.
func (o *observer) setUsers(pop *engine.Population) {
	n := pop.Users()
	o.slow, o.late = make([]bool, n), make([]bool, n)
	for i := range n {
		o.slow[i], o.late[i] = pop.Slow(i), pop.Late(i)
	}
	o.on, o.loginAt, o.slowHit = make([]bool, n), make([]time.Time, n), make([]bool, n)
}

// setSendStart marks the start of the send phase: slow readers online by
// then start being slow now. The latencies of what is sent in its first
// settle are not judged.
func (o *observer) setSendStart(t time.Time, settle time.Duration) {
	o.mu.Lock()
	o.sendStart = t
	if settle > 0 {
		o.judgeFrom.Store(t.Add(settle).UnixNano())
	}
	o.mu.Unlock()
}

// judged reports whether a message sent (intended) at sent, Unix ns, is
// judged on latency: it was not sent while the run settled.
func (o *observer) judged(sent int64) bool { return sent >= o.judgeFrom.Load() }

// cohort returns user's cohort, the index of the cohort arrays.
func (o *observer) cohort(user int) metrics.Cohort {
	return metrics.CohortOf(user >= 0 && user < len(o.slow) && o.slow[user])
}

// maxErrors bounds the distinct error messages kept; the rest are counted
// under one line.
const maxErrors = 100

func (o *observer) noteError(msg string) {
	if _, ok := o.errors[msg]; !ok && len(o.errors) >= maxErrors {
		msg = "(other errors)"
	}
	o.errors[msg]++
}

func record(h *hdrhistogram.Histogram, d time.Duration) {
	_ = h.RecordValue(max(1, int64(d/time.Microsecond)))
}

func (o *observer) Login(user int, took time.Duration, err error) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.noteError("login: " + err.Error())
		return
	}
	record(o.login, took)
	if user >= 0 && user < len(o.on) {
		if !o.on[user] {
			o.on[user] = true
			o.online[o.cohort(user)]++
		}
		o.loginAt[user] = now
	}
}

func (o *observer) Disconnect(user int, reason string, err error) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.cohort(user)
	known := user >= 0 && user < len(o.on)
	if known && o.on[user] {
		o.on[user] = false
		o.online[c]--
	}
	if reason == metrics.ReasonShutdown || (o.storm != nil && o.storm.take(user)) {
		return
	}
	o.disc[c][reason]++
	if c == metrics.SlowReader {
		// The drill's result, not an error: counted by reason and code.
		var d *probe.Disconnect
		code := 0
		if errors.As(err, &d) {
			code = d.Code
		}
		o.slowEnds[slowEnd{reason: reason, code: code}]++
		o.slowHit[user] = true
		// Slow since its login or the start of sending, whichever is
		// later; a session that ended before sending began was never
		// slow.
		since := o.loginAt[user]
		if o.sendStart.After(since) {
			since = o.sendStart
		}
		if !o.sendStart.IsZero() && !o.loginAt[user].IsZero() && now.After(since) {
			record(o.toDisc, now.Sub(since))
		}
		return
	}
	msg := "disconnect: " + reason
	if err != nil {
		msg = "disconnect: " + err.Error()
	}
	o.noteError(msg)
}

func (o *observer) Ack(_ uint64, _ bool, latency time.Duration) {
	// Without a settle (judgeFrom 0) every ack is judged: no clock read.
	judged := true
	if from := o.judgeFrom.Load(); from != 0 {
		judged = time.Now().Add(-latency).UnixNano() >= from
	}
	o.mu.Lock()
	o.acked++
	if judged {
		record(o.ack, latency)
	}
	o.mu.Unlock()
}

func (o *observer) Unacked(_ uint64, reason, code string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if reason == metrics.SendRejected {
		o.rejected[code]++
		return
	}
	if reason != metrics.SendDisconnected {
		o.noteError("send: " + reason)
	}
}

func (o *observer) Received(user int, h *probe.Header, latency time.Duration, out engine.Outcome) {
	if out != engine.Delivered {
		return
	}
	if o.health != nil && o.health.Saturated() {
		o.satDeliv.Add(1)
	}
	k := metrics.KindOf(len(h.Stream) > 0 && h.Stream[0] == 'g')
	judged := o.judged(h.Intended)
	o.mu.Lock()
	if o.cohort(user) == metrics.SlowReader {
		record(o.slowDeliv, latency)
	} else {
		// The chart's interval shows the settle too.
		record(o.interval, latency)
		if !judged {
			o.mu.Unlock()
			return
		}
		record(o.deliv[k], latency)
		if user >= 0 && user < len(o.late) && o.late[user] {
			record(o.lateDeliv, latency)
		} else {
			record(o.onTimeDeliv, latency)
		}
	}
	o.mu.Unlock()
}

func pctl(h *hdrhistogram.Histogram, q float64) time.Duration {
	if h.TotalCount() == 0 {
		return 0
	}
	return time.Duration(h.ValueAtQuantile(q)) * time.Microsecond
}

// above counts the values of h above limit.
func above(h *hdrhistogram.Histogram, limit time.Duration) int64 {
	lim := int64(limit / time.Microsecond)
	var n int64
	for _, b := range h.Distribution() {
		if b.From > lim {
			n += b.Count
		}
	}
	return n
}

func percentiles(h *hdrhistogram.Histogram) report.Percentiles {
	if h.TotalCount() == 0 {
		return report.Percentiles{}
	}
	return report.Percentiles{
		Count: h.TotalCount(), P50: pctl(h, 50), P95: pctl(h, 95), P99: pctl(h, 99),
		Max:  time.Duration(h.Max()) * time.Microsecond,
		Mean: time.Duration(h.Mean() * float64(time.Microsecond)),
	}
}

func topErrors(m map[string]int64, n int) []report.ErrorCount {
	out := make([]report.ErrorCount, 0, len(m))
	for e, c := range m {
		out = append(out, report.ErrorCount{Error: e, Count: c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Error < out[j].Error
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
