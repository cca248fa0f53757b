package jsonws

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// A template is the text of one frame with actions in it: {{.Var}},
// {{.Entity.attr}} and {{base64 ARG...}}. It is compiled once, at load,
// into literal runs and references, and rendered by appending to a buffer,
// which costs no allocation once the buffer has grown: text/template would
// reflect over its data on every send.
//
// Escaping follows the JSON around the action, as html/template's follows
// HTML: inside a string literal a value is escaped as the string's content;
// outside one a string is written as a quoted JSON string, a number as its
// digits and a list as an array of strings. A mapping cannot produce broken
// JSON by putting a name with a quote in it where a string goes.
type template struct {
	src   string
	parts []part
}

// part is a literal run or one action.
type part struct {
	lit []byte
	// act is set for an action.
	act *action
}

// action is one {{...}}: a reference, or a function of references and
// literals.
type action struct {
	fn   string // "" or "base64"
	args []arg
	// inString says the action sits inside a JSON string literal.
	inString bool
}

// arg is a reference or a literal.
type arg struct {
	lit    string
	isLit  bool
	v      varID
	attr   string
	hasRef bool
}

// varID names a variable a template may use.
type varID int

const (
	varID_ varID = iota
	varUser
	varDevice
	varToken
	varPassword
	varTo
	varGroup
	varBody
	varPeer
	varMembers
	varConv
	varAfter
	varSince
	varBefore
	varLimit
	nVars
)

// varNames are the variables' names as templates spell them.
var varNames = [nVars]string{
	varID_: "ID", varUser: "User", varDevice: "Device", varToken: "Token", varPassword: "Password",
	varTo: "To", varGroup: "Group", varBody: "Body", varPeer: "Peer", varMembers: "Members",
	varConv: "Conv", varAfter: "After", varSince: "Since", varBefore: "Before", varLimit: "Limit",
}

// entity reports whether v names a user, a group or a conversation,
// which have attributes.
func (v varID) entity() bool {
	return v == varUser || v == varTo || v == varPeer || v == varGroup || v == varConv
}

// site is where a template is used: the variables it may refer to.
type site []varID

// Every template may use these.
var common = site{varID_, varUser, varDevice, varToken, varPassword}

// The sites of the mapping. A template that is no request of imcanary's
// has no .ID, which would render 0: an answer to the server's ping, a
// token's claims, a conversation's name.
var (
	siteKeepalive  = site{varUser, varDevice, varToken, varPassword}
	siteClaims     = site{varUser, varDevice}
	siteDirectConv = site{varUser, varDevice, varPeer}
	siteGroupConv  = site{varUser, varDevice, varGroup}
	siteLogin      = common
	siteDirect     = slices.Concat(common, site{varPeer})
	siteGroupSub   = slices.Concat(common, site{varGroup})
	siteCreate     = slices.Concat(common, site{varGroup, varMembers})
	siteSendDM     = slices.Concat(common, site{varTo, varBody})
	siteSendGroup  = slices.Concat(common, site{varGroup, varBody})
	siteFetch      = slices.Concat(common, site{varConv, varAfter, varSince, varBefore, varLimit})
)

// attrSets are the attribute names a mapping captures, for checking
// .User.x and .Group.x; nil skips the check (a template parsed before the
// captures are known is checked again after).
type attrSets struct {
	user, group, conv map[string]bool
}

// parseTemplate compiles src for use at site s.
func parseTemplate(src string, s site, attrs attrSets) (*template, error) {
	t := &template{src: src}
	inString := false
	rest := src
	for rest != "" {
		i := strings.Index(rest, "{{")
		if i < 0 {
			inString = scanQuotes(rest, inString)
			t.parts = append(t.parts, part{lit: []byte(rest)})
			break
		}
		if i > 0 {
			inString = scanQuotes(rest[:i], inString)
			t.parts = append(t.parts, part{lit: []byte(rest[:i])})
		}
		j := strings.Index(rest[i:], "}}")
		if j < 0 {
			return nil, fmt.Errorf("unclosed action %q", rest[i:])
		}
		if strings.Contains(rest[i+2:i+j], "{{") {
			return nil, fmt.Errorf("unclosed action %q", rest[i:i+strings.Index(rest[i+2:], "{{")+2])
		}
		a, err := parseAction(strings.TrimSpace(rest[i+2:i+j]), s, attrs)
		if err != nil {
			return nil, err
		}
		a.inString = inString
		t.parts = append(t.parts, part{act: a})
		rest = rest[i+j+2:]
	}
	return t, nil
}

// scanQuotes returns whether a JSON string is open after lit, given
// whether one was before it.
func scanQuotes(lit string, in bool) bool {
	for i := 0; i < len(lit); i++ {
		switch {
		case in && lit[i] == '\\':
			i++
		case lit[i] == '"':
			in = !in
		}
	}
	return in
}

// parseAction compiles what is between {{ and }}.
func parseAction(s string, st site, attrs attrSets) (*action, error) {
	if s == "" {
		return nil, errors.New("empty action {{}}")
	}
	words, err := splitWords(s)
	if err != nil {
		return nil, err
	}
	a := &action{}
	if !strings.HasPrefix(words[0], ".") {
		switch words[0] {
		case "base64":
			if len(words) == 1 {
				return nil, errors.New("base64 needs an argument")
			}
		case "pair":
			if len(words) != 4 {
				return nil, errors.New(`pair takes two values and a separator: {{pair .User .Peer ":"}}`)
			}
		default:
			return nil, fmt.Errorf("unknown function %q: the functions are base64 and pair", words[0])
		}
		a.fn, words = words[0], words[1:]
	} else if len(words) > 1 {
		return nil, fmt.Errorf("action {{%s}}: one variable per action, or a function", s)
	}
	for _, w := range words {
		if strings.HasPrefix(w, `"`) {
			lit, err := strconv.Unquote(w)
			if err != nil {
				return nil, fmt.Errorf("literal %s: %w", w, err)
			}
			a.args = append(a.args, arg{lit: lit, isLit: true})
			continue
		}
		r, err := parseRef(w, st, attrs)
		if err != nil {
			return nil, err
		}
		a.args = append(a.args, r)
	}
	return a, nil
}

// splitWords splits an action on spaces, keeping quoted literals whole.
func splitWords(s string) ([]string, error) {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := 1
			for end < len(s) && s[end] != '"' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) {
				return nil, fmt.Errorf("unterminated literal %s", s)
			}
			out = append(out, s[:end+1])
			s = s[end+1:]
			continue
		}
		i := strings.IndexAny(s, " \t")
		if i < 0 {
			i = len(s)
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out, nil
}

// parseRef compiles .Var or .Entity.attr.
func parseRef(w string, st site, attrs attrSets) (arg, error) {
	if !strings.HasPrefix(w, ".") {
		return arg{}, fmt.Errorf("%q: a variable starts with '.'", w)
	}
	name, attr, hasAttr := strings.Cut(w[1:], ".")
	v := varID(-1)
	for i, n := range varNames {
		if n == name {
			v = varID(i)
		}
	}
	if v < 0 || !slices.Contains(st, v) {
		names := make([]string, len(st))
		for i, x := range st {
			names[i] = "." + varNames[x]
		}
		err := fmt.Errorf("unknown variable .%s", name)
		if near := config.Closest("."+name, names); near != "" {
			err = fmt.Errorf("%w: did you mean %s?", err, near)
		}
		return arg{}, fmt.Errorf("%w (here: %s)", err, strings.Join(names, " "))
	}
	if !hasAttr {
		return arg{v: v, hasRef: true}, nil
	}
	if !v.entity() {
		return arg{}, fmt.Errorf(".%s has no attributes (.%s)", name, w[1:])
	}
	set, what := attrs.user, "a login step"
	switch v {
	case varGroup:
		set, what = attrs.group, "groups.create"
	case varConv:
		set, what = attrs.conv, "a subscribe step"
	}
	if set != nil && !set[attr] {
		return arg{}, fmt.Errorf("unknown attribute %s: %s captures %s", w, what, listAttrs(set))
	}
	return arg{v: v, attr: attr, hasRef: true}, nil
}

func listAttrs(set map[string]bool) string {
	if len(set) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(mapsKeys(set)), ", ")
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// env is what a template is rendered with.
type env struct {
	id       uint64
	user     string
	device   int
	token    string
	password string
	to       string
	group    string
	peer     string
	body     []byte
	members  []string
	conv     string
	after    uint64
	limit    uint64
	// resume says a subscribe step sends its resume template: the
	// device has a place in the conversation, after.
	resume bool
	// capGroup, if set, is the group that a step's captures describe
	// (groups.create); otherwise they are the session user's.
	capGroup string
	// name, if set, spells a user's name as the server knows it.
	name func(string) string
	// attr looks up an attribute of a user (who) or a group.
	attr func(group bool, who, name string) (string, bool)
	// convAttr looks up what a subscribe step captured of a
	// conversation, kept with the device's place in it; nil where the
	// device keeps none (catch-up off).
	convAttr func(conv, name string) (string, bool)
}

// errNoAttr is a reference to an attribute not captured (yet): a user
// whose login never ran, a group never created.
var errNoAttr = errors.New("not known")

// render appends t rendered with e to dst.
func (t *template) render(dst []byte, e *env) ([]byte, error) {
	for i := range t.parts {
		p := &t.parts[i]
		if p.act == nil {
			dst = append(dst, p.lit...)
			continue
		}
		var err error
		if dst, err = p.act.render(dst, e); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (a *action) render(dst []byte, e *env) ([]byte, error) {
	if a.fn == "pair" {
		// The two values sorted and joined: a direct conversation's
		// name that both its users give it.
		var v [3]string
		for i, g := range a.args {
			if g.isLit {
				v[i] = g.lit
				continue
			}
			s, n, isNum, err := g.value(e)
			if err != nil {
				return dst, err
			}
			if isNum {
				s = strconv.FormatUint(n, 10)
			}
			v[i] = s
		}
		x, y := v[0], v[1]
		if y < x {
			x, y = y, x
		}
		if !a.inString {
			dst = append(dst, '"')
		}
		dst = jsonscan.AppendEscaped(dst, x)
		dst = jsonscan.AppendEscaped(dst, v[2])
		dst = jsonscan.AppendEscaped(dst, y)
		if !a.inString {
			dst = append(dst, '"')
		}
		return dst, nil
	}
	if a.fn == "base64" {
		var raw []byte
		for _, g := range a.args {
			if g.isLit {
				raw = append(raw, g.lit...)
				continue
			}
			s, n, isNum, err := g.value(e)
			if err != nil {
				return dst, err
			}
			if isNum {
				raw = strconv.AppendUint(raw, n, 10)
			} else {
				raw = append(raw, s...)
			}
		}
		enc := base64.StdEncoding.EncodedLen(len(raw))
		dst = slices.Grow(dst, enc+2)
		if !a.inString {
			dst = append(dst, '"')
		}
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		if !a.inString {
			dst = append(dst, '"')
		}
		return dst, nil
	}
	g := a.args[0]
	if g.v == varMembers && g.attr == "" {
		if a.inString {
			return dst, errors.New(".Members is a list: it cannot go inside a string")
		}
		dst = append(dst, '[')
		for i, m := range e.members {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsonscan.AppendString(dst, e.serverName(m))
		}
		return append(dst, ']'), nil
	}
	if g.v == varBody {
		if a.inString {
			return jsonscan.AppendEscaped(dst, e.body), nil
		}
		return jsonscan.AppendString(dst, e.body), nil
	}
	s, n, isNum, err := g.value(e)
	if err != nil {
		return dst, err
	}
	switch {
	case isNum:
		return strconv.AppendUint(dst, n, 10), nil
	case a.inString:
		return jsonscan.AppendEscaped(dst, s), nil
	}
	return jsonscan.AppendString(dst, s), nil
}

// value returns a reference's value: a string, or a number (isNum).
func (g arg) value(e *env) (s string, n uint64, isNum bool, err error) {
	if g.attr != "" && g.v == varConv {
		if e.convAttr != nil {
			if v, ok := e.convAttr(e.conv, g.attr); ok {
				return v, 0, false, nil
			}
		}
		return "", 0, false, fmt.Errorf(".Conv.%s of %s: %w", g.attr, e.conv, errNoAttr)
	}
	if g.attr != "" {
		var who string
		switch g.v {
		case varUser:
			who = e.user
		case varTo:
			who = e.to
		case varPeer:
			who = e.peer
		case varGroup:
			who = e.group
		}
		v, ok := e.attr(g.v == varGroup, who, g.attr)
		if !ok {
			return "", 0, false, fmt.Errorf(".%s.%s of %s: %w", varNames[g.v], g.attr, who, errNoAttr)
		}
		return v, 0, false, nil
	}
	var num uint64
	switch g.v {
	case varID_:
		num = e.id
	case varDevice:
		num = uint64(e.device)
	case varAfter:
		num = e.after
	case varSince:
		num = e.after + 1
	case varBefore:
		num = e.after + e.limit + 1
	case varLimit:
		num = e.limit
	case varUser:
		return e.serverName(e.user), 0, false, nil
	case varToken:
		return e.token, 0, false, nil
	case varPassword:
		return e.password, 0, false, nil
	case varTo:
		return e.serverName(e.to), 0, false, nil
	case varGroup:
		return e.group, 0, false, nil
	case varPeer:
		return e.serverName(e.peer), 0, false, nil
	case varConv:
		return e.conv, 0, false, nil
	case varBody:
		return string(e.body), 0, false, nil
	}
	return "", num, true, nil
}

// serverName returns user's name as the server knows it.
func (e *env) serverName(user string) string {
	if e.name == nil {
		return user
	}
	return e.name(user)
}
