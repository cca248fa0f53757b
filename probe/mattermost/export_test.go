package mattermost

import (
	"strings"

	"github.com/imcanary/imcanary/probe"
)

// Abort ends s as a dropped link does: no close handshake.
func Abort(s probe.Session) { s.(*session).conn.Abort() }

// Channels returns the channels d provisioned, by conversation.
func Channels(d *Driver) map[string]string {
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

// Fetched counts the posts catch-up fetches delivered.
func Fetched(d *Driver) uint64 { return d.fetched.Load() }

// ForgetConnections replaces the connection id every device of user kept
// with one the server never gave: its next resume finds nothing, as after
// a server restart, and the server answers with a new hello.
func ForgetConnections(d *Driver, user string) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for k, p := range d.devices {
		if strings.HasPrefix(k, user+"\x00") {
			p.mu.Lock()
			if p.connID != "" {
				p.connID = "imcanaryforgottenconnect00"[:26]
			}
			p.mu.Unlock()
		}
	}
}

// Token returns the session token device dev of user holds.
func Token(d *Driver, user string, dev int) string { return d.token(user, dev) }
