package config

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Behaviour is one class of users in a behaviour mix: a share of the
// population that sends at its own rate (0 for silent users), with its own
// message sizes, and that leaves and rejoins its groups at its own pace.
// The published advice for load-testing an IM server is exactly such a
// mix: active users, silent ones, users who keep joining and leaving
// groups, users who send large messages.
//
// Every key of a class is its own: one left out is 0 (silent, bodies at
// their natural size, no membership churn), not population's.
type Behaviour struct {
	// Name identifies the class in logs and reports: 1 to 32 characters
	// of a-z, 0-9, "_" and "-", unique in the mix.
	Name string `koanf:"name"`
	// Share is the fraction of the users in the class; the shares of a mix
	// add up to 1.
	Share float64 `koanf:"share"`
	// Rate is messages per second per user, alternating direct and group,
	// 0 to 1000; 0 is a silent user, who only receives.
	Rate float64 `koanf:"rate"`
	// MessageSize is the size of the class's bodies in bytes: "N", or
	// "MIN-MAX" for sizes drawn uniformly between the two; "" or "0" is
	// the natural size.
	MessageSize string `koanf:"message_size"`
	// MembershipChurn is the mean time (exponentially distributed) a user
	// of the class stays in one of its groups before leaving it, and out
	// of it before joining again; 0 never leaves.
	MembershipChurn time.Duration `koanf:"membership_churn"`
}

// Limits of a behaviour mix: few classes, since each is a line of the
// report, and churn no faster than the server can be asked.
const (
	maxBehaviours      = 8
	minMembershipChurn = time.Second
)

var behaviourNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ParseSize reads a message_size of a behaviour class: "N" or "MIN-MAX"
// bytes, 0 to 65536; "" is 0.
func ParseSize(s string) (lo, hi int, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = strconv.Atoi(strings.TrimSpace(b))
	}
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, fmt.Errorf("want N or MIN-MAX bytes, such as 4096-16384")
	case lo < 0 || hi > maxMessageSize:
		return 0, 0, fmt.Errorf("sizes must be 0 to %d bytes", maxMessageSize)
	case hi < lo:
		return 0, 0, fmt.Errorf("MIN must not be above MAX")
	}
	return lo, hi, nil
}

// layoutProblems checks what a population and a soak profile share: the
// group layout, the devices per user and the behaviour mix, with keys
// starting with at ("population.", or "" for a profile, whose errors get
// the profile's own prefix).
func layoutProblems(at, groups string, devices int, mix []Behaviour) []*ValidationError {
	var out []*ValidationError
	if _, err := ParseGroups(groups); err != nil {
		out = append(out, &ValidationError{Key: at + "groups", Value: groups, Err: err})
	}
	if devices < 1 || devices > maxDevices {
		out = append(out, &ValidationError{Key: at + "devices", Value: devices, Err: fmt.Errorf("must be 1 to %d", maxDevices)})
	}
	return append(out, behaviourProblems(at+"behaviours", mix)...)
}

// behaviourProblems checks a mix whose keys start with at
// ("population.behaviours").
func behaviourProblems(at string, mix []Behaviour) []*ValidationError {
	var out []*ValidationError
	fail := func(key string, value any, format string, args ...any) {
		out = append(out, &ValidationError{Key: key, Value: value, Err: fmt.Errorf(format, args...)})
	}
	if len(mix) > maxBehaviours {
		fail(at, len(mix), "must list at most %d classes", maxBehaviours)
	}
	names := map[string]bool{}
	sum := 0.0
	for i, b := range mix {
		el := fmt.Sprintf("%s[%d]", at, i)
		if !behaviourNameRE.MatchString(b.Name) {
			fail(el+".name", b.Name, "must match %s", behaviourNameRE)
		} else if names[b.Name] {
			fail(el+".name", b.Name, "must be unique in %s", at)
		}
		names[b.Name] = true
		if !(b.Share > 0 && b.Share <= 1) {
			fail(el+".share", b.Share, "must be above 0 and at most 1")
		} else {
			sum += b.Share
		}
		if !(b.Rate >= 0 && b.Rate <= maxRate) {
			fail(el+".rate", b.Rate, "must be 0 to %d", maxRate)
		}
		if _, _, err := ParseSize(b.MessageSize); err != nil {
			fail(el+".message_size", b.MessageSize, "%v", err)
		}
		if b.MembershipChurn != 0 && b.MembershipChurn < minMembershipChurn {
			fail(el+".membership_churn", b.MembershipChurn, "must be 0 or at least %v", minMembershipChurn)
		}
	}
	if len(mix) > 0 && math.Abs(sum-1) > 1e-9 {
		fail(at, fmt.Sprintf("shares adding up to %g", sum), "the shares must add up to 1")
	}
	return out
}
