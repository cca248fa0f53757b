package probe

import "sync"

// Memberships is what a driver remembers of each user between Provision
// and every Connect: what the user joins at login (its groups, rooms or
// channels). Several populations (background, canary, soak) share one
// driver, each with users of its own prefix, so a plan replaces only its
// own users' memberships. The zero value is ready to use.
type Memberships[T any] struct {
	mu sync.Mutex
	of map[string][]T
}

// Replace sets the memberships of users to of[user] (none for a user of
// users that of leaves out), and leaves every other user's alone.
func (m *Memberships[T]) Replace(users []string, of map[string][]T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.of == nil {
		m.of = make(map[string][]T, len(of))
	}
	for _, u := range users {
		delete(m.of, u)
	}
	for u, v := range of {
		m.of[u] = v
	}
}

// Of returns user's memberships. The slice is shared: callers must not
// modify it.
func (m *Memberships[T]) Of(user string) []T {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.of[user]
}
