package mqtt

import "github.com/imcanary/imcanary/probe"

// Abort drops s's connection without DISCONNECT, as a lost link does.
func Abort(s probe.Session) { s.(*session).conn.Abort() }
