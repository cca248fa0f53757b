package xmpp

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// This file is the XMPP side of the wire: a parser that reduces each
// top-level element of a WebSocket frame to the few fields the driver reads,
// and the encoders of everything the driver sends.
//
// The parser is encoding/xml's Decoder, strict, over one frame at a time
// (RFC 7395 frames carry whole elements; a frame may hold several). It
// refuses what no XMPP server sends and what a hostile one might: DTDs and
// processing instructions (so no entity expansion of any kind), undeclared
// entities, invalid UTF-8, and frames nested deeper, wider or with more
// elements than the limits below. Each is an error, never a panic, and the
// session ends on it: a frame the driver cannot read might have been a
// delivery.

// Namespaces the driver reads or writes.
const (
	nsClient          = "jabber:client"
	nsFraming         = "urn:ietf:params:xml:ns:xmpp-framing"
	nsStreams         = "http://etherx.jabber.org/streams"
	nsStreamErrors    = "urn:ietf:params:xml:ns:xmpp-streams"
	nsStanzaErrors    = "urn:ietf:params:xml:ns:xmpp-stanzas"
	nsSASL            = "urn:ietf:params:xml:ns:xmpp-sasl"
	nsBind            = "urn:ietf:params:xml:ns:xmpp-bind"
	nsSM              = "urn:xmpp:sm:3"
	nsRegister        = "jabber:iq:register"
	nsRegisterFeature = "http://jabber.org/features/iq-register"
	nsMUC             = "http://jabber.org/protocol/muc"
	nsMUCUser         = "http://jabber.org/protocol/muc#user"
	nsMUCOwner        = "http://jabber.org/protocol/muc#owner"
	nsData            = "jabber:x:data"
	nsDelay           = "urn:xmpp:delay"
	nsPing            = "urn:xmpp:ping"
	nsMAM             = "urn:xmpp:mam:2"
	nsRSM             = "http://jabber.org/protocol/rsm"
	nsForward         = "urn:xmpp:forward:0"
	nsCarbons         = "urn:xmpp:carbons:2"
	nsStanzaID        = "urn:xmpp:sid:0"
)

// Parser limits. Prosody's own c2s stanza limit is 256 KiB; its deepest
// stanzas (features, MUC presence, errors) nest four levels and hold a few
// dozen elements.
const (
	maxFrame    = 256 << 10
	maxDepth    = 32
	maxElements = 2048
	maxAttrs    = 64
)

// Parse errors. Each is wrapped with where it happened.
var (
	errTooDeep     = errors.New("elements nested too deep")
	errTooMany     = errors.New("too many elements in one frame")
	errTooManyAttr = errors.New("too many attributes on one element")
	errDirective   = errors.New("DTDs and processing instructions are not allowed")
	errStrayText   = errors.New("text outside any element")
)

// kind names a top-level element.
type kind uint8

const (
	kindOther kind = iota
	kindOpen
	kindClose
	kindFeatures
	kindStreamError
	kindSuccess
	kindFailure
	kindChallenge
	kindEnabled
	kindFailed
	kindResumed
	kindR
	kindA
	kindMessage
	kindPresence
	kindIQ
)

var kindNames = [...]string{"other", "open", "close", "features", "stream error", "success", "failure", "challenge", "enabled", "failed", "resumed", "r", "a", "message", "presence", "iq"}

func (k kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// stanza is one top-level element reduced to what the driver reads. Its
// byte slices are reused from element to element: they are valid only
// during the callback that receives the stanza.
type stanza struct {
	kind kind
	// client is set for an element of the jabber:client namespace: a
	// stanza, which stream management counts.
	client bool
	// raw is the element's bytes, aliasing the frame.
	raw []byte
	// Attributes of the top-level element. h is the count of the SM <a/>,
	// <resumed/> and <failed/> elements, smID the resumption id of
	// <enabled/>.
	typ, id, from string
	h             uint32
	hasH          bool
	smID          string

	// body is a message's <body/>; hasBody tells an empty body from none.
	body    []byte
	hasBody bool
	// delayed is set by an XEP-0203 <delay/>; history by one stamped by
	// the bare JID the message is from, which is how a room marks the
	// history it replays. Offline storage and SM resends stamp the
	// server's or the recipient's JID.
	delayed, history bool

	// cond and text are the condition and text of a stanza error, stream
	// error, SASL failure or SM failure.
	cond string
	text []byte

	// MUC status codes of a presence (XEP-0045 muc#user).
	self, created, removed bool

	// iq payloads: the bound JID, and whether it is an XEP-0199 ping.
	jid  []byte
	ping bool

	// wrap says what a message wraps: an archive result (XEP-0313), whose
	// query and archive id are mamQuery and mamID, or a carbon copy
	// (XEP-0280) of a message sent or received by another resource.
	wrap            wrapKind
	mamQuery, mamID string
	// fwd is set by the forwarded message inside the wrapper (XEP-0297):
	// its attributes, its body, and the stanza-id it carries.
	fwd                     bool
	fwdFrom, fwdType, fwdID string
	fwdBody                 []byte
	fwdHasBody              bool
	// sids are the XEP-0359 stanza-ids of the message (its archive ids,
	// by archive), the forwarded message's for a carbon.
	sids  [maxSIDs]stanzaID
	nsids int

	// An iq's MAM <fin/>: whether the archive says the query is
	// complete, and the RSM id of the last result it sent.
	fin, finComplete bool
	rsmLast          []byte

	// Stream features.
	featBind, featSM, featRegister bool
	mechPlain, mechSCRAM           bool

	// sasl is the base64 payload of a SASL challenge or success.
	sasl []byte

	// scratch collects the text of an element the driver reads whole
	// (a SASL mechanism name).
	scratch []byte
}

// wrapKind is what a message wraps in a <forwarded/>.
type wrapKind uint8

const (
	wrapNone wrapKind = iota
	wrapResult
	wrapSent
	wrapReceived
)

// stanzaID is one XEP-0359 <stanza-id/>: the archive by and its id there.
type stanzaID struct{ by, id string }

// maxSIDs bounds the stanza-ids kept of one message; Prosody adds one per
// archive and strips those that claim an archive it owns.
const maxSIDs = 4

func (st *stanza) reset() {
	*st = stanza{
		body:    st.body[:0],
		text:    st.text[:0],
		jid:     st.jid[:0],
		sasl:    st.sasl[:0],
		scratch: st.scratch[:0],
		fwdBody: st.fwdBody[:0],
		rsmLast: st.rsmLast[:0],
	}
}

// addSID keeps a stanza-id, past maxSIDs none.
func (st *stanza) addSID(attrs []xml.Attr) {
	if st.nsids < maxSIDs {
		st.sids[st.nsids] = stanzaID{by: attr(attrs, "by"), id: attr(attrs, "id")}
		st.nsids++
	}
}

// sidBy returns the id the archive by gave the message, or "".
func (st *stanza) sidBy(by string) string {
	for _, s := range st.sids[:st.nsids] {
		if s.id != "" && strings.EqualFold(s.by, by) {
			return s.id
		}
	}
	return ""
}

// stanzaPool holds parse states. A session takes one per frame, so that an
// idle session holds none.
var stanzaPool = sync.Pool{New: func() any { return new(stanza) }}

// capture says what the text of the element being parsed is collected into,
// or which of its children matter.
type capture uint8

const (
	capNone capture = iota
	capBody
	capError         // a stanza's <error/>: its children name the condition
	capErrorText     // <error><text/></error>
	capStreamErrText // <stream:error><text/></stream:error>, SASL and SM failure text
	capMUCUser       // presence <x xmlns=muc#user/>
	capBind          // iq <bind/>
	capJID           // <bind><jid/></bind>
	capMechanisms    // features <mechanisms/>
	capMechanism     // <mechanisms><mechanism/></mechanisms>
	capSASL          // the text of <challenge/> or <success/>
	capWrap          // message <result/> (MAM) or <sent/>, <received/> (carbons)
	capForwarded     // <forwarded/> in one of those
	capFwdMessage    // the <message/> forwarded
	capFwdBody       // its <body/>
	capFin           // iq <fin/> (MAM)
	capRSM           // <fin><set/></fin>
	capRSMLast       // <set><last/></set>
)

// topKind classifies a top-level element by its expanded name.
func topKind(n xml.Name) kind {
	switch n.Space {
	case nsClient:
		switch n.Local {
		case "message":
			return kindMessage
		case "presence":
			return kindPresence
		case "iq":
			return kindIQ
		}
	case nsFraming:
		switch n.Local {
		case "open":
			return kindOpen
		case "close":
			return kindClose
		}
	// A server that leaves the stream prefix undeclared in the frame
	// still means the streams namespace.
	case nsStreams, "stream":
		switch n.Local {
		case "features":
			return kindFeatures
		case "error":
			return kindStreamError
		}
	case nsSASL:
		switch n.Local {
		case "success":
			return kindSuccess
		case "failure":
			return kindFailure
		case "challenge":
			return kindChallenge
		}
	case nsSM:
		switch n.Local {
		case "enabled":
			return kindEnabled
		case "failed":
			return kindFailed
		case "resumed":
			return kindResumed
		case "r":
			return kindR
		case "a":
			return kindA
		}
	}
	return kindOther
}

// parseFrame parses every top-level element of frame into st and calls fn
// for each, in order. It stops at the first error, fn's or the parser's.
func parseFrame(frame []byte, st *stanza, fn func(*stanza) error) error {
	d := xml.NewDecoder(bytes.NewReader(frame))
	// Strict, and with no Entity map and no CharsetReader: only XML's five
	// predefined entities and character references are accepted, and a
	// declared encoding other than UTF-8 fails.
	d.Strict = true
	var (
		caps     [maxDepth + 1]capture
		depth    int
		elements int
		start    int64
	)
	for {
		off := d.InputOffset()
		tok, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("xml at byte %d: %w", off, err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if elements++; elements > maxElements {
				return errTooMany
			}
			if depth++; depth > maxDepth {
				return errTooDeep
			}
			if len(t.Attr) > maxAttrs {
				return errTooManyAttr
			}
			if depth == 1 {
				st.reset()
				start = off
				st.kind = topKind(t.Name)
				st.client = t.Name.Space == nsClient
				st.topAttrs(t.Attr)
				caps[1] = capNone
				if st.kind == kindChallenge || st.kind == kindSuccess {
					caps[1] = capSASL
				}
				continue
			}
			caps[depth] = st.child(depth, caps[depth-1], t)
		case xml.EndElement:
			if caps[depth] == capMechanism {
				switch string(st.scratch) {
				case "PLAIN":
					st.mechPlain = true
				case "SCRAM-SHA-1":
					st.mechSCRAM = true
				}
			}
			if depth--; depth == 0 {
				st.raw = frame[start:d.InputOffset()]
				if err := fn(st); err != nil {
					return err
				}
			}
		case xml.CharData:
			if depth == 0 {
				if len(bytes.TrimLeft(t, " \t\r\n")) > 0 {
					return errStrayText
				}
				continue
			}
			switch caps[depth] {
			case capBody:
				st.body = append(st.body, t...)
			case capErrorText, capStreamErrText:
				st.text = append(st.text, t...)
			case capJID:
				st.jid = append(st.jid, t...)
			case capMechanism:
				st.scratch = append(st.scratch, t...)
			case capSASL:
				st.sasl = append(st.sasl, t...)
			case capFwdBody:
				st.fwdBody = append(st.fwdBody, t...)
			case capRSMLast:
				st.rsmLast = append(st.rsmLast, t...)
			}
		case xml.ProcInst, xml.Directive:
			return errDirective
		}
	}
}

// topAttrs reads the attributes of a top-level element.
func (st *stanza) topAttrs(attrs []xml.Attr) {
	for _, a := range attrs {
		if a.Name.Space != "" {
			continue
		}
		switch a.Name.Local {
		case "type":
			st.typ = a.Value
		case "id":
			st.id = a.Value
			if st.kind == kindEnabled {
				st.smID = a.Value
			}
		case "from":
			st.from = a.Value
		case "h":
			if h, err := strconv.ParseUint(a.Value, 10, 32); err == nil {
				st.h, st.hasH = uint32(h), true
			}
		}
	}
}

// child notes a child element at depth (2 or more) under an element whose
// capture is parent, and returns the child's own capture.
func (st *stanza) child(depth int, parent capture, t xml.StartElement) capture {
	if depth == 2 {
		return st.topChild(t)
	}
	return st.nestedChild(parent, t)
}

// topChild notes a child of the stanza or stream element itself.
func (st *stanza) topChild(t xml.StartElement) capture {
	n := t.Name
	switch st.kind {
	case kindMessage, kindPresence, kindIQ:
		return st.stanzaChild(t)
	case kindFeatures:
		switch {
		case n.Space == nsSASL && n.Local == "mechanisms":
			return capMechanisms
		case n.Space == nsBind && n.Local == "bind":
			st.featBind = true
		case n.Space == nsSM && n.Local == "sm":
			st.featSM = true
		case n.Space == nsRegisterFeature && n.Local == "register":
			st.featRegister = true
		}
	case kindStreamError:
		if n.Space == nsStreamErrors {
			if n.Local == "text" {
				return capStreamErrText
			}
			if st.cond == "" {
				st.cond = n.Local
			}
		}
	case kindFailure:
		if n.Space == nsSASL {
			if n.Local == "text" {
				return capStreamErrText
			}
			if st.cond == "" {
				st.cond = n.Local
			}
		}
	case kindFailed:
		if n.Space == nsStanzaErrors && st.cond == "" {
			st.cond = n.Local
		}
	}
	return capNone
}

// stanzaChild notes a child of a message, presence or iq.
func (st *stanza) stanzaChild(t xml.StartElement) capture {
	n := t.Name
	switch {
	case n.Space == nsClient && n.Local == "error":
		return capError
	case st.kind == kindMessage && n.Space == nsClient && n.Local == "body":
		st.hasBody = true
		return capBody
	case st.kind == kindMessage && n.Space == nsDelay && n.Local == "delay":
		st.delayed = true
		if bare, _ := splitJID(st.from); bare != "" && strings.EqualFold(attr(t.Attr, "from"), bare) {
			st.history = true
		}
	case st.kind == kindPresence && n.Space == nsMUCUser && n.Local == "x":
		return capMUCUser
	case st.kind == kindIQ && n.Space == nsBind && n.Local == "bind":
		return capBind
	case st.kind == kindIQ && n.Space == nsPing && n.Local == "ping":
		st.ping = true
	case st.kind == kindIQ && n.Space == nsMAM && n.Local == "fin":
		st.fin, st.finComplete = true, attr(t.Attr, "complete") == "true"
		return capFin
	case st.kind == kindMessage && n.Space == nsStanzaID && n.Local == "stanza-id":
		st.addSID(t.Attr)
	case st.kind == kindMessage && st.wrap == wrapNone && n.Space == nsMAM && n.Local == "result":
		st.wrap, st.mamQuery, st.mamID = wrapResult, attr(t.Attr, "queryid"), attr(t.Attr, "id")
		return capWrap
	case st.kind == kindMessage && st.wrap == wrapNone && n.Space == nsCarbons && (n.Local == "sent" || n.Local == "received"):
		st.wrap = wrapSent
		if n.Local == "received" {
			st.wrap = wrapReceived
		}
		return capWrap
	}
	return capNone
}

// nestedChild notes an element deeper than a stanza's child, under one
// whose capture is parent.
func (st *stanza) nestedChild(parent capture, t xml.StartElement) capture {
	n := t.Name
	switch parent {
	case capError:
		if n.Space == nsStanzaErrors {
			if n.Local == "text" {
				return capErrorText
			}
			if st.cond == "" {
				st.cond = n.Local
			}
		}
	case capMUCUser:
		if n.Local == "status" && n.Space == nsMUCUser {
			switch attr(t.Attr, "code") {
			case "110":
				st.self = true
			case "201":
				st.created = true
			// Banned, kicked, removed by an affiliation change, by
			// members-only, by a system shutdown, by a technical error.
			case "301", "307", "321", "322", "332", "333":
				st.removed = true
			}
		}
	case capBind:
		if n.Space == nsBind && n.Local == "jid" {
			return capJID
		}
	case capWrap:
		if n.Space == nsForward && n.Local == "forwarded" {
			return capForwarded
		}
	case capForwarded:
		// One message per <forwarded/> (XEP-0297); a second is not read.
		if n.Space == nsClient && n.Local == "message" && !st.fwd {
			st.fwd = true
			st.fwdFrom, st.fwdType, st.fwdID = attr(t.Attr, "from"), attr(t.Attr, "type"), attr(t.Attr, "id")
			return capFwdMessage
		}
	case capFwdMessage:
		switch {
		case n.Space == nsClient && n.Local == "body" && !st.fwdHasBody:
			st.fwdHasBody = true
			return capFwdBody
		case n.Space == nsStanzaID && n.Local == "stanza-id":
			// A carbon's archive id is on the message it forwards.
			st.addSID(t.Attr)
		}
	case capFin:
		if n.Space == nsRSM && n.Local == "set" {
			return capRSM
		}
	case capRSM:
		if n.Space == nsRSM && n.Local == "last" {
			st.rsmLast = st.rsmLast[:0]
			return capRSMLast
		}
	case capMechanisms:
		if n.Space == nsSASL && n.Local == "mechanism" {
			st.scratch = st.scratch[:0]
			return capMechanism
		}
	}
	return capNone
}

// attr returns the value of the unqualified attribute name, or "".
func attr(attrs []xml.Attr, name string) string {
	for _, a := range attrs {
		if a.Name.Space == "" && a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// errorText describes the error st carries: condition, then text.
func (st *stanza) errorText() string {
	switch {
	case st.cond == "" && len(st.text) == 0:
		return "undefined-condition"
	case len(st.text) == 0:
		return st.cond
	case st.cond == "":
		return string(st.text)
	}
	return st.cond + ": " + string(st.text)
}

// splitJID splits a JID into its bare part and resource.
func splitJID(j string) (bare, resource string) {
	if i := strings.IndexByte(j, '/'); i >= 0 {
		return j[:i], j[i+1:]
	}
	return j, ""
}

// localpart returns the part of a JID before the @, or "" if it has none.
func localpart(j string) string {
	bare, _ := splitJID(j)
	if i := strings.IndexByte(bare, '@'); i >= 0 {
		return bare[:i]
	}
	return ""
}

// Encoders. Everything the driver writes is built by appending to a byte
// slice; every top-level stanza carries xmlns="jabber:client" (Prosody ends
// the stream on one without it: its WebSocket framing strips the stream's
// default namespace).
