package xmpp

// The stanzas imcanary writes, each appended or built whole, with what
// it sends escaped.

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendEscaped appends s as XML text or attribute value (quoted with ").
// Characters XML 1.0 cannot carry at all — most controls, invalid UTF-8,
// U+FFFE and U+FFFF — become U+FFFD: probe bodies are plain ASCII and never
// contain them, and a stanza that carried them would end the stream.
func appendEscaped(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch {
			case c == '&':
				dst = append(dst, "&amp;"...)
			case c == '<':
				dst = append(dst, "&lt;"...)
			case c == '>':
				dst = append(dst, "&gt;"...)
			case c == '"':
				dst = append(dst, "&quot;"...)
			case c == '\'':
				dst = append(dst, "&apos;"...)
			case c < 0x20 && c != '\t' && c != '\n' && c != '\r':
				dst = append(dst, "\uFFFD"...)
			case c == '\r':
				// A raw CR is normalised away by every XML parser.
				dst = append(dst, "&#xD;"...)
			default:
				dst = append(dst, c)
			}
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 || r == 0xFFFE || r == 0xFFFF {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return dst
}

func appendEscapedString(dst []byte, s string) []byte {
	return appendEscaped(dst, []byte(s))
}

// The fixed elements.
var (
	closeStream = []byte(`<close xmlns="` + nsFraming + `"/>`)
	smRequest   = []byte(`<r xmlns="` + nsSM + `"/>`)
)

// openStream opens (or, after SASL, restarts) the stream to domain.
func openStream(domain string) []byte {
	b := []byte(`<open xmlns="` + nsFraming + `" to="`)
	b = appendEscapedString(b, domain)
	return append(b, `" version="1.0"/>`...)
}

// appendMessage appends a message stanza to local@domain with the probe
// body. typ is "chat" or "groupchat"; the id is the caller's ref, which
// comes back on reflections and errors.
func appendMessage(dst []byte, typ, local, domain string, ref uint64, body []byte) []byte {
	dst = append(dst, `<message xmlns="jabber:client" type="`...)
	dst = append(dst, typ...)
	dst = append(dst, `" to="`...)
	dst = appendEscapedString(dst, local)
	dst = append(dst, '@')
	dst = appendEscapedString(dst, domain)
	dst = append(dst, `" id="`...)
	dst = strconv.AppendUint(dst, ref, 10)
	dst = append(dst, `"><body>`...)
	dst = appendEscaped(dst, body)
	return append(dst, `</body></message>`...)
}

// appendAck appends an SM answer counting h handled stanzas.
func appendAck(dst []byte, h uint32) []byte {
	dst = append(dst, `<a xmlns="`+nsSM+`" h="`...)
	dst = strconv.AppendUint(dst, uint64(h), 10)
	return append(dst, `"/>`...)
}

func authStanza(mechanism string, initial []byte) []byte {
	b := []byte(`<auth xmlns="` + nsSASL + `" mechanism="` + mechanism + `">`)
	b = append(b, initial...)
	return append(b, `</auth>`...)
}

func saslResponse(payload []byte) []byte {
	b := []byte(`<response xmlns="` + nsSASL + `">`)
	b = append(b, payload...)
	return append(b, `</response>`...)
}

func registerStanza(id, user, password string) []byte {
	b := []byte(`<iq xmlns="jabber:client" type="set" id="`)
	b = appendEscapedString(b, id)
	b = append(b, `"><query xmlns="`+nsRegister+`"><username>`...)
	b = appendEscapedString(b, user)
	b = append(b, `</username><password>`...)
	b = appendEscapedString(b, password)
	return append(b, `</password></query></iq>`...)
}

func bindStanza(resource string) []byte {
	b := []byte(`<iq xmlns="jabber:client" type="set" id="bind"><bind xmlns="` + nsBind + `"><resource>`)
	b = appendEscapedString(b, resource)
	return append(b, `</resource></bind></iq>`...)
}

func enableStanza(resume bool) []byte {
	if resume {
		return []byte(`<enable xmlns="` + nsSM + `" resume="true"/>`)
	}
	return []byte(`<enable xmlns="` + nsSM + `"/>`)
}

func resumeStanza(previd string, h uint32) []byte {
	b := []byte(`<resume xmlns="` + nsSM + `" previd="`)
	b = appendEscapedString(b, previd)
	b = append(b, `" h="`...)
	b = strconv.AppendUint(b, uint64(h), 10)
	return append(b, `"/>`...)
}

var initialPresence = []byte(`<presence xmlns="jabber:client"/>`)

// joinStanza joins a MUC room as nick, asking for no history: a replay
// would look like duplicates.
func joinStanza(room, nick string) []byte {
	b := []byte(`<presence xmlns="jabber:client" to="`)
	b = appendEscapedString(b, room)
	b = append(b, '/')
	b = appendEscapedString(b, nick)
	return append(b, `"><x xmlns="`+nsMUC+`"><history maxstanzas="0"/></x></presence>`...)
}

// instantRoomStanza accepts the default configuration of a room just
// created (XEP-0045 §10.1.2), which unlocks it.
func instantRoomStanza(id, room string) []byte {
	b := []byte(`<iq xmlns="jabber:client" type="set" id="`)
	b = appendEscapedString(b, id)
	b = append(b, `" to="`...)
	b = appendEscapedString(b, room)
	return append(b, `"><query xmlns="`+nsMUCOwner+`"><x xmlns="`+nsData+`" type="submit"/></query></iq>`...)
}

// iqReply answers an iq get or set from the server: a result for an
// XEP-0199 ping, service-unavailable for anything else (RFC 6120 requires
// an answer to every get and set).
func iqReply(st *stanza) []byte {
	b := []byte(`<iq xmlns="jabber:client" type="`)
	if st.ping {
		b = append(b, `result`...)
	} else {
		b = append(b, `error`...)
	}
	b = append(b, `" id="`...)
	b = appendEscapedString(b, st.id)
	if st.from != "" {
		b = append(b, `" to="`...)
		b = appendEscapedString(b, st.from)
	}
	if st.ping {
		return append(b, `"/>`...)
	}
	return append(b, `"><error type="cancel"><service-unavailable xmlns="`+nsStanzaErrors+`"/></error></iq>`...)
}

// carbonsEnable turns on message carbons (XEP-0280) for the session.
var carbonsEnable = []byte(`<iq xmlns="jabber:client" type="set" id="carbons"><enable xmlns="` + nsCarbons + `"/></iq>`)

// mamQuery asks the archive to (a room's bare JID, or "" for the user's
// own) for a page of mamPage messages archived after the id after, or,
// with after "", since start (Unix seconds; 0: from the archive's
// beginning). tail instead asks for the newest message alone, whose id is
// where a device with no place in the archive starts. The iq id and the
// queryid are both id.
func mamQuery(dst []byte, id, to, after string, start int64, tail bool) []byte {
	dst = append(dst, `<iq xmlns="jabber:client" type="set" id="`...)
	dst = appendEscapedString(dst, id)
	if to != "" {
		dst = append(dst, `" to="`...)
		dst = appendEscapedString(dst, to)
	}
	dst = append(dst, `"><query xmlns="`+nsMAM+`" queryid="`...)
	dst = appendEscapedString(dst, id)
	dst = append(dst, `">`...)
	if start > 0 && after == "" && !tail {
		dst = append(dst, `<x xmlns="`+nsData+`" type="submit"><field var="FORM_TYPE" type="hidden"><value>`+nsMAM+`</value></field><field var="start"><value>`...)
		dst = time.Unix(start, 0).UTC().AppendFormat(dst, "2006-01-02T15:04:05Z")
		dst = append(dst, `</value></field></x>`...)
	}
	dst = append(dst, `<set xmlns="`+nsRSM+`"><max>`...)
	switch {
	case tail:
		dst = append(dst, `1</max><before/>`...)
	case after != "":
		dst = strconv.AppendInt(dst, mamPage, 10)
		dst = append(dst, `</max><after>`...)
		dst = appendEscapedString(dst, after)
		dst = append(dst, `</after>`...)
	default:
		dst = strconv.AppendInt(dst, mamPage, 10)
		dst = append(dst, `</max>`...)
	}
	return append(dst, `</set></query></iq>`...)
}
