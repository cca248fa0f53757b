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

// ParseUint parses b, decimal digits only, as a number that fits in 64
// bits, without the allocation strconv.ParseUint makes for its error on
// bad input: the hot paths read sequence numbers with it.
func ParseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
