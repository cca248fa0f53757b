package xmpp

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// parseAll parses frame and returns a summary of each element.
func parseAll(frame string) ([]string, error) {
	var out []string
	st := new(stanza)
	err := parseFrame([]byte(frame), st, func(st *stanza) error {
		out = append(out, summary(st))
		return nil
	})
	return out, err
}

// summary prints the fields of st that are set.
func summary(st *stanza) string {
	var b strings.Builder
	b.WriteString(st.kind.String())
	add := func(k string, v any) { fmt.Fprintf(&b, " %s=%v", k, v) }
	for _, f := range []struct {
		k string
		v string
	}{{"type", st.typ}, {"id", st.id}, {"from", st.from}, {"smid", st.smID}, {"cond", st.cond}} {
		if f.v != "" {
			add(f.k, f.v)
		}
	}
	for _, f := range []struct {
		k string
		v []byte
	}{{"text", st.text}, {"jid", st.jid}, {"sasl", st.sasl}} {
		if len(f.v) > 0 {
			add(f.k, string(f.v))
		}
	}
	if st.hasBody {
		add("body", string(st.body))
	}
	if st.hasH {
		add("h", st.h)
	}
	for _, f := range []struct {
		k string
		v bool
	}{{"delayed", st.delayed}, {"history", st.history}, {"self", st.self}, {"created", st.created}, {"removed", st.removed},
		{"ping", st.ping}, {"bind", st.featBind}, {"sm", st.featSM}, {"register", st.featRegister},
		{"plain", st.mechPlain}, {"scram", st.mechSCRAM}} {
		if f.v {
			b.WriteString(" " + f.k)
		}
	}
	return b.String()
}

// Frames as Prosody 0.12.3 sent them (captured on loopback; ids shortened).
const (
	prosodyOpen      = `<open version='1.0' from='localhost' id='30ebd22e' xml:lang='en' xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>`
	prosodyFeatures1 = `<stream:features xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><register xmlns='http://jabber.org/features/iq-register'/><mechanisms xmlns='urn:ietf:params:xml:ns:xmpp-sasl'><mechanism>SCRAM-SHA-1</mechanism><mechanism>PLAIN</mechanism></mechanisms></stream:features>`
	prosodyFeatures2 = `<stream:features xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><sub xmlns='urn:xmpp:features:pre-approval'/><sm xmlns='urn:xmpp:sm:2'><optional/></sm><sm xmlns='urn:xmpp:sm:3'><optional/></sm><c node='http://prosody.im' hash='sha-1' ver='KjDRwWDjaXBb2lmR6bk5s54vuAE=' xmlns='http://jabber.org/protocol/caps'/><ver xmlns='urn:xmpp:features:rosterver'/><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><required/></bind><session xmlns='urn:ietf:params:xml:ns:xmpp-session'><optional/></session></stream:features>`
	prosodySuccess   = `<success xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>dj1ybUY5cHFWOFM3c3VBb1pXamE0ZEpSa0ZzS1E9</success>`
	prosodyBind      = `<iq type='result' xmlns='jabber:client' id='bind'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><jid>alice@localhost/imcanary</jid></bind></iq>`
	prosodyEnabled   = `<enabled xmlns='urn:xmpp:sm:3'/>`
	prosodySelf      = `<presence from='room1@conference.localhost/alice' xml:lang='en' to='alice@localhost/imcanary' xmlns='jabber:client'><occupant-id xmlns='urn:xmpp:occupant-id:0' id='GIGdSj5N'/><x xmlns='http://jabber.org/protocol/muc#user'><status code='201'/><item affiliation='owner' role='moderator' jid='alice@localhost/imcanary'/><status code='110'/></x></presence>`
	prosodyGroupMsg  = `<message from='room1@conference.localhost/bob' id='42' type='groupchat' xml:lang='en' to='alice@localhost/imcanary' xmlns='jabber:client'><body>hello &amp; bye</body><occupant-id xmlns='urn:xmpp:occupant-id:0' id='03jWulPP'/></message>`
	prosodyR         = `<r xmlns='urn:xmpp:sm:3'/>`
	prosodyA         = `<a xmlns='urn:xmpp:sm:3' h='6'/>`
	prosodyMsgError  = `<message from='nobody@localhost' id='44' type='error' to='bob@localhost/imcanary' xmlns='jabber:client'><error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></message>`
	prosodyStreamErr = `<stream:error xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><unsupported-stanza-type xmlns='urn:ietf:params:xml:ns:xmpp-streams'/></stream:error>`
	prosodyClose     = `<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>`
	prosodyConflict  = `<stream:error xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><conflict xmlns='urn:ietf:params:xml:ns:xmpp-streams'/><text xmlns='urn:ietf:params:xml:ns:xmpp-streams'>Replaced by new connection</text></stream:error>`
	prosodyChallenge = `<challenge xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>cj1hYmNkZWZnaGlqa2w2NzE1ODJmYy0wMzkwLTRlMDMtYmQ5Yi1iOGMzYTE4MzViZDEscz1OMlUzTVRBMFltUXROekF6WlMwME5UUmhMV0pqTUdZdFpUSTFaRGhtTmpZelltRTMsaT0xMDAwMA==</challenge>`
	// A chat message not acknowledged before its session ended: Prosody
	// stored it offline (stamping it twice: mod_smacks with the
	// recipient's JID, mod_offline with the host) and delivered it again.
	prosodyResent = `<message from='bob@localhost/imcanary' id='43' type='chat' xml:lang='en' xmlns='jabber:client'><body>self</body><delay from='alice@localhost' stamp='2026-11-30T12:21:43Z' xmlns='urn:xmpp:delay'/><delay from='localhost' stamp='2026-11-30T12:21:43Z' xmlns='urn:xmpp:delay'/></message>`
)

func TestParseFrame(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"open", prosodyOpen, []string{"open id=30ebd22e from=localhost"}},
		{"features before auth", prosodyFeatures1, []string{"features register plain scram"}},
		{"open and features in one frame", prosodyOpen + prosodyFeatures2,
			[]string{"open id=30ebd22e from=localhost", "features bind sm"}},
		{"success", prosodySuccess, []string{"success sasl=dj1ybUY5cHFWOFM3c3VBb1pXamE0ZEpSa0ZzS1E9"}},
		{"bind result", prosodyBind, []string{"iq type=result id=bind jid=alice@localhost/imcanary"}},
		{"enabled", `<enabled xmlns='urn:xmpp:sm:3' id='tok' resume='true' max='600'/>`, []string{"enabled id=tok smid=tok"}},
		{"self presence", prosodySelf, []string{"presence from=room1@conference.localhost/alice self created"}},
		{"group message", prosodyGroupMsg, []string{"message type=groupchat id=42 from=room1@conference.localhost/bob body=hello & bye"}},
		{"r and a", prosodyR + " " + prosodyA, []string{"r", "a h=6"}},
		{"message error", prosodyMsgError, []string{"message type=error id=44 from=nobody@localhost cond=service-unavailable"}},
		{"stream error", prosodyStreamErr + prosodyClose, []string{"stream error cond=unsupported-stanza-type", "close"}},
		{"conflict", prosodyConflict, []string{"stream error cond=conflict text=Replaced by new connection"}},
		{"challenge", prosodyChallenge, []string{"challenge sasl=cj1hYmNkZWZnaGlqa2w2NzE1ODJmYy0wMzkwLTRlMDMtYmQ5Yi1iOGMzYTE4MzViZDEscz1OMlUzTVRBMFltUXROekF6WlMwME5UUmhMV0pqTUdZdFpUSTFaRGhtTmpZelltRTMsaT0xMDAwMA=="}},
		{"stream error with text",
			`<stream:error xmlns:stream='http://etherx.jabber.org/streams'><policy-violation xmlns='urn:ietf:params:xml:ns:xmpp-streams'/><text xmlns='urn:ietf:params:xml:ns:xmpp-streams'>Too many unacked stanzas</text></stream:error>`,
			[]string{"stream error cond=policy-violation text=Too many unacked stanzas"}},
		{"offline message",
			`<message from='bob@localhost/imcanary' type='chat' xmlns='jabber:client'><body>x</body><delay xmlns='urn:xmpp:delay' from='localhost' stamp='2025-01-01T00:00:00Z'/></message>`,
			[]string{"message type=chat from=bob@localhost/imcanary body=x delayed"}},
		{"offline message after an SM resend", prosodyResent,
			[]string{"message type=chat id=43 from=bob@localhost/imcanary body=self delayed"}},
		{"room history",
			`<message from='r@conference.localhost/bob' type='groupchat' xmlns='jabber:client'><body>old</body><delay xmlns='urn:xmpp:delay' from='r@conference.localhost' stamp='2025-01-01T00:00:00Z'/></message>`,
			[]string{"message type=groupchat from=r@conference.localhost/bob body=old delayed history"}},
		{"kicked",
			`<presence type='unavailable' from='r@conference.localhost/alice' xmlns='jabber:client'><x xmlns='http://jabber.org/protocol/muc#user'><status code='307'/><status code='110'/></x></presence>`,
			[]string{"presence type=unavailable from=r@conference.localhost/alice self removed"}},
		{"ping", `<iq type='get' id='p1' from='localhost' xmlns='jabber:client'><ping xmlns='urn:xmpp:ping'/></iq>`,
			[]string{"iq type=get id=p1 from=localhost ping"}},
		{"sasl failure", `<failure xmlns='urn:ietf:params:xml:ns:xmpp-sasl'><not-authorized/><text>Unable to authorize you</text></failure>`,
			[]string{"failure cond=not-authorized text=Unable to authorize you"}},
		{"body not at top", `<message xmlns='jabber:client' type='chat'><x xmlns='y'><body>no</body></x></message>`,
			[]string{"message type=chat"}},
		{"body in another namespace", `<message xmlns='jabber:client' type='chat'><body xmlns='other'>no</body></message>`,
			[]string{"message type=chat"}},
		{"character references", `<message xmlns='jabber:client'><body>&#x41;&#66;&lt;&apos;</body></message>`,
			[]string{"message body=AB<'"}},
		{"whitespace keepalive", " \n", nil},
		{"comment", `<!-- hi --><r xmlns='urn:xmpp:sm:3'/>`, []string{"r"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAll(tt.in)
			if err != nil {
				t.Fatalf("parseFrame(%q) = %v, want nil", tt.in, err)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("parseFrame(%q) =\n%s\nwant\n%s", tt.in, strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestParseFrameRaw checks each element's raw bytes are exactly its span
// of the frame: login replays them.
func TestParseFrameRaw(t *testing.T) {
	frame := prosodyOpen + " " + prosodyR + prosodyGroupMsg
	var raws []string
	st := new(stanza)
	if err := parseFrame([]byte(frame), st, func(st *stanza) error {
		raws = append(raws, string(st.raw))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{prosodyOpen, prosodyR, prosodyGroupMsg}
	if strings.Join(raws, "|") != strings.Join(want, "|") {
		t.Errorf("raw elements = %q, want %q", raws, want)
	}
}

// hostile are frames a server must not be able to crash or fool the
// parser with. Each must be an error.
var hostile = []struct{ name, in string }{
	{"deep nesting", strings.Repeat("<a>", 10000) + strings.Repeat("</a>", 10000)},
	{"just too deep", strings.Repeat("<a>", maxDepth+1) + strings.Repeat("</a>", maxDepth+1)},
	{"too many elements", "<m xmlns='jabber:client'>" + strings.Repeat("<x/>", maxElements) + "</m>"},
	{"too many attributes", "<m" + func() string {
		var b strings.Builder
		for i := range maxAttrs + 1 {
			fmt.Fprintf(&b, " a%d='x'", i)
		}
		return b.String()
	}() + "/>"},
	{"billion laughs", `<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]><message xmlns='jabber:client'><body>&lol2;</body></message>`},
	{"external entity", `<!DOCTYPE m [<!ENTITY x SYSTEM "file:///etc/passwd">]><m>&x;</m>`},
	{"undefined entity", `<message xmlns='jabber:client'><body>&nbsp;</body></message>`},
	{"processing instruction", `<?xml version='1.0'?><r xmlns='urn:xmpp:sm:3'/>`},
	{"other encoding", `<?xml version='1.0' encoding='ISO-8859-1'?><r/>`},
	{"invalid utf-8 in text", "<message xmlns='jabber:client'><body>\xff\xfe</body></message>"},
	{"invalid utf-8 in name", "<mess\xffage/>"},
	{"invalid character reference", `<message xmlns='jabber:client'><body>&#0;</body></message>`},
	{"unclosed", `<message xmlns='jabber:client'><body>x</body>`},
	{"mismatched", `<message xmlns='jabber:client'></presence>`},
	{"stray text", `hello<r xmlns='urn:xmpp:sm:3'/>`},
	{"stray end", `</message>`},
	{"control character", "<message xmlns='jabber:client'><body>\x01</body></message>"},
	{"bad attribute", `<message type=chat/>`},
}

func TestParseFrameHostile(t *testing.T) {
	for _, tt := range hostile {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseAll(tt.in); err == nil {
				t.Errorf("parseFrame(%.60q) = nil, want an error", tt.in)
			}
		})
	}
}

func TestParseFrameCallbackError(t *testing.T) {
	stop := errors.New("stop")
	n := 0
	err := parseFrame([]byte(prosodyR+prosodyR), new(stanza), func(*stanza) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("parseFrame with a failing callback = %v after %d calls, want stop after 1", err, n)
	}
}

func TestAppendEscaped(t *testing.T) {
	tests := []struct{ in, want string }{
		{"imc1 run u1 d.u2 1 123 0-0", "imc1 run u1 d.u2 1 123 0-0"},
		{`<a href="x">&'`, "&lt;a href=&quot;x&quot;&gt;&amp;&apos;"},
		{"tab\tnl\ncr\r", "tab\tnl\ncr&#xD;"},
		{"nul\x00bell\x07", "nul\uFFFDbell\uFFFD"},
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{"é 😀", "é 😀"},
		{"\uFFFE\uFFFF", "\uFFFD\uFFFD"},
	}
	for _, tt := range tests {
		if got := string(appendEscaped(nil, []byte(tt.in))); got != tt.want {
			t.Errorf("appendEscaped(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// FuzzParseFrame feeds the parser frames built from what Prosody sends
// (testdata/fuzz/FuzzParseFrame) and their mutations. The parser must never
// panic, every element's raw span must lie in the frame, and a body that
// survives a round trip through the encoder must parse back unchanged.
func FuzzParseFrame(f *testing.F) {
	for _, s := range []string{prosodyOpen + prosodyFeatures1, prosodyGroupMsg, prosodyR + prosodyA} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		st := new(stanza)
		var bodies [][]byte
		_ = parseFrame(frame, st, func(st *stanza) error {
			if len(st.raw) == 0 || !bytes.Contains(frame, st.raw) {
				t.Fatalf("raw element %q is not part of the frame", st.raw)
			}
			if st.hasBody {
				bodies = append(bodies, append([]byte(nil), st.body...))
			}
			return nil
		})
		for _, body := range bodies {
			if !utf8.Valid(body) {
				t.Fatalf("parsed body %q is not UTF-8", body)
			}
			msg := appendMessage(nil, "chat", "u", "localhost", 7, body)
			var got []byte
			var n int
			if err := parseFrame(msg, new(stanza), func(st *stanza) error {
				n++
				got = append([]byte(nil), st.body...)
				return nil
			}); err != nil {
				t.Fatalf("re-encoded body %q does not parse: %v (%q)", body, err, msg)
			}
			// The parser normalises line ends; the encoder keeps them
			// as written. Bodies with U+FFFE/U+FFFF or other
			// characters XML cannot carry change on purpose.
			if want := appendEscapedRoundTrip(body); n != 1 || !bytes.Equal(got, want) {
				t.Fatalf("body %q round-trips to %q, want %q", body, got, want)
			}
		}
	})
}

// appendEscapedRoundTrip is what a body parses back to after appendEscaped:
// the body with characters XML cannot carry replaced by U+FFFD.
func appendEscapedRoundTrip(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && n == 1, r == 0xFFFE, r == 0xFFFF,
			r < 0x20 && r != '\t' && r != '\n' && r != '\r':
			out = append(out, "\uFFFD"...)
		default:
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

func TestSplitJID(t *testing.T) {
	tests := []struct{ in, bare, res, local string }{
		{"room@conference.localhost/nick/with/slash", "room@conference.localhost", "nick/with/slash", "room"},
		{"user@localhost", "user@localhost", "", "user"},
		{"localhost", "localhost", "", ""},
	}
	for _, tt := range tests {
		bare, res := splitJID(tt.in)
		if bare != tt.bare || res != tt.res || localpart(tt.in) != tt.local {
			t.Errorf("splitJID(%q) = %q, %q, localpart %q, want %q, %q, %q", tt.in, bare, res, localpart(tt.in), tt.bare, tt.res, tt.local)
		}
	}
}
