package matrix

import "github.com/imcanary/imcanary/probe"

// Abort ends s as a dropped link does: no shutdown, the poll cut.
func Abort(s probe.Session) { s.(*session).conn.Abort() }

// Rooms returns the rooms d provisioned, by conversation.
func Rooms(d *Driver) map[string]string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := map[string]string{}
	for g, id := range d.groups {
		out["g:"+g] = id
	}
	for p, id := range d.directs {
		out["d:"+p[0]+","+p[1]] = id
	}
	return out
}

// Token returns the access token of device 0 of user, "" for none.
func Token(d *Driver, user string) string { return d.token(user, 0) }
