package jsonscan

// AppendString appends s to b as a JSON string, quoted: the one encoder
// the adapters' frame writers share. Probe bodies and names are plain
// ASCII, so the loop rarely escapes anything; it still escapes correctly
// whatever it is given, and valid UTF-8 passes through as it is.
func AppendString[S string | []byte](b []byte, s S) []byte {
	b = append(b, '"')
	b = AppendEscaped(b, s)
	return append(b, '"')
}

// AppendEscaped appends s to b escaped for the inside of a JSON string,
// without the quotes: for a string built of several parts.
func AppendEscaped[S string | []byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	// Runs that need no escape, which is all of a probe body, are
	// appended whole.
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		if c < 0x20 {
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		} else {
			b = append(b, '\\', c)
		}
		start = i + 1
	}
	return append(b, s[start:]...)
}
