package probe

import (
	"cmp"
	"slices"
	"sync"
)

// Memberships is what a driver remembers of each user between Provision
// and every Connect: what the user joins at login (its groups, rooms or
// channels). Several populations (background, canary, soak) share one
// driver, each with users of its own prefix, so a plan replaces only its
// own users' memberships. The zero value is ready to use.
//
// It is a slice sorted by user, searched at each login, not a map: it is
// written once a plan and read once a login, and a map's entry cost an
// idle session about 40 bytes more (2026-12-06).
type Memberships[T any] struct {
	mu   sync.Mutex
	ents []membership[T]
}

type membership[T any] struct {
	user string
	of   []T
}

// Replace sets the memberships of users to of[user] (none for a user of
// users that of leaves out), and leaves every other user's alone.
func (m *Memberships[T]) Replace(users []string, of map[string][]T) {
	drop := make(map[string]struct{}, len(users))
	for _, u := range users {
		drop[u] = struct{}{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A new slice, not compacted in place: readers hold none of it, but
	// the old array would keep the dropped users' lists alive.
	ents := make([]membership[T], 0, len(m.ents)+len(of))
	for _, e := range m.ents {
		_, dropped := drop[e.user]
		_, replaced := of[e.user]
		if !dropped && !replaced {
			ents = append(ents, e)
		}
	}
	for u, v := range of {
		if len(v) > 0 {
			ents = append(ents, membership[T]{user: u, of: v})
		}
	}
	slices.SortFunc(ents, func(a, b membership[T]) int { return cmp.Compare(a.user, b.user) })
	m.ents = slices.Clip(ents)
}

// Of returns user's memberships. The slice is shared: callers must not
// modify it.
func (m *Memberships[T]) Of(user string) []T {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := slices.BinarySearchFunc(m.ents, user, func(e membership[T], u string) int { return cmp.Compare(e.user, u) })
	if !ok {
		return nil
	}
	return m.ents[i].of
}

// Pack gives each key of counts its own slice of one backing array, of
// length 0 and capacity counts[key]: a plan's memberships are appended to
// them without an allocation of their own for each user.
func Pack[T any](counts map[string]int) map[string][]T {
	total := 0
	for _, n := range counts {
		total += n
	}
	all := make([]T, total)
	out := make(map[string][]T, len(counts))
	at := 0
	for k, n := range counts {
		out[k] = all[at : at : at+n]
		at += n
	}
	return out
}
