package xmpp

import (
	"bytes"
	"encoding/base64"
	"encoding/xml"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/imcanary/imcanary/probe/internal/fuzzcorpus"
)

// hostileFrames are frames a hostile or broken server might send, each
// of which parseFrame must refuse. The fuzz target below starts from small
// versions of them; TestParseFrameHostileBounded runs them at full size.
func hostileFrames() map[string]string {
	const msg = `<message xmlns='jabber:client' type='chat' from='a@b'>`
	return map[string]string{
		"deep nesting":          strings.Repeat("<a>", 100000) + strings.Repeat("</a>", 100000),
		"deep nesting unclosed": msg + strings.Repeat("<x>", 1<<20),
		"many elements":         msg + strings.Repeat("<x/>", 100000) + "</message>",
		"many attributes": "<message xmlns='jabber:client'" + func() string {
			var b strings.Builder
			for i := range 10000 {
				b.WriteString(" a" + strconv.Itoa(i) + "='x'")
			}
			return b.String()
		}() + "/>",
		"billion laughs": `<!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">` +
			`<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">` +
			`<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">]>` +
			msg + `<body>&f;</body></message>`,
		"quadratic blowup": `<!DOCTYPE l [<!ENTITY a "` + strings.Repeat("a", 50000) + `">]>` +
			msg + `<body>` + strings.Repeat("&a;", 10000) + `</body></message>`,
		"doctype after element":  msg + `</message><!DOCTYPE x>`,
		"external entity":        `<!DOCTYPE m [<!ENTITY x SYSTEM "file:///etc/passwd">]>` + msg + `<body>&x;</body></message>`,
		"parameter entity":       `<!DOCTYPE m [<!ENTITY % p SYSTEM "http://127.0.0.1:1/x.dtd"> %p;]>` + msg + `</message>`,
		"undefined entity":       msg + `<body>&x;</body></message>`,
		"entity in attribute":    `<message xmlns='jabber:client' id='&x;'/>`,
		"processing instruction": `<?xml-stylesheet href="x"?>` + msg + `</message>`,
		"xml declaration utf-16": `<?xml version="1.0" encoding="UTF-16"?>` + msg + `</message>`,
		"invalid utf-8 in text":  msg + "<body>imc1 \xff\xfe</body></message>",
		"invalid utf-8 in attr":  "<message xmlns='jabber:client' from='a\xc0\xafb'/>",
		"invalid utf-8 in name":  "<mess\xffage xmlns='jabber:client'/>",
		"overlong utf-8":         msg + "<body>\xc0\xbc</body></message>",
		"surrogate utf-8":        msg + "<body>\xed\xa0\x80</body></message>",
		"nul character":          msg + "<body>a\x00b</body></message>",
		"nul character ref":      msg + "<body>a&#0;b</body></message>",
		"out of range char ref":  msg + "<body>&#x110000;</body></message>",
		"huge char ref":          msg + "<body>&#99999999999999999999999;</body></message>",
		"unclosed":               msg + `<body>imc1`,
		"mismatched":             msg + `<body>imc1</message></body>`,
		"text between stanzas":   `<r xmlns='urn:xmpp:sm:3'/>junk`,
		"text before":            `junk<r xmlns='urn:xmpp:sm:3'/>`,
		"unterminated comment":   msg + `<!-- ` + strings.Repeat("x", 1<<16),
		"unterminated cdata":     msg + `<body><![CDATA[` + strings.Repeat("x", 1<<16),
		"unterminated attribute": `<message xmlns='jabber:client' id='` + strings.Repeat("x", 1<<20),
	}
}

// TestParseFrameHostileBounded checks that every hostile frame is refused with an
// error, within a time and an allocation bound linear in its size: no
// entity is expanded, and no limit is enforced only after the damage.
func TestParseFrameHostileBounded(t *testing.T) {
	for name, frame := range hostileFrames() {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			n := 0
			err := parseFrame([]byte(frame), new(stanza), func(*stanza) error { n++; return nil })
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if err == nil || err.Error() == "" {
				t.Errorf("parseFrame(%.60q…) = %v after %d elements, want an error", frame, err, n)
			}
			// encoding/xml allocates per token; 64 bytes for every byte
			// of input is far above what it needs and far below what
			// expanding an entity would take.
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d bytes: %v, %d bytes allocated in %v", len(frame), err, alloc, took)
			if alloc > 64*uint64(len(frame))+1<<20 {
				t.Errorf("parseFrame(%.60q…) allocated %d bytes for a %d-byte frame", frame, alloc, len(frame))
			}
			// Generous for a loaded machine; expansion would take minutes.
			if took > 5*time.Second {
				t.Errorf("parseFrame(%.60q…) took %v for a %d-byte frame", frame, took, len(frame))
			}
		})
	}
}

// TestParseFrameHugeValues: frames of the size the read limit lets
// through, with one huge attribute or body, parse to fields no larger than
// the frame.
func TestParseFrameHugeValues(t *testing.T) {
	big := strings.Repeat("x", maxFrame-200)
	for name, frame := range map[string]string{
		"attribute": `<message xmlns='jabber:client' type='chat' from='` + big + `'/>`,
		"body":      `<message xmlns='jabber:client' type='chat' from='a@b'><body>` + big + `</body></message>`,
		"escaped":   `<message xmlns='jabber:client' type='chat' from='a@b'><body>` + strings.Repeat("&amp;", (maxFrame-200)/5) + `</body></message>`,
	} {
		t.Run(name, func(t *testing.T) {
			n := 0
			err := parseFrame([]byte(frame), new(stanza), func(st *stanza) error {
				n++
				if got := capturedLen(st); got > len(frame) {
					t.Errorf("parsed fields hold %d bytes of a %d-byte frame", got, len(frame))
				}
				return nil
			})
			if err != nil || n != 1 {
				t.Errorf("parseFrame(%d bytes) = %v after %d elements, want nil after 1", len(frame), err, n)
			}
		})
	}
}

// capturedLen is how many bytes of the frame st holds on to. smID is left
// out: it is the id attribute again.
func capturedLen(st *stanza) int {
	return len(st.typ) + len(st.id) + len(st.from) + len(st.cond) +
		len(st.body) + len(st.text) + len(st.jid) + len(st.sasl) + len(st.scratch)
}

// FuzzParseFrameLimits holds parseFrame to its limits on any frame: it never
// panics; an error has a message; it hands over no more than maxElements
// elements, each lying in the frame, with fields valid UTF-8 and together
// no larger than the element; and a frame it accepts whole has, by
// encoding/xml's own reading, no DTD or processing instruction and no
// element deeper, more numerous or with more attributes than the limits.
// Its seeds are Prosody's frames (FuzzParseFrame's corpus) and small
// versions of the hostile frames above.
func FuzzParseFrameLimits(f *testing.F) {
	for _, s := range fuzzcorpus.Bytes(f, "testdata/fuzz/FuzzParseFrame") {
		f.Add(s)
	}
	for _, frame := range hostileFrames() {
		if len(frame) > 4096 {
			frame = frame[:4096]
		}
		f.Add([]byte(frame))
	}
	f.Add([]byte(strings.Repeat("<a>", maxDepth) + strings.Repeat("</a>", maxDepth)))
	f.Add([]byte(`<challenge xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>cj1hYmM=</challenge><iq xmlns='jabber:client' type='result' id='bind'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><jid>a@b/c</jid></bind></iq>`))
	f.Add([]byte(`<stream:error xmlns:stream='http://etherx.jabber.org/streams'><conflict xmlns='urn:ietf:params:xml:ns:xmpp-streams'/><text xmlns='urn:ietf:params:xml:ns:xmpp-streams'>&#x1F600;&lt;</text></stream:error>`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		in := bytes.Clone(frame)
		n := 0
		err := parseFrame(frame, new(stanza), func(st *stanza) error {
			n++
			if n > maxElements {
				t.Fatalf("parseFrame(%q) handed over element %d, limit %d", in, n, maxElements)
			}
			if len(st.raw) == 0 || !within(frame, st.raw) {
				t.Fatalf("parseFrame(%q): element %q does not lie in the frame", in, st.raw)
			}
			if got := capturedLen(st); got > len(st.raw) {
				t.Fatalf("parseFrame(%q): fields of %q hold %d bytes", in, st.raw, got)
			}
			for _, s := range [][]byte{[]byte(st.typ), []byte(st.id), []byte(st.from), []byte(st.cond), st.body, st.text, st.jid, st.sasl} {
				if !utf8.Valid(s) {
					t.Fatalf("parseFrame(%q): field %q is not UTF-8", in, s)
				}
			}
			return nil
		})
		if !bytes.Equal(frame, in) {
			t.Fatalf("parseFrame(%q) changed its input", in)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("parseFrame(%q) returned an error without a message", in)
			}
			return
		}
		if why := beyondLimits(frame); why != "" {
			t.Fatalf("parseFrame(%q) = nil, but the frame has %s", in, why)
		}
	})
}

// within reports whether sub is a subslice of b.
func within(b, sub []byte) bool {
	if len(b) == 0 || len(sub) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	s := uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	return s >= start && s+uintptr(len(sub)) <= start+uintptr(len(b))
}

// beyondLimits reads frame with a plain encoding/xml decoder and says which
// of parseFrame's limits it breaks, or "".
func beyondLimits(frame []byte) string {
	d := xml.NewDecoder(bytes.NewReader(frame))
	d.Strict = true
	depth, elements := 0, 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return ""
		}
		if err != nil {
			return "an error by encoding/xml: " + err.Error()
		}
		switch t := tok.(type) {
		case xml.StartElement:
			elements++
			depth++
			switch {
			case depth > maxDepth:
				return "elements nested deeper than " + strconv.Itoa(maxDepth)
			case elements > maxElements:
				return "more than " + strconv.Itoa(maxElements) + " elements"
			case len(t.Attr) > maxAttrs:
				return "an element with more than " + strconv.Itoa(maxAttrs) + " attributes"
			}
		case xml.EndElement:
			depth--
		case xml.Directive:
			return "a directive " + strconv.Quote(string(t))
		case xml.ProcInst:
			return "a processing instruction " + strconv.Quote(t.Target)
		}
	}
}

// FuzzSCRAM feeds the SCRAM client arbitrary server-first and server-final
// messages: it never panics, every error says it is SCRAM's, what it
// answers is base64 of a client-final message that extends our nonce, and
// no server-final message but the one carrying the right signature
// verifies.
func FuzzSCRAM(f *testing.F) {
	b64 := func(s string) []byte { return []byte(base64.StdEncoding.EncodeToString([]byte(s))) }
	f.Add(b64("r=abcdefXYZ,s=QSXCR+Q6sek8bf92,i=4096"), b64("v=rmF9pqV8S7suAoZWja4dJRkFsKQ="))
	f.Add(b64("r=abcdef,s=QSXCR+Q6sek8bf92,i=1,x=ext"), b64("e=invalid-proof"))
	f.Add(b64("r=abcdef,s=,i=4096"), []byte("!!"))
	f.Add(b64("r=abcdef,s=QSXCR+Q6sek8bf92,i=131073"), b64("v="))
	f.Add(b64("m=x,r=abcdefg,s=QQ==,i=-1"), []byte(" "+string(b64("v=AAAA"))+"\n"))
	f.Add([]byte("cj1hYmNkZWZnLHM9UVE9PSxpPTE="), []byte(""))
	cache := &saltCache{}
	f.Fuzz(func(t *testing.T, challenge, success []byte) {
		c := &scramClient{cache: cache, user: "u", password: "p", nonce: "abcdef", clientFirstBare: "n=u,r=abcdef"}
		final, err := c.respond(bytes.Clone(challenge))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "scram: ") {
				t.Fatalf("respond(%q) = %v, want an error starting with scram:", challenge, err)
			}
			if verr := c.verify(success); verr == nil {
				t.Fatalf("verify(%q) after a failed respond = nil", success)
			}
			return
		}
		raw, err := base64.StdEncoding.DecodeString(string(final))
		if err != nil || !strings.HasPrefix(string(raw), "c=biws,r=abcdef") || !strings.Contains(string(raw), ",p=") {
			t.Fatalf("respond(%q) = %q (%q, %v), want base64 of a client-final message extending our nonce", challenge, final, raw, err)
		}
		right := b64("v=" + base64.StdEncoding.EncodeToString(c.serverSignature))
		verr := c.verify(success)
		if verr != nil && !strings.HasPrefix(verr.Error(), "scram: ") {
			t.Fatalf("verify(%q) = %v, want an error starting with scram:", success, verr)
		}
		if verr == nil && !bytes.Equal(signatureIn(success), c.serverSignature) {
			t.Fatalf("verify(%q) = nil, want an error: the signature is not the server's", success)
		}
		if err := c.verify(right); err != nil {
			t.Fatalf("verify(the right signature) = %v", err)
		}
	})
}

// signatureIn decodes the signature of a server-final message, or nil.
func signatureIn(success64 []byte) []byte {
	final, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(success64)))
	if err != nil {
		return nil
	}
	v, ok := strings.CutPrefix(string(final), "v=")
	if !ok {
		return nil
	}
	sig, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil
	}
	return sig
}
