package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"
)

// headerNameRE is an HTTP header name: a token (RFC 9110, section 5.6.2).
var headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// reservedHeaders are the request headers gorilla/websocket writes for the
// handshake and refuses to take from the caller, in canonical form.
var reservedHeaders = []string{
	"Host", "Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version",
	"Sec-Websocket-Extensions", "Sec-Websocket-Protocol",
}

// validHeaderValue reports whether v can be sent as a header value: no
// control character but tab.
func validHeaderValue(v string) bool {
	for i := range len(v) {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// hidden stands for a value that an error must not repeat.
type hidden struct{}

func (hidden) String() string { return "(not shown)" }

// ValidationError is a configuration value that was rejected: the key, the
// value as it was given and the reason.
type ValidationError struct {
	Key   string // dotted key, such as "population.users"
	Value any    // the rejected value, as given or as decoded
	Err   error  // the reason, such as "must be at least 1"
}

// Error formats the error as "key: value: reason", with string values quoted
// so that an empty or blank value is visible.
func (e *ValidationError) Error() string {
	if e.Value == nil {
		// Nothing was given: there is no value to show.
		return fmt.Sprintf("%s: %v", e.Key, e.Err)
	}
	v := fmt.Sprintf("%v", e.Value)
	if s, ok := e.Value.(string); ok {
		v = fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%s: %s: %v", e.Key, v, e.Err)
}

// Unwrap returns the reason.
func (e *ValidationError) Unwrap() error { return e.Err }

// Limits on values. The upper bounds are far above sensible settings: they
// exist so that a typo (an extra zero or three) is an error at startup
// rather than a daemon that exhausts its host or floods the target.
const (
	maxNameLen     = 64 // in characters: it is a label value on every series
	maxUsers       = 1_000_000
	maxRate        = 1000     // messages per second per user
	maxConnectRate = maxUsers // connects per second: everyone within a second
	minHeartbeat   = 100 * time.Millisecond
	maxMessageSize = 64 << 10 // bytes
	// Devices per user: probe.MaxDevices, which config cannot import.
	maxDevices = 16
	// A canary round is a handful of users measured precisely; more is a
	// soak profile's job.
	maxCanaryUsers    = 100
	maxCanaryMessages = 100
	// A soak profile needs a sender and a receiver.
	minProfileUsers = 2
	// The saturation monitor keeps one slot per interval of its window.
	minSaturationInterval = 10 * time.Millisecond
	maxSaturationSteps    = 600
	// A slow reader that stops for longer is a dead one.
	maxSlowRead = 10 * time.Minute
)

var (
	prefixRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	// Profile names are typed in commands and end up in reports and
	// the history, hence the same safe alphabet as the prefix.
	profileNameRE = prefixRE
)

// checkSchedule returns nil if spec is a schedule that robfig/cron v3's
// standard parser accepts, or the parser's reason.
// minScheduleInterval returns the shortest gap between the times a cron
// spec fires, over its first thousand from a fixed moment (so that the
// answer never depends on when it is asked), or 0 for a spec that does not
// parse. A schedule such as "0 9,17 * * *" has gaps of 8 and 16 hours:
// 8 is its interval for canary.retry_after.
func minScheduleInterval(spec string) (iv time.Duration) {
	if checkSchedule(spec) != nil {
		return 0
	}
	sch, _ := cron.ParseStandard(spec)
	// Enough for the gaps of a week of weekdays at any hour, and cheap.
	const fires = 1000
	prev := sch.Next(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	for i := 0; i < fires && !prev.IsZero(); i++ {
		next := sch.Next(prev)
		if next.IsZero() {
			break
		}
		if gap := next.Sub(prev); iv == 0 || gap < iv {
			iv = gap
		}
		prev = next
	}
	return iv
}

func checkSchedule(spec string) (err error) {
	// cron v3.0.1 panics on a time zone prefix without a space after it
	// ("TZ=UTC"); a configuration file must not crash the daemon.
	if (strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=")) && !strings.Contains(spec, " ") {
		return errors.New("time zone prefix must be followed by a space and the schedule")
	}
	// And in case the parser has another such bug.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot be parsed: %v", r)
		}
	}()
	_, err = cron.ParseStandard(spec)
	return err
}

// Validate checks every value of c and every rule between values, its
// protocols' sections by their own rules. It returns nil or an errors.Join
// of *ValidationError, one per problem, in key order of the Config struct.
// Load has done this for what it returns; it is for a Config built in code.
func (ld *Loader) Validate(c Config) error {
	var errs []error
	for _, p := range ld.problems(c) {
		errs = append(errs, p)
	}
	return errors.Join(errs...)
}

func (ld *Loader) problems(c Config) []*ValidationError {
	s := &problemSink{}
	httpProblems(s, c)
	ld.targetProblems(s, c.Target)
	headerProblems(s, c.Target)
	populationProblems(s, c)
	shardProblems(s, c)
	saturationProblems(s, c.Saturation)
	storeProblems(s, c)
	canaryProblems(s, c.Canary)
	soakProblems(s, c.Soak)
	acrossProblems(s, c)
	return s.out
}

// problemSink collects a configuration's problems, in the order found.
type problemSink struct{ out []*ValidationError }

func (s *problemSink) fail(key string, value any, format string, args ...any) {
	s.out = append(s.out, &ValidationError{Key: key, Value: value, Err: fmt.Errorf(format, args...)})
}

func (s *problemSink) add(ps ...*ValidationError) { s.out = append(s.out, ps...) }

// httpProblems checks http.listen.
func httpProblems(s *problemSink, c Config) {
	if c.HTTP.Listen == "" {
		s.fail("http.listen", c.HTTP.Listen, "must not be empty")
	} else if _, port, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
		// *net.AddrError repeats the address; keep only its reason.
		if ae, ok := errors.AsType[*net.AddrError](err); ok {
			err = errors.New(ae.Err)
		}
		s.fail("http.listen", c.HTTP.Listen, "must be host:port: %w", err)
	} else if port == "" {
		s.fail("http.listen", c.HTTP.Listen, "must be host:port: missing port")
	}
}

// targetProblems checks the target's name, protocol and URL, and every
// protocol's section.
func (ld *Loader) targetProblems(s *problemSink, t Target) {
	switch {
	case t.Name == "":
		s.fail("target.name", t.Name, "must not be empty")
	case !utf8.ValidString(t.Name):
		s.fail("target.name", t.Name, "must be valid UTF-8")
	case utf8.RuneCountInString(t.Name) > maxNameLen:
		s.fail("target.name", t.Name, "must be at most %d characters", maxNameLen)
	}
	if proto, ok := ld.protocol(t.Protocol); !ok {
		if near := Closest(t.Protocol, ld.Protocols()); near != "" {
			s.fail("target.protocol", t.Protocol, "did you mean %q? It must be one of %s", near, quoteList(ld.Protocols()))
		} else {
			s.fail("target.protocol", t.Protocol, "must be one of %s", quoteList(ld.Protocols()))
		}
	} else if t.URL == "" && !proto.InProcess {
		var in []string
		for _, p := range ld.protocols {
			if p.InProcess {
				in = append(in, p.Name)
			}
		}
		s.fail("target.url", t.URL, "must be set for protocol %s: only %s can run in-process", t.Protocol, strings.Join(in, " and "))
	}
	// Every protocol's section, the one in use or not: a file that
	// holds a bad value is wrong whichever protocol it picks today.
	for _, proto := range ld.protocols {
		if proto.Validate == nil || proto.Section == nil {
			continue
		}
		sec, ok := t.Sections[proto.Name]
		if !ok {
			sec = proto.Section
		}
		for _, p := range proto.Validate(sec) {
			p.Key = "target." + proto.Name + "." + p.Key
			s.add(p)
		}
		if proto.Name == t.Protocol && proto.Required != nil {
			if err := proto.Required(sec, t); err != nil {
				s.add(&ValidationError{Key: "target." + proto.Name, Err: err})
			}
		}
	}
	if t.URL != "" {
		// Most protocols are WebSocket; a long-poll one (Matrix) is
		// HTTP.
		schemes, what := []string{"ws", "wss"}, "a ws:// or wss:// URL"
		if proto, ok := ld.protocol(t.Protocol); ok && len(proto.Schemes) > 0 {
			schemes, what = proto.Schemes, "a "+strings.Join(proto.Schemes, ":// or ")+":// URL"
		}
		if u, err := url.Parse(t.URL); err != nil {
			if ue, ok := errors.AsType[*url.Error](err); ok {
				err = ue.Err
			}
			s.fail("target.url", t.URL, "must be %s: %w", what, err)
		} else if !slices.Contains(schemes, u.Scheme) {
			s.fail("target.url", t.URL, "must be %s", what)
		} else if u.Host == "" {
			s.fail("target.url", t.URL, "must have a host")
		}
	}
}

// headerProblems checks target.headers.
func headerProblems(s *problemSink, t Target) {
	seen := make(map[string]bool)
	for i, h := range t.Headers {
		at := fmt.Sprintf("target.headers[%d]", i)
		canon := http.CanonicalHeaderKey(h.Name)
		switch {
		case !headerNameRE.MatchString(h.Name):
			s.fail(at+".name", h.Name, "must be an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)")
		case slices.Contains(reservedHeaders, canon):
			s.fail(at+".name", h.Name, "is set by the WebSocket handshake itself and cannot be replaced")
		case seen[canon]:
			s.fail(at+".name", h.Name, "is given twice: put both values in one entry, comma-separated")
		}
		seen[canon] = true
		// A value is never shown: it may be a credential put inline by
		// mistake.
		shown := any("")
		if h.Value != "" {
			shown = hidden{}
		}
		switch {
		case (h.Value == "") == (h.ValueFile == ""):
			s.fail(at+".value", shown, "exactly one of %s.value and %s.value_file must be set", at, at)
		case !validHeaderValue(h.Value):
			s.fail(at+".value", shown, "must not hold a line break or a control character")
		}
	}
}

// populationProblems checks the population (and target.catch_up, which
// its checks have always come among).
func populationProblems(s *problemSink, c Config) {
	p := c.Population
	if p.Users < 1 {
		s.fail("population.users", p.Users, "must be at least 1")
	} else if p.Users > maxUsers {
		s.fail("population.users", p.Users, "must be at most %d", maxUsers)
	}
	if p.Ramp < 0 {
		s.fail("population.ramp", p.Ramp, "must not be negative")
	}
	if p.GroupSize < 2 {
		s.fail("population.group_size", p.GroupSize, "must be at least 2")
	}
	for _, e := range layoutProblems("population.", p.Groups, p.Devices, p.Behaviours) {
		s.fail(e.Key, e.Value, "%w", e.Err)
	}
	switch c.Target.CatchUp {
	case CatchUpOn, CatchUpOff:
	default:
		s.fail("target.catch_up", c.Target.CatchUp, "must be on or off")
	}
	switch {
	case math.IsNaN(p.Rate):
		s.fail("population.rate", p.Rate, "must be a number")
	case p.Rate < 0:
		s.fail("population.rate", p.Rate, "must not be negative")
	case p.Rate > maxRate:
		s.fail("population.rate", p.Rate, "must be at most %d", maxRate)
	}
	if p.Heartbeat < minHeartbeat {
		s.fail("population.heartbeat", p.Heartbeat, "must be at least %v", minHeartbeat)
	}
	if p.Deadline <= 0 {
		s.fail("population.deadline", p.Deadline, "must be positive")
	}
	// Twice the deadline, because a message the server never acked is
	// known to be void only a deadline after it was sent, and receivers
	// must hear that before they write its gap off as lost.
	if p.Deadline > 0 && p.LostAfter < 2*p.Deadline {
		s.fail("population.lost_after", p.LostAfter, "must be at least twice population.deadline (%v)", 2*p.Deadline)
	}
	if !prefixRE.MatchString(p.Prefix) {
		s.fail("population.prefix", p.Prefix, "must match %s", prefixRE)
	}
	if p.MessageSize < 0 {
		s.fail("population.message_size", p.MessageSize, "must not be negative")
	} else if p.MessageSize > maxMessageSize {
		s.fail("population.message_size", p.MessageSize, "must be at most %d", maxMessageSize)
	}
	b := p.Backoff
	if b.Initial <= 0 {
		s.fail("population.backoff.initial", b.Initial, "must be positive")
	}
	if b.Max < b.Initial {
		s.fail("population.backoff.max", b.Max, "must be at least population.backoff.initial (%v)", b.Initial)
	}
	switch {
	case math.IsNaN(p.MaxConnectRate):
		s.fail("population.max_connect_rate", p.MaxConnectRate, "must be a number")
	case p.MaxConnectRate <= 0:
		// No "unlimited": a population that can reconnect everyone at
		// once is exactly what this key exists to prevent.
		s.fail("population.max_connect_rate", p.MaxConnectRate, "must be positive")
	case p.MaxConnectRate > maxConnectRate:
		s.fail("population.max_connect_rate", p.MaxConnectRate, "must be at most %d", maxConnectRate)
	}
	if _, err := ParseSourceAddrs(p.SourceAddrs); err != nil {
		s.fail("population.source_addrs", p.SourceAddrs, "%w", err)
	}
	switch {
	case p.LagThreshold < 0:
		s.fail("population.lag_threshold", p.LagThreshold, "must not be negative")
	case p.SessionLifetime < 0 || (p.SessionLifetime > 0 && p.SessionLifetime < time.Second):
		s.fail("population.session_lifetime", p.SessionLifetime, "must be 0 (no churn) or at least 1s")
	case p.Deadline > 0 && p.LagThreshold >= p.Deadline:
		// A stall must be flagged before its messages are late.
		s.fail("population.lag_threshold", p.LagThreshold, "must be less than population.deadline (%v)", p.Deadline)
	}
	checkSlowReaders("population.slow_readers", p.SlowReaders, s.fail)
}

// acrossProblems checks what a population laid out across shards cannot
// do yet: follow group membership churn, whose changes of members in other
// shards a sender cannot see when it counts who is owed a message.
func acrossProblems(s *problemSink, c Config) {
	if !c.Population.AcrossShards {
		return
	}
	churns := func(bs []Behaviour) bool {
		return slices.ContainsFunc(bs, func(b Behaviour) bool { return b.MembershipChurn > 0 })
	}
	if churns(c.Population.Behaviours) {
		s.fail("population.across_shards", true, "cannot be set with a behaviour class that has membership_churn (population.behaviours): a sender cannot see the membership changes of users in other shards")
	}
	for i, p := range c.Soak.Profiles {
		if churns(p.Behaviours) {
			s.fail("population.across_shards", true, "cannot be set with a behaviour class that has membership_churn (soak.profiles[%d].behaviours): a sender cannot see the membership changes of users in other shards", i)
		}
	}
}

// shardProblems checks shard's form.
func shardProblems(s *problemSink, c Config) {
	// The host name matters only to "auto/N", which is resolved at start;
	// here only its form is checked.
	if _, err := ParseShard(strings.Replace(c.Shard, "auto/", "0/", 1), ""); err != nil {
		s.fail("shard", c.Shard, "%w", err)
	}
}

// saturationProblems checks the saturation detector's limits.
func saturationProblems(s *problemSink, sa Saturation) {
	if sa.Interval < minSaturationInterval {
		s.fail("saturation.interval", sa.Interval, "must be at least %v", minSaturationInterval)
	}
	if sa.Interval > 0 && (sa.Window < sa.Interval || sa.Window%sa.Interval != 0 || sa.Window/sa.Interval > maxSaturationSteps) {
		s.fail("saturation.window", sa.Window, "must be 1 to %d times saturation.interval (%v)", maxSaturationSteps, sa.Interval)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"saturation.max_send_lag", sa.MaxSendLag},
		{"saturation.max_receive_lag", sa.MaxReceiveLag},
		{"saturation.max_sched_latency", sa.MaxSchedLatency},
		{"saturation.max_gc_pause", sa.MaxGCPause},
	} {
		if d.v <= 0 {
			s.fail(d.key, d.v, "must be positive")
		}
	}
	for _, r := range []struct {
		key string
		v   float64
	}{
		{"saturation.max_cpu", sa.MaxCPU},
		{"saturation.max_fds", sa.MaxFDs},
		{"saturation.max_ports", sa.MaxPorts},
	} {
		if !(r.v > 0 && r.v <= 1) {
			s.fail(r.key, r.v, "must be above 0 and at most 1")
		}
	}
}

// storeProblems checks the SLO objective, data_dir and the run history's
// bounds.
func storeProblems(s *problemSink, c Config) {
	if !(c.SLO.Objective > 0 && c.SLO.Objective < 1) {
		s.fail("slo.objective", c.SLO.Objective, "must be above 0 and below 1, such as 0.999")
	}

	if c.DataDir == "" {
		s.fail("data_dir", c.DataDir, "must not be empty")
	}

	h := c.History
	if h.MaxRuns < 1 {
		s.fail("history.max_runs", h.MaxRuns, "must be at least 1")
	}
	if h.MaxAge <= 0 {
		s.fail("history.max_age", h.MaxAge, "must be positive")
	}
	if h.MaxCanaryRounds < 1 {
		s.fail("history.max_canary_rounds", h.MaxCanaryRounds, "must be at least 1")
	}
}

// canaryProblems checks the canary.
func canaryProblems(s *problemSink, cn Canary) {
	if cn.Schedule != "" {
		if err := checkSchedule(cn.Schedule); err != nil {
			s.fail("canary.schedule", cn.Schedule, "must be a cron schedule or empty: %w", err)
		}
	}
	if cn.Deadline <= 0 {
		s.fail("canary.deadline", cn.Deadline, "must be positive")
	}
	if cn.Users < 2 {
		s.fail("canary.users", cn.Users, "must be at least 2")
	} else if cn.Users > maxCanaryUsers {
		s.fail("canary.users", cn.Users, "must be at most %d", maxCanaryUsers)
	}
	if cn.Messages < 1 {
		s.fail("canary.messages", cn.Messages, "must be at least 1")
	} else if cn.Messages > maxCanaryMessages {
		s.fail("canary.messages", cn.Messages, "must be at most %d", maxCanaryMessages)
	}
	if cn.Jitter < 0 {
		s.fail("canary.jitter", cn.Jitter, "must not be negative")
	}
	if cn.RetryAfter < 0 {
		s.fail("canary.retry_after", cn.RetryAfter, "must be positive, or 0 for no retry")
	} else if cn.RetryAfter > 0 && cn.Schedule != "" {
		if iv := minScheduleInterval(cn.Schedule); iv > 0 && cn.RetryAfter >= iv {
			s.fail("canary.retry_after", cn.RetryAfter, "must be shorter than canary.schedule's interval (%v for %q): a retry any later is the scheduled round", iv, cn.Schedule)
		}
	}
	if cn.MaxClockUncertainty <= 0 {
		s.fail("canary.max_clock_uncertainty", cn.MaxClockUncertainty, "must be positive")
	}
}

// soakProblems checks the soak profiles, and that their names are unique.
func soakProblems(s *problemSink, sk Soak) {
	first := make(map[string]int) // profile name → index of its first use
	for i, p := range sk.Profiles {
		at := fmt.Sprintf("soak.profiles[%d]", i)
		// A name that is also invalid gets only that error, from problems.
		if j, dup := first[p.Name]; dup && profileNameRE.MatchString(p.Name) {
			s.fail(at+".name", p.Name, "must be unique: soak.profiles[%d] has the same name", j)
		} else if !dup {
			first[p.Name] = i
		}
		s.add(p.problems(at)...)
	}
}

// problems checks one soak profile whose keys start with at
// ("soak.profiles[2]"), so that each error points into the list.
func (p Profile) problems(at string) []*ValidationError {
	var out []*ValidationError
	fail := func(key string, value any, format string, args ...any) {
		out = append(out, &ValidationError{Key: at + "." + key, Value: value, Err: fmt.Errorf(format, args...)})
	}
	// ratio checks a fraction; written so that NaN fails too.
	ratio := func(key string, v float64) {
		if !(v >= 0 && v <= 1) {
			fail(key, v, "must be between 0 and 1")
		}
	}

	if !profileNameRE.MatchString(p.Name) {
		fail("name", p.Name, "must match %s", profileNameRE)
	}
	if p.Schedule != "" {
		if err := checkSchedule(p.Schedule); err != nil {
			fail("schedule", p.Schedule, "must be a cron schedule or empty: %w", err)
		}
	}
	if p.Users < minProfileUsers {
		fail("users", p.Users, "must be at least %d", minProfileUsers)
	} else if p.Users > maxUsers {
		fail("users", p.Users, "must be at most %d", maxUsers)
	}
	if p.GroupSize < 2 {
		fail("group_size", p.GroupSize, "must be at least 2")
	}
	for _, e := range layoutProblems("", p.Groups, p.Devices, p.Behaviours) {
		fail(e.Key, e.Value, "%w", e.Err)
	}
	switch {
	case math.IsNaN(p.Rate):
		fail("rate", p.Rate, "must be a number")
	case p.Rate <= 0:
		// Unlike population.rate: a soak run that sends nothing has
		// nothing to measure.
		fail("rate", p.Rate, "must be positive")
	case p.Rate > maxRate:
		fail("rate", p.Rate, "must be at most %d", maxRate)
	}
	if p.Ramp < 0 {
		fail("ramp", p.Ramp, "must not be negative")
	}
	if p.Duration <= 0 {
		fail("duration", p.Duration, "must be positive")
	}
	if p.Settle < 0 || (p.Duration > 0 && p.Settle >= p.Duration) {
		fail("settle", p.Settle, "must be at least 0 and below %s.duration (%v): a run judges what is sent after it", at, p.Duration)
	}
	if p.Drain < 0 {
		fail("drain", p.Drain, "must not be negative")
	}
	if p.Deadline <= 0 {
		fail("deadline", p.Deadline, "must be positive")
	}
	// The same rule as population.lost_after, for the same reason.
	if p.Deadline > 0 && p.LostAfter < 2*p.Deadline {
		fail("lost_after", p.LostAfter, "must be at least twice %s.deadline (%v)", at, 2*p.Deadline)
	}
	// Below 1: with every user late there is nobody online to send.
	if !(p.LateLogins >= 0 && p.LateLogins < 1) {
		fail("late_logins", p.LateLogins, "must be at least 0 and less than 1")
	}
	switch {
	case p.LateAfter < 0:
		fail("late_after", p.LateAfter, "must not be negative")
	case p.LateLogins > 0 && p.LateAfter == 0:
		fail("late_after", p.LateAfter, "must be positive when %s.late_logins (%v) is above 0", at, p.LateLogins)
	case p.LateLogins > 0 && p.Duration > 0 && p.LateAfter >= p.Duration:
		// Late users must come online while messages are still sent,
		// or the run measures nothing about them.
		fail("late_after", p.LateAfter, "must be less than %s.duration (%v) when %s.late_logins is above 0", at, p.Duration, at)
	}

	checkSlowReaders("slow_readers", p.SlowReaders, fail)
	checkStorm(at, p, fail)
	checkSearch(at, p, fail)

	t := p.Thresholds
	ratio("thresholds.max_loss", t.MaxLoss)
	ratio("thresholds.min_realtime_completeness", t.MinRealtimeCompleteness)
	ratio("thresholds.max_late", t.MaxLate)
	ratio("thresholds.max_refused", t.MaxRefused)
	if t.P99Ack <= 0 {
		fail("thresholds.p99_ack", t.P99Ack, "must be positive")
	}
	if t.P99Delivery <= 0 {
		fail("thresholds.p99_delivery", t.P99Delivery, "must be positive")
	}
	ratio("thresholds.min_online_ratio", t.MinOnlineRatio)
	if t.MaxDisconnects < 0 {
		fail("thresholds.max_disconnects", t.MaxDisconnects, "must not be negative")
	}
	return out
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// checkSlowReaders validates a slow-reader drill under key.
func checkSlowReaders(key string, sr SlowReaders, fail func(key string, value any, format string, args ...any)) {
	if !(sr.Fraction >= 0 && sr.Fraction < 1) {
		// Below 1: a drill needs normal users to compare with.
		fail(key+".fraction", sr.Fraction, "must be at least 0 and less than 1")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read_delay", sr.ReadDelay}, {"pause", sr.Pause}, {"pause_every", sr.PauseEvery}} {
		switch {
		case d.v < 0:
			fail(key+"."+d.name, d.v, "must not be negative")
		case d.v > maxSlowRead:
			fail(key+"."+d.name, d.v, "must be at most %v", maxSlowRead)
		}
	}
	if sr.Fraction > 0 && sr.ReadDelay == 0 && sr.Pause == 0 {
		fail(key+".read_delay", sr.ReadDelay, "must be positive, or %s.pause must be, when %s.fraction (%v) is above 0", key, key, sr.Fraction)
	}
}

// checkSearch validates profile p's search for the server's limit; at
// names the profile.
func checkSearch(at string, p Profile, fail func(key string, value any, format string, args ...any)) {
	sr := p.Search
	switch sr.Vary {
	case "":
		return
	case SearchRate, SearchUsers, SearchGroupSize:
	default:
		fail("search.vary", sr.Vary, "must be %q (no search), %q, %q or %q", "", SearchRate, SearchUsers, SearchGroupSize)
		return
	}
	if start := p.SearchStart(); !(sr.Max > start) {
		fail("search.max", sr.Max, "must be above %s.%s (%v), where the search starts", at, sr.Vary, start)
	}
	switch {
	case sr.Vary == SearchUsers && sr.Max > maxUsers:
		fail("search.max", sr.Max, "must be at most %d users", maxUsers)
	case sr.Vary == SearchGroupSize && sr.Max > float64(p.Users):
		fail("search.max", sr.Max, "must be at most %s.users (%d): a group holds at most every user", at, p.Users)
	case sr.Vary == SearchRate && sr.Max > maxRate:
		fail("search.max", sr.Max, "must be at most %d messages per second per user", maxRate)
	}
	if !(sr.Factor > 1 && sr.Factor <= 10) {
		fail("search.factor", sr.Factor, "must be above 1 and at most 10")
	}
	if !(sr.Precision > 0 && sr.Precision < 1) {
		fail("search.precision", sr.Precision, "must be above 0 and below 1")
	}
	if p.Storm.Fraction > 0 || p.SlowReaders.Fraction > 0 {
		fail("search.vary", sr.Vary, "a search judges the server's limit: it takes no storm or slow-reader drill")
	}
}

// checkStorm validates profile p's reconnect-storm drill; at names the
// profile.
func checkStorm(at string, p Profile, fail func(key string, value any, format string, args ...any)) {
	st, t := p.Storm, p.Thresholds
	if !(st.Fraction >= 0 && st.Fraction <= 1) {
		fail("storm.fraction", st.Fraction, "must be at least 0 and at most 1")
	}
	switch {
	case st.After < 0:
		fail("storm.after", st.After, "must not be negative")
	case st.Fraction > 0 && p.Duration > 0 && st.After >= p.Duration:
		// The sessions must come back while messages are sent, or the
		// drill measures nothing of what the storm cost them.
		fail("storm.after", st.After, "must be less than %s.duration (%v) when %s.storm.fraction is above 0", at, p.Duration, at)
	}
	for _, r := range []struct {
		key string
		v   time.Duration
	}{{"thresholds.recovery_99", t.Recovery99}, {"thresholds.recovery_100", t.Recovery100}} {
		switch {
		case r.v < 0:
			fail(r.key, r.v, "must not be negative")
		case st.Fraction > 0 && r.v == 0:
			fail(r.key, r.v, "must be positive when %s.storm.fraction (%v) is above 0: it is the drill's verdict", at, st.Fraction)
		}
	}
	if t.Recovery99 > 0 && t.Recovery100 > 0 && t.Recovery99 > t.Recovery100 {
		fail("thresholds.recovery_99", t.Recovery99, "must be at most %s.thresholds.recovery_100 (%v)", at, t.Recovery100)
	}
}
