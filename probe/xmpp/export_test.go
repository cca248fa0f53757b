package xmpp

import "github.com/imcanary/imcanary/probe"

// KillConn closes the TCP connection under s, as a network failure would.
func KillConn(s probe.Session) { s.(*session).conn.Abort() }

// Resumed reports whether s resumed an earlier stream (XEP-0198).
func Resumed(s probe.Session) bool { return s.(*session).resumed }
