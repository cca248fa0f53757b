package jsonws

// Tracing a mapped session (imcanary jsonws try, --trace) without its
// secrets: tokens, passwords and captures named as secrets are redacted.

import (
	"bytes"
	"regexp"
	"strings"
)

// tracing reports whether a trace is on: steady-state paths check it
// before they build what they would trace.
func (s *session) tracing() bool { return s.d.opts.Trace != nil }

func (s *session) trace(what, key, detail string) {
	if t := s.d.opts.Trace; t != nil {
		t(Event{User: s.user, What: what, Key: key, Detail: s.redact(detail)})
	}
}

// redact removes the session's secrets from what a trace shows: its token
// and password, and what its steps captured under a name that says secret
// (a session token a server hands back).
func (s *session) redact(detail string) string {
	for _, sec := range []string{s.env.token, s.env.password} {
		if len(sec) >= 4 {
			detail = strings.ReplaceAll(detail, sec, "[redacted]")
		}
	}
	for name, v := range s.attrs {
		if len(v) >= 4 && secretName(name) {
			detail = strings.ReplaceAll(detail, v, "[redacted]")
		}
	}
	// A server that hands back a session token of its own (Tinode's
	// login reply) names it so.
	return secretField.ReplaceAllString(detail, `$1"[redacted]"`)
}

// secretField is a JSON string field whose name says it holds a secret.
var secretField = regexp.MustCompile(`("[^"]*(?i:token|secret|password)[^"]*"\s*:\s*)"(?:[^"\\]|\\.)*"`)

// secretName reports whether a capture's name says it holds a secret.
func secretName(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"token", "secret", "password", "key", "auth"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// redacted renders t for a trace, with the secrets left out.
func (s *session) redacted(t *template, e *env) string {
	re := *e
	re.token, re.password = "[token]", "[password]"
	for i := range t.parts {
		if a := t.parts[i].act; a != nil && a.fn == "base64" {
			// What is encoded holds a password as often as not.
			b, _ := t.redactedBase64(&re)
			return string(b)
		}
	}
	b, _ := t.render(nil, &re)
	return string(b)
}

// redactedBase64 renders t with every base64 action shown as [base64].
func (t *template) redactedBase64(e *env) ([]byte, error) {
	var b []byte
	for i := range t.parts {
		p := &t.parts[i]
		switch {
		case p.act == nil:
			b = append(b, p.lit...)
		case p.act.fn == "base64":
			if !p.act.inString {
				b = append(b, '"')
			}
			b = append(b, "[base64]"...)
			if !p.act.inString {
				b = append(b, '"')
			}
		default:
			var err error
			if b, err = p.act.render(b, e); err != nil {
				return b, err
			}
		}
	}
	return b, nil
}

// redactCaptures returns raw as a trace may show it: with the values the
// open steps would capture under a secret's name removed.
func (s *session) redactCaptures(raw []byte, open []waiting) string {
	out := string(raw)
	m := s.d.m.dec.newMsg()
	_ = s.d.m.dec.each(bytes.Clone(raw), m, func(m *msg) error {
		for _, w := range open {
			for _, c := range w.st.captures {
				if v := m.vals[c.slot]; v.present() && len(v.b) >= 4 && secretName(c.name) {
					out = strings.ReplaceAll(out, string(v.b), "[redacted]")
				}
			}
		}
		return nil
	})
	return out
}
