package reference

import "bytes"

// ParseFrame parses a server frame as a session does, for the session fuzz
// target in package embedded_test, and returns the parser's error.
func ParseFrame(b []byte) error {
	var f frame
	return parseFrame(bytes.Clone(b), &f)
}
