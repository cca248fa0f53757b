package jsonws

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// The decoder reads a frame once, front to back, and keeps only the values
// at the paths the mapping names: every path of every rule is compiled
// into one trie at load, and a frame's walk follows the trie, skipping
// (while still checking the grammar of) everything else. Strings are
// unescaped in place, so a steady-state frame costs no allocation, and the
// rules then compare slices of the frame.

// Framings of a WebSocket text frame.
const (
	framingObject   = "object"
	framingLines    = "lines"
	framingEngineIO = "engineio"
)

// Engine.IO v4 packet types, and the Socket.IO v5 packets inside its
// message packet, as the virtual path $type names them.
var (
	eioTypes = map[byte]string{'0': "open", '1': "close", '2': "ping", '3': "pong", '4': "message", '5': "upgrade", '6': "noop"}
	sioTypes = map[byte]string{'0': "connect", '1': "disconnect", '2': "event", '3': "ack", '4': "connect_error", '5': "binary_event", '6': "binary_ack"}
)

// pathRoot is the path of the whole message.
const pathRoot = "."

// Virtual paths of the Engine.IO framing.
const (
	pathType = "$type"
	pathAck  = "$id"
)

// node is one step of a path: an object key or an array index.
type node struct {
	key  string
	idx  int // >= 0 for an array index
	slot int // the slot of the path ending here, or -1
	kids []*node
	// byKey indexes the kids by key when they are many (index).
	byKey map[string]*node
}

// kid returns n's kid of key. A node of many keys looks them up in a
// map, which costs one hash; a few are compared in turn.
func (n *node) kid(key []byte) *node {
	if n.byKey != nil {
		return n.byKey[string(key)]
	}
	for _, k := range n.kids {
		if k.idx < 0 && k.key == string(key) {
			return k
		}
	}
	return nil
}

// index makes the lookup maps of n and its kids, once every path is in.
func (n *node) index() {
	keys := 0
	for _, k := range n.kids {
		if k.idx < 0 {
			keys++
		}
		k.index()
	}
	if keys > 4 {
		n.byKey = make(map[string]*node, keys)
		for _, k := range n.kids {
			if k.idx < 0 {
				n.byKey[k.key] = k
			}
		}
	}
}

// decoder is a mapping's compiled paths.
type decoder struct {
	framing string
	root    node
	paths   []string // by slot
	// typeSlot and ackSlot are the virtual paths' slots, -1 if unused.
	typeSlot, ackSlot int
}

func newDecoder(framing string) *decoder {
	return &decoder{framing: framing, root: node{slot: -1, idx: -1}, typeSlot: -1, ackSlot: -1}
}

// path returns the slot of path p, adding it.
func (d *decoder) path(p string) (int, error) {
	if p == "" {
		return -1, errors.New("empty path")
	}
	if p == pathRoot {
		// The message itself: a rule of {".": "{}"} matches a frame
		// that is exactly an empty object (Centrifugo's ping).
		if d.root.slot < 0 {
			d.root.slot = d.addSlot(p)
		}
		return d.root.slot, nil
	}
	if strings.HasPrefix(p, "$") {
		if d.framing != framingEngineIO {
			return -1, fmt.Errorf("path %s: $ paths are Engine.IO's (framing engineio)", p)
		}
		switch p {
		case pathType:
			if d.typeSlot < 0 {
				d.typeSlot = d.addSlot(p)
			}
			return d.typeSlot, nil
		case pathAck:
			if d.ackSlot < 0 {
				d.ackSlot = d.addSlot(p)
			}
			return d.ackSlot, nil
		}
		return -1, fmt.Errorf("path %s: the virtual paths are %s and %s", p, pathType, pathAck)
	}
	n := &d.root
	for _, part := range strings.Split(p, ".") {
		if part == "" {
			return -1, fmt.Errorf("path %q: empty part", p)
		}
		idx := -1
		if i, err := strconv.Atoi(part); err == nil && i >= 0 && part == strconv.Itoa(i) {
			idx = i
		}
		var next *node
		for _, k := range n.kids {
			if k.idx == idx && (idx >= 0 || k.key == part) {
				next = k
			}
		}
		if next == nil {
			next = &node{key: part, idx: idx, slot: -1}
			n.kids = append(n.kids, next)
		}
		n = next
	}
	if n.slot < 0 {
		n.slot = d.addSlot(p)
	}
	return n.slot, nil
}

func (d *decoder) addSlot(p string) int {
	d.paths = append(d.paths, p)
	return len(d.paths) - 1
}

// Kinds of a decoded value.
const (
	kindNone byte = iota
	kindString
	kindNumber
	kindBool
	kindNull
	kindObject
	kindArray
)

// value is what a frame holds at one path: a string's unescaped content,
// or the JSON text of anything else. It aliases the frame.
type value struct {
	b    []byte
	kind byte
}

// present reports whether the path holds a value other than null.
func (v value) present() bool { return v.kind != kindNone && v.kind != kindNull }

// uint reads the value as a whole number, from a number or a string of
// digits.
func (v value) uint() (uint64, bool) {
	if v.kind != kindNumber && v.kind != kindString {
		return 0, false
	}
	return jsonscan.ParseUint(v.b)
}

// msg is one decoded message: its values by slot.
type msg struct {
	vals []value
	// raw is the message's JSON, for traces; it aliases the frame and
	// strings in it may have been unescaped in place.
	raw []byte
	// start and end are where the message is in its frame.
	start, end int
}

func (d *decoder) newMsg() *msg { return &msg{vals: make([]value, len(d.paths))} }

func (m *msg) reset() {
	clear(m.vals)
	m.raw, m.start, m.end = nil, 0, 0
}

// each calls fn for every message of frame b, decoded into m; an error
// from fn stops it. A frame that is not what the framing says is an error.
func (d *decoder) each(b []byte, m *msg, fn func(*msg) error) error {
	switch d.framing {
	case framingEngineIO:
		if err := d.engineIO(b, m); err != nil {
			return err
		}
		m.start, m.end = 0, len(b)
		return fn(m)
	case framingLines:
		p := jsonscan.Scanner{B: b}
		for p.More() {
			m.reset()
			start := p.I
			if err := d.walk(&p, &d.root, m, 0); err != nil {
				return err
			}
			m.raw, m.start, m.end = b[start:p.I], start, p.I
			if err := fn(m); err != nil {
				return err
			}
		}
		return nil
	}
	m.reset()
	p := jsonscan.Scanner{B: b}
	p.WS()
	if err := d.walk(&p, &d.root, m, 0); err != nil {
		return err
	}
	if err := p.End(); err != nil {
		return err
	}
	m.raw, m.start, m.end = b, 0, len(b)
	return fn(m)
}

// engineIO decodes an Engine.IO v4 packet: its type, and for a Socket.IO
// packet its ack id and JSON payload. Only the main namespace is read.
func (d *decoder) engineIO(b []byte, m *msg) error {
	m.reset()
	if len(b) == 0 {
		return errors.New("empty Engine.IO packet")
	}
	typ, ok := eioTypes[b[0]]
	if !ok {
		return fmt.Errorf("unknown Engine.IO packet type %q", b[0])
	}
	rest := b[1:]
	if b[0] == '4' {
		if len(rest) == 0 {
			return errors.New("empty Socket.IO packet")
		}
		if typ, ok = sioTypes[rest[0]]; !ok {
			return fmt.Errorf("unknown Socket.IO packet type %q", rest[0])
		}
		if rest[0] == '5' || rest[0] == '6' {
			return errors.New("binary Socket.IO packet: a jsonws mapping reads JSON payloads only")
		}
		rest = rest[1:]
		if len(rest) > 0 && rest[0] == '/' {
			i := 0
			for i < len(rest) && rest[i] != ',' {
				i++
			}
			ns := rest[:i]
			if i < len(rest) {
				i++
			}
			rest = rest[i:]
			if string(ns) != "/" {
				// Another namespace's traffic is not ours.
				if d.typeSlot >= 0 {
					m.vals[d.typeSlot] = value{b: []byte("other_namespace"), kind: kindString}
				}
				return nil
			}
		}
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i > 0 && d.ackSlot >= 0 {
			m.vals[d.ackSlot] = value{b: rest[:i], kind: kindNumber}
		}
		rest = rest[i:]
	}
	if d.typeSlot >= 0 {
		m.vals[d.typeSlot] = value{b: typeName(typ), kind: kindString}
	}
	if b[0] != '0' && b[0] != '4' {
		// ping and pong may carry a probe string; nothing to read.
		return nil
	}
	p := jsonscan.Scanner{B: rest}
	if !p.More() {
		return nil
	}
	start := p.I
	if err := d.walk(&p, &d.root, m, 0); err != nil {
		return err
	}
	if err := p.End(); err != nil {
		return err
	}
	m.raw = rest[start:p.I]
	return nil
}

// typeNames holds the $type values as byte slices, made once.
var typeNames = func() map[string][]byte {
	out := map[string][]byte{}
	for _, m := range []map[byte]string{eioTypes, sioTypes} {
		for _, n := range m {
			out[n] = []byte(n)
		}
	}
	return out
}()

func typeName(s string) []byte { return typeNames[s] }

// walk reads one value at n, recording it if n ends a path and descending
// into the kids n has.
func (d *decoder) walk(p *jsonscan.Scanner, n *node, m *msg, depth int) error {
	if depth > jsonscan.MaxDepth {
		return p.Errorf("nesting too deep")
	}
	p.WS()
	if p.I >= len(p.B) {
		return jsonscan.ErrEOF
	}
	start := p.I
	c := p.B[p.I]
	switch {
	case c == '"':
		s, err := p.Str()
		if err != nil {
			return err
		}
		if n.slot >= 0 {
			m.vals[n.slot] = value{b: s, kind: kindString}
		}
		return nil
	case c == '{' && len(n.kids) > 0:
		p.I++
		for first := true; ; first = false {
			key, ok, err := p.Field(first)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			kid := n.kid(key)
			if kid == nil {
				if err := p.Skip(depth + 1); err != nil {
					return err
				}
				continue
			}
			if err := d.walk(p, kid, m, depth+1); err != nil {
				return err
			}
		}
		if n.slot >= 0 {
			m.vals[n.slot] = value{b: p.B[start:p.I], kind: kindObject}
		}
		return nil
	case c == '[' && len(n.kids) > 0:
		p.I++
		p.WS()
		if !p.Eat(']') {
			for i := 0; ; i++ {
				var kid *node
				for _, k := range n.kids {
					if k.idx == i {
						kid = k
						break
					}
				}
				var err error
				if kid == nil {
					p.WS()
					err = p.Skip(depth + 1)
				} else {
					err = d.walk(p, kid, m, depth+1)
				}
				if err != nil {
					return err
				}
				p.WS()
				if p.Eat(',') {
					continue
				}
				if p.Eat(']') {
					break
				}
				return p.Errorf("expected ',' or ']'")
			}
		}
		if n.slot >= 0 {
			m.vals[n.slot] = value{b: p.B[start:p.I], kind: kindArray}
		}
		return nil
	}
	if err := p.Skip(depth); err != nil {
		return err
	}
	if n.slot >= 0 {
		m.vals[n.slot] = value{b: p.B[start:p.I], kind: kindOf(c)}
	}
	return nil
}

func kindOf(c byte) byte {
	switch c {
	case '{':
		return kindObject
	case '[':
		return kindArray
	case 't', 'f':
		return kindBool
	case 'n':
		return kindNull
	}
	return kindNumber
}

// eachElem decodes each element of the JSON array arr into m and calls fn
// with it: a list of objects inside a message (a history answer's
// publications), which d's paths read from each element.
func (d *decoder) eachElem(arr []byte, m *msg, fn func(*msg)) error {
	p := jsonscan.Scanner{B: arr}
	p.WS()
	if !p.Eat('[') {
		return p.Errorf("expected '['")
	}
	p.WS()
	if p.Eat(']') {
		return nil
	}
	for {
		m.reset()
		start := p.I
		if err := d.walk(&p, &d.root, m, 0); err != nil {
			return err
		}
		m.raw, m.start, m.end = arr[start:p.I], start, p.I
		fn(m)
		p.WS()
		if p.Eat(']') {
			return nil
		}
		if !p.Eat(',') {
			return p.Errorf("expected ',' or ']'")
		}
	}
}
