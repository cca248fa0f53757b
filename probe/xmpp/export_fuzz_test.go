package xmpp

import "bytes"

// ParseFrame parses frame as a session does, for the session fuzz target
// in package xmpp_test, and returns the parser's error.
func ParseFrame(frame []byte) error {
	return parseFrame(bytes.Clone(frame), new(stanza), func(*stanza) error { return nil })
}
