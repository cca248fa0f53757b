package jsonws

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
)

// mapping is a compiled Config: every path in the decoder's trie, every
// template parsed, every rule checked. It is read-only once compiled and
// shared by every session of the driver.
type mapping struct {
	framing     string
	subprotocol string
	maxFrame    int64
	mirrorsOwn  bool
	dec         *decoder

	token tokenSpec

	login               []*step
	subDirect, subGroup *step
	create, join        *step

	sendDirect, sendGroup *template
	ack                   struct {
		match, success              *rule
		id, code, serverID, seq, cv int
	}
	delivery struct {
		match, group             *rule
		body, from, conv, seq    int
		hasSeq, hasConv, hasFrom bool
	}
	fetch *template
	limit int
	done  struct {
		match    *rule
		id, last int
		// list, if set, reads the fetched messages inside the answer.
		list *listDec
	}
	newest struct {
		send  *template
		reply *rule
		convs int
		// elem reads the conversation (slot 0) and seq (slot 1) of
		// each object of a list at convs; nil for an object of
		// conversation to seq.
		elem *decoder
	}
	names                 nameRules
	directConv, groupConv *template

	// ping is the application ping's template; pingWS is true for a
	// WebSocket ping. Neither: the server keeps the session alive.
	ping    *template
	pong    *rule
	pingWS  bool
	answers []answer

	closeCodes map[int]string
	errFrames  []errFrame
	ignore     []*rule

	userAttrs, groupAttrs map[string]bool
	// password says a template uses {{.Password}}.
	password bool
}

// step is one request and the reply it waits for.
type step struct {
	key          string
	name         string
	send         *template
	reply        *rule
	success      *rule
	unauthorized *rule
	reason       int // slot, or -1
	captures     []capture
	when         *rule // otherwise.when
	otherwise    []*step

	// A subscribe step's: the request sent instead of send where the
	// device has a place in the conversation (resume); the deliveries
	// its reply lists (list); the path of the conversation's newest seq
	// in its reply (newest, or -1). Its captures are the
	// conversation's (.Conv.x), kept with the device's place.
	resume *template
	list   *listDec
	newest int
	conv   bool
}

// listDec reads a list of deliveries inside a reply: the array's slot in
// the message, and each element's own decoder, whose slots are body, seq
// and from (-1 without).
type listDec struct {
	slot int
	dec  *decoder
	from int
}

// Slots of a list element's decoder.
const (
	elemBody = 0
	elemSeq  = 1
)

type capture struct {
	name string
	slot int
}

type answer struct {
	when *rule
	send *template
}

type errFrame struct {
	match  *rule
	reason string
	text   int
}

type tokenSpec struct {
	source    string
	algorithm string
	claims    map[string]claim
	ttl       time.Duration
	file      string
}

// claim is one JWT claim: a template for a string, or a value as it is.
type claim struct {
	tmpl *template
	v    any
}

// compiler collects the problems of a mapping, by key within the section.
type compiler struct {
	dec   *decoder
	attrs attrSets
	errs  []*config.ValidationError
	// noToken says token.source is none: {{.Token}} would render empty.
	noToken bool
}

func (c *compiler) fail(key string, v any, format string, args ...any) {
	c.errs = append(c.errs, &config.ValidationError{Key: key, Value: v, Err: fmt.Errorf(format, args...)})
}

// Empty reports whether cfg holds no mapping at all, as the section's
// default does: only a target that uses the protocol needs one.
func (cfg Config) Empty() bool {
	return len(cfg.Login) == 0 && cfg.Send.Direct == "" && cfg.Send.Group == "" && len(cfg.Delivery.Match) == 0
}

// compile checks cfg and compiles it. Its problems name keys within the
// section ("send.direct").
func compile(cfg Config) (*mapping, []*config.ValidationError) {
	c := &compiler{noToken: cfg.Token.Source == "none"}
	m := &mapping{subprotocol: cfg.Subprotocol, mirrorsOwn: cfg.MirrorsOwn, maxFrame: int64(cfg.MaxFrame)}
	switch cfg.Framing {
	case framingObject, framingLines, framingEngineIO:
		m.framing = cfg.Framing
	default:
		c.fail("framing", cfg.Framing, "must be object, lines or engineio")
		m.framing = framingObject
	}
	if cfg.MaxFrame < 512 || cfg.MaxFrame > 64<<20 {
		c.fail("max_frame", cfg.MaxFrame, "must be between 512 and %d bytes", 64<<20)
	}
	c.dec = newDecoder(m.framing)
	m.dec = c.dec

	// What the steps capture is known first, so that every template's
	// .User.x and .Group.x can be checked against it.
	c.attrs = attrSets{user: map[string]bool{}, group: map[string]bool{}, conv: map[string]bool{}}
	collectCaptures(cfg.Login, c.attrs.user)
	// A subscribe step captures what the server says of the
	// conversation (Centrifugo's epoch), for its later requests.
	collectCaptures([]any{map[string]any(cfg.Subscribe.Direct), map[string]any(cfg.Subscribe.Group)}, c.attrs.conv)
	collectCaptures([]any{map[string]any(cfg.Groups.Create)}, c.attrs.group)
	m.userAttrs, m.groupAttrs = c.attrs.user, c.attrs.group

	c.compileSteps(cfg, m)
	c.compileSend(cfg, m)
	c.compileDelivery(cfg, m)
	c.compileCatchUp(cfg, m)
	c.compileKeepalive(cfg, m)
	c.compileDisconnects(cfg, m)
	for i, raw := range cfg.Ignore {
		m.ignore = append(m.ignore, c.rule(fmt.Sprintf("ignore[%d]", i), raw, true))
	}
	m.password = m.usesPassword()
	m.dec.root.index()
	return m, c.errs
}

// compileSteps compiles the user names, the token and the steps: login,
// subscriptions and groups.
func (c *compiler) compileSteps(cfg Config, m *mapping) {
	m.names = c.names(cfg.UserName)
	m.token = c.token(cfg.Token)
	m.login = c.steps("login", cfg.Login, siteLogin)
	if len(cfg.Subscribe.Direct) > 0 {
		m.subDirect = c.subscribeStep("subscribe.direct", cfg.Subscribe.Direct, siteDirect, cfg.CatchUp.DirectConv, "catch_up.direct_conv")
	}
	if len(cfg.Subscribe.Group) > 0 {
		m.subGroup = c.subscribeStep("subscribe.group", cfg.Subscribe.Group, siteGroupSub, cfg.CatchUp.GroupConv, "catch_up.group_conv")
	}
	if len(cfg.Groups.Create) > 0 {
		m.create = c.step("groups.create", cfg.Groups.Create, siteCreate)
	}
	if len(cfg.Groups.Join) > 0 {
		m.join = c.step("groups.join", cfg.Groups.Join, siteGroupSub)
	}
}

// compileSend compiles the send templates and the ack's rule.
func (c *compiler) compileSend(cfg Config, m *mapping) {
	if cfg.Send.Direct == "" && cfg.Send.Group == "" {
		c.fail("send", nil, "needs a direct or a group template")
	}
	m.sendDirect = c.template("send.direct", cfg.Send.Direct, siteSendDM)
	m.sendGroup = c.template("send.group", cfg.Send.Group, siteSendGroup)
	for _, t := range []struct {
		key string
		t   *template
	}{{"send.direct", m.sendDirect}, {"send.group", m.sendGroup}} {
		if t.t != nil && !t.t.uses(varID_) {
			c.fail(t.key, t.t.src, "must hold {{.ID}}: the ack is matched to the send by it")
		}
		if t.t != nil && !t.t.uses(varBody) {
			c.fail(t.key, t.t.src, "must hold {{.Body}}: the probe body is what is checked on delivery")
		}
	}
	a := cfg.Send.Ack
	m.ack.match = c.rule("send.ack.match", a.Match, true)
	m.ack.id = c.path("send.ack.id", a.ID, true)
	if len(a.Success) > 0 {
		m.ack.success = c.rule("send.ack.success", a.Success, true)
	}
	m.ack.code = c.path("send.ack.code", a.Code, false)
	m.ack.serverID = c.path("send.ack.server_id", a.ServerID, false)
	m.ack.seq = c.path("send.ack.seq", a.Seq, false)
	m.ack.cv = c.path("send.ack.conv", a.Conv, false)
}

// compileDelivery compiles the delivery's rule and paths.
func (c *compiler) compileDelivery(cfg Config, m *mapping) {
	d := cfg.Delivery
	m.delivery.match = c.rule("delivery.match", d.Match, true)
	m.delivery.body = c.path("delivery.body", d.Body, true)
	m.delivery.from = c.path("delivery.from", d.From, false)
	m.delivery.conv = c.path("delivery.conv", d.Conv, false)
	m.delivery.seq = c.path("delivery.seq", d.Seq, false)
	m.delivery.hasSeq, m.delivery.hasConv, m.delivery.hasFrom = m.delivery.seq >= 0, m.delivery.conv >= 0, m.delivery.from >= 0
	if m.delivery.hasSeq && !m.delivery.hasConv {
		c.fail("delivery.conv", d.Conv, "is needed with delivery.seq: a sequence numbers one conversation")
	}
	if len(d.Group) > 0 {
		m.delivery.group = c.rule("delivery.group", d.Group, false)
	}
}

// compileCatchUp compiles catch-up: the fetch, its end, the conversations'
// names and the newest-seq request.
func (c *compiler) compileCatchUp(cfg Config, m *mapping) {
	cu := cfg.CatchUp
	if cu.Fetch != "" {
		m.fetch = c.template("catch_up.fetch", cu.Fetch, siteFetch)
		if !m.delivery.hasSeq {
			c.fail("catch_up.fetch", cu.Fetch, "needs delivery.seq and delivery.conv: catch-up fetches by the server's sequence")
		}
		if m.fetch != nil && !m.fetch.uses(varConv) {
			c.fail("catch_up.fetch", cu.Fetch, "must hold {{.Conv}}")
		}
		m.done.match = c.rule("catch_up.done.match", cu.Done.Match, true)
		m.done.id = c.path("catch_up.done.id", cu.Done.ID, true)
		m.done.last = c.path("catch_up.done.last", cu.Done.Last, false)
		if dl := cu.Done.Deliveries; dl != (ListConfig{}) {
			m.done.list = c.list("catch_up.done.deliveries", dl.List, map[string]any{"body": dl.Body, "seq": dl.Seq, "from": dl.From})
		}
	} else if cu.Done.Deliveries != (ListConfig{}) {
		c.fail("catch_up.done.deliveries", nil, "answers catch_up.fetch, which is not set")
	}
	for _, cv := range []struct {
		key, src string
		s        site
		dst      **template
	}{{"catch_up.direct_conv", cu.DirectConv, siteDirectConv, &m.directConv}, {"catch_up.group_conv", cu.GroupConv, siteGroupConv, &m.groupConv}} {
		if cv.src == "" {
			continue
		}
		if *cv.dst = c.template(cv.key, cv.src, cv.s); *cv.dst != nil {
			// A name, not JSON: every value is written as it is.
			for i := range (*cv.dst).parts {
				if a := (*cv.dst).parts[i].act; a != nil {
					a.inString = true
				}
			}
		}
	}
	if nw := cu.Newest; nw.Send != "" || len(nw.Reply) > 0 || nw.Convs != "" {
		if cu.Fetch == "" {
			c.fail("catch_up.newest", nil, "needs catch_up.fetch: what it shows missing is fetched")
		}
		m.newest.send = c.template("catch_up.newest.send", nw.Send, siteLogin)
		if m.newest.send == nil {
			c.fail("catch_up.newest.send", nw.Send, "is required: the request's template")
		}
		if nw.Reply == nil {
			c.fail("catch_up.newest.reply", nil, "is required: the rule of the request's reply")
		} else {
			m.newest.reply = compileRule(c, "catch_up.newest.reply", nw.Reply, siteLogin)
		}
		m.newest.convs = c.path("catch_up.newest.convs", nw.Convs, true)
		if nw.Conv != "" || nw.Seq != "" {
			// The list's objects have paths of their own.
			ec := &compiler{dec: newDecoder(framingObject)}
			ec.path("catch_up.newest.conv", nw.Conv, true)
			ec.path("catch_up.newest.seq", nw.Seq, true)
			c.errs = append(c.errs, ec.errs...)
			ec.dec.root.index()
			m.newest.elem = ec.dec
		}
	}
	if cu.Limit < 1 || cu.Limit > 10000 {
		c.fail("catch_up.limit", cu.Limit, "must be between 1 and 10000")
	}
	m.limit = cu.Limit
}

// compileKeepalive compiles the ping, its pong and the answers to the
// server's pings.
func (c *compiler) compileKeepalive(cfg Config, m *mapping) {
	switch ping := cfg.Keepalive.Ping; ping {
	case "websocket", "":
		m.pingWS = true
	case "none":
	default:
		m.ping = c.template("keepalive.ping", ping, siteLogin)
	}
	if len(cfg.Keepalive.Pong) > 0 {
		if m.ping == nil {
			c.fail("keepalive.pong", nil, "is the answer to an application ping: keepalive.ping must be its template")
		}
		m.pong = c.rule("keepalive.pong", cfg.Keepalive.Pong, false)
	}
	for i, raw := range cfg.Keepalive.Answer {
		key := fmt.Sprintf("keepalive.answer[%d]", i)
		am, ok := c.fields(key, raw, "when", "send")
		if !ok {
			continue
		}
		an := answer{when: c.rule(key+".when", am["when"], true)}
		s, _ := am["send"].(string)
		if s == "" {
			c.fail(key+".send", am["send"], "must be a template")
		}
		an.send = c.template(key+".send", s, siteKeepalive)
		m.answers = append(m.answers, an)
	}
}

// compileDisconnects compiles the close codes and the error frames.
func (c *compiler) compileDisconnects(cfg Config, m *mapping) {
	m.closeCodes = map[int]string{}
	for code, reason := range cfg.Disconnects.CloseCodes {
		key := "disconnects.close_codes." + code
		n, err := strconv.Atoi(code)
		if err != nil || n < 1000 || n > 4999 {
			c.fail(key, code, "must be a WebSocket close code, 1000 to 4999")
			continue
		}
		if !slices.Contains(closeReasons, reason) {
			c.fail(key, reason, "must be one of %s", strings.Join(closeReasons, ", "))
			continue
		}
		m.closeCodes[n] = reason
	}
	for i, raw := range cfg.Disconnects.Frames {
		key := fmt.Sprintf("disconnects.frames[%d]", i)
		fm, ok := c.fields(key, raw, "match", "reason", "text")
		if !ok {
			continue
		}
		ef := errFrame{match: c.rule(key+".match", fm["match"], true), text: -1}
		reason, _ := fm["reason"].(string)
		if !validReason(reason) {
			c.fail(key+".reason", fm["reason"], "must be one of %s", strings.Join(reasons, ", "))
		}
		ef.reason = reason
		if t, ok := fm["text"].(string); ok {
			ef.text = c.path(key+".text", t, false)
		}
		m.errFrames = append(m.errFrames, ef)
	}
}

// reasons are the disconnect reasons a mapping may name.
var reasons = []string{metrics.ReasonSlowConsumer, metrics.ReasonConflict, metrics.ReasonServerClose}

// closeReasons are what a close code may mean: a disconnect reason; error,
// the server saying the client broke its protocol; or unauthorized, a
// close that refuses the credentials. Unauthorized fails a login as such,
// so that the authentication alert sees it, and ends a running session as
// server_close.
var closeReasons = append(slices.Clip(reasons), metrics.ReasonError, metrics.ConnectUnauthorized)

func validReason(r string) bool { return slices.Contains(reasons, r) }

// collectCaptures adds the names that steps (and their otherwise steps)
// capture to set.
func collectCaptures(steps []any, set map[string]bool) {
	for _, s := range steps {
		m, ok := s.(map[string]any)
		if !ok {
			continue
		}
		if caps, ok := m["capture"].(map[string]any); ok {
			for k := range caps {
				set[k] = true
			}
		}
		if o, ok := m["otherwise"].(map[string]any); ok {
			if list, ok := o["steps"].([]any); ok {
				collectCaptures(list, set)
			}
		}
	}
}

// fields checks that raw is a mapping holding only the keys allowed.
func (c *compiler) fields(key string, raw any, allowed ...string) (map[string]any, bool) {
	m, ok := raw.(map[string]any)
	if !ok {
		c.fail(key, raw, "must be a mapping with the keys %s", strings.Join(allowed, ", "))
		return nil, false
	}
	good := true
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if slices.Contains(allowed, k) {
			continue
		}
		good = false
		if near := config.Closest(k, allowed); near != "" {
			c.fail(key+"."+k, m[k], "unknown key: did you mean %s?", near)
		} else {
			c.fail(key+"."+k, m[k], "unknown key: the keys here are %s", strings.Join(allowed, ", "))
		}
	}
	return m, good
}

// template parses the template at key, "" for none.
func (c *compiler) template(key, src string, s site) *template {
	if src == "" {
		return nil
	}
	t, err := parseTemplate(src, s, c.attrs)
	if err != nil {
		c.fail(key, src, "%v", err)
		return nil
	}
	if c.noToken && t.uses(varToken) {
		c.fail(key, src, "uses {{.Token}}, which is empty: token.source is none (set it to jwt, hmac or file)")
	}
	return t
}

// rule compiles the rule at key; a missing one is a problem if required.
func (c *compiler) rule(key string, v any, required bool) *rule {
	if m, ok := v.(map[string]any); v == nil || ok && len(m) == 0 {
		if required {
			c.fail(key, v, `is required: a mapping of paths to values (a message that is exactly {} is {".": "{}"})`)
		}
		return nil
	}
	return compileRule(c, key, v, nil)
}

// path adds the path at key to the decoder, returning its slot, or -1 for
// none.
func (c *compiler) path(key, p string, required bool) int {
	if p == "" {
		if required {
			c.fail(key, p, "is required: a path such as data.body")
		}
		return -1
	}
	slot, err := c.dec.path(p)
	if err != nil {
		c.fail(key, p, "%v", err)
		return -1
	}
	return slot
}

// stepKeys are the keys of a step; a subscribe step has subscribeKeys
// too.
var (
	stepKeys      = []string{"name", "send", "reply", "success", "reason", "unauthorized", "capture", "otherwise"}
	subscribeKeys = []string{"resume", "deliveries", "newest"}
)

// subscribeStep compiles a subscribe step, whose conversation is named by
// the catch_up template convSrc (at convKey): its resume request, the
// deliveries its reply lists, the newest seq it says, and its captures,
// which are the conversation's.
func (c *compiler) subscribeStep(key string, raw any, s site, convSrc, convKey string) *step {
	st := c.stepWith(key, raw, s, subscribeKeys)
	if st == nil {
		return nil
	}
	m, _ := raw.(map[string]any)
	needConv := func(what string, v any) {
		if convSrc == "" {
			c.fail(key+"."+what, v, "needs %s: it is about the conversation, which that names", convKey)
		}
	}
	if v, ok := m["resume"]; ok {
		needConv("resume", v)
		src, isStr := v.(string)
		if !isStr || src == "" {
			c.fail(key+".resume", v, "must be a template")
		} else {
			st.resume = c.template(key+".resume", src, slices.Concat(s, site{varConv, varAfter, varSince}))
		}
		if st.send == nil {
			c.fail(key+".resume", v, "replaces the step's send where the device has a place in the conversation: send is needed too")
		}
	}
	if v, ok := m["deliveries"]; ok {
		dm, _ := c.fields(key+".deliveries", v, "list", "body", "seq", "from")
		if dm != nil {
			list, _ := dm["list"].(string)
			st.list = c.list(key+".deliveries", list, dm)
		}
	}
	if v, ok := m["newest"]; ok {
		needConv("newest", v)
		p, _ := v.(string)
		st.newest = c.path(key+".newest", p, true)
	}
	// Its captures, and those of the steps it runs otherwise, are the
	// conversation's, as collectCaptures declared them.
	var convCaptures func(*step)
	convCaptures = func(x *step) {
		if len(x.captures) > 0 {
			needConv("capture", m["capture"])
			x.conv = true
		}
		for _, o := range x.otherwise {
			convCaptures(o)
		}
	}
	convCaptures(st)
	return st
}

// list compiles a list of deliveries inside a reply at key: the array's
// path list, and of each element the paths of fields body, seq and from.
func (c *compiler) list(key, list string, fields map[string]any) *listDec {
	str := func(k string) string { s, _ := fields[k].(string); return s }
	ld := &listDec{slot: c.path(key+".list", list, true), from: -1}
	// The elements have paths of their own, in a decoder of their own:
	// body first, then seq, so that their slots are elemBody and elemSeq.
	ec := &compiler{dec: newDecoder(framingObject)}
	ec.path(key+".body", str("body"), true)
	ec.path(key+".seq", str("seq"), true)
	ld.from = ec.path(key+".from", str("from"), false)
	c.errs = append(c.errs, ec.errs...)
	ec.dec.root.index()
	ld.dec = ec.dec
	return ld
}

func (c *compiler) steps(key string, list []any, s site) []*step {
	var out []*step
	for i, raw := range list {
		if st := c.step(fmt.Sprintf("%s[%d]", key, i), raw, s); st != nil {
			out = append(out, st)
		}
	}
	return out
}

func (c *compiler) step(key string, raw any, s site) *step {
	return c.stepWith(key, raw, s, nil)
}

// stepWith compiles a step whose map may hold the extra keys too, which
// the caller compiles.
func (c *compiler) stepWith(key string, raw any, s site, extra []string) *step {
	m, _ := c.fields(key, raw, slices.Concat(stepKeys, extra)...)
	if m == nil {
		return nil
	}
	st := &step{key: key, reason: -1, newest: -1}
	st.name, _ = m["name"].(string)
	if send, ok := m["send"]; ok {
		src, isStr := send.(string)
		if !isStr || src == "" {
			c.fail(key+".send", send, "must be a template")
		} else {
			st.send = c.template(key+".send", src, s)
		}
	}
	if m["reply"] == nil {
		c.fail(key+".reply", nil, "is required: the rule of the frame that answers the step")
	} else {
		st.reply = compileRule(c, key+".reply", m["reply"], s)
	}
	if v, ok := m["success"]; ok {
		st.success = compileRule(c, key+".success", v, s)
	}
	if v, ok := m["unauthorized"]; ok {
		st.unauthorized = compileRule(c, key+".unauthorized", v, s)
	}
	if v, ok := m["reason"]; ok {
		p, _ := v.(string)
		st.reason = c.path(key+".reason", p, true)
	}
	if v, ok := m["capture"]; ok {
		caps, isMap := v.(map[string]any)
		if !isMap {
			c.fail(key+".capture", v, "must be a mapping of names to paths")
		}
		for _, name := range slices.Sorted(maps.Keys(caps)) {
			p, _ := caps[name].(string)
			if !validName(name) {
				c.fail(key+".capture."+name, name, "a name is letters, digits and _, starting with a letter")
				continue
			}
			if slot := c.path(key+".capture."+name, p, true); slot >= 0 {
				st.captures = append(st.captures, capture{name: name, slot: slot})
			}
		}
	}
	if v, ok := m["otherwise"]; ok {
		om, _ := c.fields(key+".otherwise", v, "when", "steps")
		if om != nil {
			st.when = compileRule(c, key+".otherwise.when", om["when"], s)
			list, isList := om["steps"].([]any)
			if !isList || len(list) == 0 {
				c.fail(key+".otherwise.steps", om["steps"], "must be a list of steps")
			}
			st.otherwise = c.steps(key+".otherwise.steps", list, s)
		}
	}
	if st.send == nil && st.reply != nil && slices.ContainsFunc(st.reply.conds, func(cd cond) bool { return cd.op == opTemplate }) && !st.reply.usesOnly(varUser, varDevice, varToken, varPassword, varGroup, varPeer) {
		c.fail(key+".reply", m["reply"], "uses {{.ID}} but the step sends nothing that carries it")
	}
	return st
}

func validName(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func (c *compiler) token(t TokenConfig) tokenSpec {
	ts := tokenSpec{source: t.Source, algorithm: t.Algorithm, ttl: t.TTL, file: t.File}
	switch t.Source {
	case "none", "hmac":
	case "jwt":
		switch t.Algorithm {
		case "HS256", "HS384", "HS512":
		default:
			c.fail("token.algorithm", t.Algorithm, "must be HS256, HS384 or HS512")
		}
		if t.TTL < time.Minute {
			c.fail("token.ttl", t.TTL, "must be at least 1m")
		}
		ts.claims = map[string]claim{}
		for _, k := range slices.Sorted(maps.Keys(t.Claims)) {
			switch v := t.Claims[k].(type) {
			case string:
				if tm := c.template("token.claims."+k, v, siteClaims); tm != nil {
					for i := range tm.parts {
						if tm.parts[i].act != nil {
							tm.parts[i].act.inString = true
						}
					}
					ts.claims[k] = claim{tmpl: tm}
				}
			default:
				ts.claims[k] = claim{v: v}
			}
			if k == "exp" || k == "iat" {
				c.fail("token.claims."+k, t.Claims[k], "is set from token.ttl")
			}
		}
	case "file":
		if t.File == "" {
			c.fail("token.file", t.File, "is required with token.source file")
		}
	default:
		c.fail("token.source", t.Source, "must be none, jwt, hmac or file")
	}
	return ts
}

// uses reports whether t refers to v.
func (t *template) uses(v varID) bool {
	for _, p := range t.parts {
		if p.act == nil {
			continue
		}
		for _, a := range p.act.args {
			if a.hasRef && a.v == v {
				return true
			}
		}
	}
	return false
}

// usesOnly reports whether r's templates refer to nothing but vs.
func (r *rule) usesOnly(vs ...varID) bool {
	for _, cd := range r.conds {
		if cd.tmpl == nil {
			continue
		}
		for _, p := range cd.tmpl.parts {
			if p.act == nil {
				continue
			}
			for _, a := range p.act.args {
				if a.hasRef && !slices.Contains(vs, a.v) {
					return false
				}
			}
		}
	}
	return true
}

// errNoMapping is what a jsonws target without a mapping gets.
var errNoMapping = errors.New("holds no mapping: describe the protocol under target.jsonws (configs/jsonws-reference.yaml is one)")

// nameRules rewrite user names for the server (user_name).
type nameRules struct {
	replace *strings.Replacer
	max     int
}

func (c *compiler) names(u UserNameConfig) nameRules {
	var n nameRules
	if len(u.Replace) > 0 {
		var pairs []string
		for _, k := range slices.Sorted(maps.Keys(u.Replace)) {
			if k == "" {
				c.fail("user_name.replace", k, "an empty string cannot be replaced")
				continue
			}
			pairs = append(pairs, k, u.Replace[k])
		}
		n.replace = strings.NewReplacer(pairs...)
	}
	if u.MaxLength != 0 && (u.MaxLength < 12 || u.MaxLength > 1024) {
		c.fail("user_name.max_length", u.MaxLength, "must be 0 (no limit) or between 12 and 1024")
	}
	n.max = u.MaxLength
	return n
}

// apply returns name as the server knows it.
func (n nameRules) apply(name string) string {
	out := name
	if n.replace != nil {
		out = n.replace.Replace(out)
	}
	if n.max > 0 && len(out) > n.max {
		h := sha256.Sum256([]byte(name))
		out = out[:n.max-8] + hex.EncodeToString(h[:4])
	}
	return out
}
