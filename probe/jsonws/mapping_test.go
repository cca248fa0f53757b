package jsonws

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/config"
)

// loadSection loads the jsonws section of a configuration file as the
// daemon does.
func loadSection(t testing.TB, path string) Config {
	t.Helper()
	ld := config.NewLoader(Adapter.Config)
	cfg, err := ld.Load(path, nil, nil)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return config.Section[Config](cfg, "jsonws", DefaultConfig())
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestShippedMappingsCompile(t *testing.T) {
	files, _ := filepath.Glob("../../configs/*.yaml")
	n := 0
	for _, f := range files {
		ld := config.NewLoader(Adapter.Config)
		cfg, err := ld.Load(f, nil, nil)
		if err != nil || cfg.Target.Protocol != "jsonws" {
			// Other protocols' files are the registry's test's.
			continue
		}
		n++
		sec := config.Section[Config](cfg, "jsonws", DefaultConfig())
		if errs := sec.Validate(); len(errs) > 0 {
			t.Errorf("%s: %v", f, errs)
		}
	}
	if n < 2 {
		t.Fatalf("%d jsonws configurations under configs/, want the reference's and more", n)
	}
}

// minimal is the smallest mapping that compiles, as a YAML document.
const minimal = `
target:
  protocol: jsonws
  url: ws://127.0.0.1:1/ws
  jsonws:
    login:
      - send: '{"login":{{.User}},"id":{{.ID}}}'
        reply: {id: "{{.ID}}"}
    send:
      direct: '{"id":{{.ID}},"to":{{.To}},"body":{{.Body}}}'
      ack: {match: {ack: "*"}, id: id}
    delivery: {match: {type: msg}, body: body}
`

// problems loads doc (a YAML document) and returns its problems as the
// loader reports them.
func problems(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	writeFile(t, path, doc)
	ld := config.NewLoader(Adapter.Config)
	_, err := ld.Load(path, nil, nil)
	if err == nil {
		return ""
	}
	return err.Error()
}

// subscribe is a subscribe.direct section with the keys given, and the
// line after it in the minimal mapping.
func subscribe(keys string) string {
	return "    subscribe:\n      direct: {send: '{\"sub\":{{.Peer}},\"id\":{{.ID}}}', reply: {id: \"{{.ID}}\"}, " + keys + "}\n    send:\n"
}

func TestConfigCheckNamesTheKey(t *testing.T) {
	if p := problems(t, minimal); p != "" {
		t.Fatalf("minimal mapping: %s", p)
	}
	cases := []struct {
		name, from, to string
		want           []string
	}{
		{"unknown variable", `"to":{{.To}}`, `"to":{{.Too}}`,
			[]string{"target.jsonws.send.direct", "unknown variable .Too: did you mean .To?"}},
		{"variable of another site", `"to":{{.To}}`, `"to":{{.Conv}}`,
			[]string{"target.jsonws.send.direct", "unknown variable .Conv"}},
		{"unknown attribute", `"to":{{.To}}`, `"to":{{.To.uid}}`,
			[]string{"target.jsonws.send.direct", "unknown attribute .To.uid", "captures none"}},
		{"unknown function", `"to":{{.To}}`, `"to":{{upper .To}}`,
			[]string{"target.jsonws.send.direct", `unknown function "upper"`}},
		{"unclosed action", `"to":{{.To}}`, `"to":{{.To`,
			[]string{"target.jsonws.send.direct", "unclosed action"}},
		{"no id in send", `{"id":{{.ID}},"to"`, `{"to"`,
			[]string{"target.jsonws.send.direct", "must hold {{.ID}}"}},
		{"no body in send", `"body":{{.Body}}`, `"body":"x"`,
			[]string{"target.jsonws.send.direct", "must hold {{.Body}}"}},
		{"template in a frame rule", `match: {type: msg}`, `match: {type: "{{.User}}"}`,
			[]string{"target.jsonws.delivery.match.type", "templates are not allowed here"}},
		{"virtual path without engineio", `match: {type: msg}`, `match: {$type: event}`,
			[]string{"target.jsonws.delivery.match.$type", "framing engineio"}},
		{"empty path part", `body: body`, `body: data..body`,
			[]string{"target.jsonws.delivery.body", "empty part"}},
		{"missing ack id", `ack: {match: {ack: "*"}, id: id}`, `ack: {match: {ack: "*"}}`,
			[]string{"target.jsonws.send.ack.id", "is required"}},
		{"unknown step key", `reply: {id: "{{.ID}}"}`, `replly: {id: "{{.ID}}"}`,
			[]string{"target.jsonws.login[0].replly", "did you mean reply?", "target.jsonws.login[0].reply", "is required"}},
		{"empty range", `match: {type: msg}`, `match: {code: "300..200"}`,
			[]string{"target.jsonws.delivery.match.code", "is empty"}},
		{"bad framing", `login:`, "framing: json\n    login:",
			[]string{"target.jsonws.framing", "must be object, lines or engineio"}},
		{"bad close reason", `login:`, "disconnects: {close_codes: {4008: slow}}\n    login:",
			[]string{"target.jsonws.disconnects.close_codes.4008", "must be one of slow_consumer"}},
		{"seq without conv", `body: body}`, `body: body, seq: seq}`,
			[]string{"target.jsonws.delivery.conv", "is needed with delivery.seq"}},
		{"jwt claim template", `login:`, "token: {source: jwt, claims: {sub: \"{{.Usr}}\"}}\n    login:",
			[]string{"target.jsonws.token.claims.sub", "unknown variable .Usr: did you mean .User?"}},
		// An answer to the server's ping is no request of ours: its
		// {{.ID}} would be 0.
		{"id in a ping's answer", `login:`, "keepalive: {answer: [{when: {ping: \"*\"}, send: '{\"pong\":{{.ID}}}'}]}\n    login:",
			[]string{"target.jsonws.keepalive.answer[0].send", "unknown variable .ID"}},
		{"id in a claim", `login:`, "token: {source: jwt, claims: {jti: \"{{.ID}}\"}}\n    login:",
			[]string{"target.jsonws.token.claims.jti", "unknown variable .ID"}},
		{"token without a source", `{"login":{{.User}}`, `{"login":{{.Token}}`,
			[]string{"target.jsonws.login[0].send", "uses {{.Token}}, which is empty: token.source is none"}},
		{"empty rule", `login:`, "keepalive: {answer: [{when: {}, send: '{}'}]}\n    login:",
			[]string{"target.jsonws.keepalive.answer[0].when", `is exactly {} is {".": "{}"}`}},
		{"list value", `match: {type: msg}`, `match: {type: [msg]}`,
			[]string{"target.jsonws.delivery.match.type", "a list matches only as []"}},
		{"seq without a fetch", `body: body}`, `body: body, seq: seq, conv: conv}`,
			[]string{"target.jsonws", "target.catch_up is on", "catch_up.fetch is not set"}},
		{"resume without a conversation", "    send:\n", subscribe(`resume: '{"sub":{{.Conv}},"after":{{.After}},"id":{{.ID}}}'`),
			[]string{"target.jsonws.subscribe.direct.resume", "needs catch_up.direct_conv"}},
		{"conversation attribute not captured", "    send:\n", subscribe(`resume: '{"sub":{{.Conv}},"e":{{.Conv.epoch}},"id":{{.ID}}}'`),
			[]string{"target.jsonws.subscribe.direct.resume", "unknown attribute .Conv.epoch: a subscribe step captures none"}},
		{"conversation attribute in a first subscribe", "    send:\n",
			"    subscribe:\n      direct: {send: '{\"sub\":{{.Conv.epoch}},\"id\":{{.ID}}}', reply: {id: \"{{.ID}}\"}, capture: {epoch: epoch}}\n    catch_up: {direct_conv: 'd:{{.Peer}}'}\n    send:\n",
			[]string{"target.jsonws.subscribe.direct.send", "unknown variable .Conv"}},
		{"listed deliveries without a body", "    send:\n", subscribe(`deliveries: {list: pubs, seq: offset}`),
			[]string{"target.jsonws.subscribe.direct.deliveries.body", "is required"}},
		{"listed history without a fetch", "    send:\n", "    catch_up: {done: {deliveries: {list: pubs, body: b, seq: s}}}\n    send:\n",
			[]string{"target.jsonws.catch_up.done.deliveries", "answers catch_up.fetch, which is not set"}},
		{"newest seq without a conversation", "    send:\n", subscribe(`newest: offset`),
			[]string{"target.jsonws.subscribe.direct.newest", "needs catch_up.direct_conv"}},
	}
	for name, edit := range map[string]string{
		"seq without a fetch, catch-up off": "target:\n  catch_up: \"off\"",
		"the server's empty ping answered":  "    keepalive: {answer: [{when: {\".\": \"{}\"}, send: '{}'}]}\n",
		"a close code of error":             "    disconnects: {close_codes: {\"3012\": error, \"3500\": unauthorized}}\n",
		"a subscribe that resumes": strings.TrimSuffix(subscribe(`resume: '{"sub":{{.Conv}},"e":{{.Conv.epoch}},"after":{{.After}},"id":{{.ID}}}', `+
			`capture: {epoch: epoch}, newest: offset, deliveries: {list: pubs, body: data, seq: offset, from: user}`), "    send:\n") +
			"    catch_up: {direct_conv: 'd:{{.Peer}}', fetch: '{\"h\":{{.Conv}},\"e\":{{.Conv.epoch}},\"id\":{{.ID}}}', done: {match: {h: \"*\"}, id: id, deliveries: {list: pubs, body: data, seq: offset}}}\n",
	} {
		doc := strings.Replace(minimal, `body: body}`, `body: body, seq: seq, conv: conv}`, 1)
		if strings.HasPrefix(edit, "target:") {
			doc = strings.Replace(doc, "target:", edit, 1)
		} else {
			doc = strings.Replace(doc, "    send:\n", edit+"    send:\n", 1)
			doc = strings.Replace(doc, "target:", "target:\n  catch_up: \"off\"", 1)
		}
		if p := problems(t, doc); p != "" {
			t.Errorf("%s: %s\n%s", name, p, doc)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(minimal, c.from) {
				t.Fatalf("case edits %q, which the minimal mapping does not hold", c.from)
			}
			p := problems(t, strings.Replace(minimal, c.from, c.to, 1))
			for _, w := range c.want {
				if !strings.Contains(p, w) {
					t.Errorf("problems %q\nwant them to say %q", p, w)
				}
			}
		})
	}
}

func TestTemplateEscapesByContext(t *testing.T) {
	e := &env{id: 7, user: `a"b`, to: "bob", group: "g1", body: []byte("x\ny"), members: []string{"a", `b"c`},
		attr: func(group bool, who, name string) (string, bool) {
			if group {
				return "grp-" + who, true
			}
			return "uid-" + who, who != "nobody"
		}}
	cases := []struct {
		src  string
		s    site
		want string
	}{
		{`{"id":{{.ID}},"user":{{.User}}}`, common, `{"id":7,"user":"a\"b"}`},
		{`{"id":"{{.ID}}","user":"u-{{.User}}"}`, common, `{"id":"7","user":"u-a\"b"}`},
		{`42{{.ID}}["send",{"body":{{.Body}}}]`, siteSendDM, `427["send",{"body":"x\u000ay"}]`},
		{`{"m":{{.Members}}}`, siteCreate, `{"m":["a","b\"c"]}`},
		{`{"to":"usr{{.To.uid}}","g":"{{.Group.topic}}"}`, siteSendGroup, ""},
		{`{"to":"usr{{.To.uid}}"}`, siteSendDM, `{"to":"usruid-bob"}`},
		{`{"secret":{{base64 .To ":" "pw"}}}`, siteSendDM, `{"secret":"Ym9iOnB3"}`},
		{`{"s":"{{base64 .ID}}"}`, common, `{"s":"Nw=="}`},
		{`{"q":"a\"{{.To}}\""}`, siteSendDM, `{"q":"a\"bob\""}`},
	}
	attrs := attrSets{user: map[string]bool{"uid": true}, group: map[string]bool{"topic": true}}
	for _, c := range cases {
		tm, err := parseTemplate(c.src, c.s, attrs)
		if c.want == "" {
			if err == nil {
				t.Errorf("%s: parsed at a site without .To, want an error", c.src)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		got, err := tm.render(nil, e)
		if err != nil || string(got) != c.want {
			t.Errorf("%s = %s, %v; want %s", c.src, got, err, c.want)
		}
	}
	tm, _ := parseTemplate(`{"to":"{{.To.uid}}"}`, siteSendDM, attrs)
	ne := *e
	ne.to = "nobody"
	if _, err := tm.render(nil, &ne); err == nil || !strings.Contains(err.Error(), ".To.uid of nobody: not known") {
		t.Errorf("render of a missing attribute: %v, want it named", err)
	}
}

// decodeOne compiles rules over paths and decodes frame with framing.
func decodeOne(t *testing.T, framing string, paths []string, frame string) (*msg, []int, error) {
	t.Helper()
	d := newDecoder(framing)
	slots := make([]int, len(paths))
	for i, p := range paths {
		s, err := d.path(p)
		if err != nil {
			t.Fatal(err)
		}
		slots[i] = s
	}
	m := d.newMsg()
	var got *msg
	err := d.each([]byte(frame), m, func(m *msg) error { got = m; return nil })
	return got, slots, err
}

func TestDecoderReadsPaths(t *testing.T) {
	cases := []struct {
		framing, frame string
		paths          []string
		want           []string // "" for absent
	}{
		{framingObject, `{"data":{"topic":"grp1","seq":12,"content":"a\u0041\"b","from":"usr2"},"x":[1,{"y":2}]}`,
			[]string{"data.topic", "data.seq", "data.content", "x.1.y", "data.none", "x.0"},
			[]string{"grp1", "12", `aA"b`, "2", "", "1"}},
		{framingEngineIO, `42["message",{"body":"hi","seq":3}]`,
			[]string{"$type", "$id", "0", "1.body", "1.seq"},
			[]string{"event", "", "message", "hi", "3"}},
		{framingEngineIO, `4317[{"ok":true,"seq":9}]`,
			[]string{"$type", "$id", "0.ok", "0.seq"},
			[]string{"ack", "17", "true", "9"}},
		{framingEngineIO, `0{"sid":"abc","pingInterval":25000}`,
			[]string{"$type", "sid"}, []string{"open", "abc"}},
		{framingEngineIO, `2`, []string{"$type"}, []string{"ping"}},
		{framingEngineIO, `44{"message":"no user"}`, []string{"$type", "message"}, []string{"connect_error", "no user"}},
		{framingEngineIO, `42/admin,["x"]`, []string{"$type", "0"}, []string{"other_namespace", ""}},
	}
	for _, c := range cases {
		m, slots, err := decodeOne(t, c.framing, c.paths, c.frame)
		if err != nil {
			t.Errorf("%s: %v", c.frame, err)
			continue
		}
		for i, s := range slots {
			v := m.vals[s]
			got := string(v.b)
			if !v.present() {
				got = ""
			}
			if got != c.want[i] {
				t.Errorf("%s: %s = %q, want %q", c.frame, c.paths[i], got, c.want[i])
			}
		}
	}
}

func TestDecoderRefusesMalformed(t *testing.T) {
	for _, c := range []struct{ framing, frame string }{
		{framingObject, `{"data":`},
		{framingObject, `{"a":1} trailing`},
		{framingObject, `{"a":"\x01"}`},
		{framingObject, strings.Repeat("[", 100)},
		{framingEngineIO, `9`},
		{framingEngineIO, `451-["x",{"_placeholder":true,"num":0}]`},
		{framingEngineIO, `42["message",`},
		{framingEngineIO, ``},
		{framingLines, "{\"a\":1}\n{\"b\":"},
	} {
		if _, _, err := decodeOne(t, c.framing, []string{"a", "data.x"}, c.frame); err == nil {
			t.Errorf("%s %q decoded, want an error", c.framing, c.frame)
		}
	}
}

func TestLinesFramingReadsEachMessage(t *testing.T) {
	d := newDecoder(framingLines)
	s, _ := d.path("n")
	var got []string
	err := d.each([]byte("{\"n\":1}\n{\"n\":2}\n\n{\"n\":3}\n"), d.newMsg(), func(m *msg) error {
		got = append(got, string(m.vals[s].b))
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"1", "2", "3"}) {
		t.Errorf("lines = %v, %v; want [1 2 3]", got, err)
	}
}

func TestRulesMatch(t *testing.T) {
	c := &compiler{dec: newDecoder(framingObject)}
	r := compileRule(c, "r", map[string]any{"ctrl": map[string]any{"code": "200..299", "id": "*"}, "topic": "grp*", "ok": true}, nil)
	if len(c.errs) > 0 {
		t.Fatal(c.errs)
	}
	for frame, want := range map[string]bool{
		`{"ctrl":{"code":202,"id":"5"},"topic":"grpX","ok":true}`:  true,
		`{"ctrl":{"code":"204","id":5},"topic":"grp","ok":true}`:   true,
		`{"ctrl":{"code":404,"id":"5"},"topic":"grpX","ok":true}`:  false,
		`{"ctrl":{"code":202,"id":null},"topic":"grpX","ok":true}`: false,
		`{"ctrl":{"code":202,"id":"5"},"topic":"usrX","ok":true}`:  false,
		`{"ctrl":{"code":202,"id":"5"},"topic":"grpX","ok":false}`: false,
		`{"ctrl":{"code":202,"id":"5"},"topic":"grpX"}`:            false,
	} {
		m := c.dec.newMsg()
		var ok bool
		if err := c.dec.each([]byte(frame), m, func(m *msg) error { ok = r.match(m); return nil }); err != nil {
			t.Fatal(err)
		}
		if ok != want {
			t.Errorf("%s: match = %v, want %v (rule %s)", frame, ok, want, r)
		}
	}
	// Empty values, as Centrifugo's ping {} and an answer's data: {} are.
	c = &compiler{dec: newDecoder(framingLines)}
	root := compileRule(c, "r", map[string]any{".": "{}"}, nil)
	field := compileRule(c, "f", map[string]any{"data": map[string]any{}, "list": "[]"}, nil)
	if len(c.errs) > 0 {
		t.Fatal(c.errs)
	}
	for frame, want := range map[string][2]bool{
		`{}`:                         {true, false},
		`{ }`:                        {true, false},
		`{"a":1}`:                    {false, false},
		`[]`:                         {false, false},
		`"{}"`:                       {false, false},
		`{"data":{},"list":[ ]}`:     {false, true},
		`{"data":{"x":1},"list":[]}`: {false, false},
		`{"data":"{}","list":[]}`:    {false, false},
		`{"data":{},"list":[1]}`:     {false, false},
		`{"data":{},"list":{}}`:      {false, false},
	} {
		m := c.dec.newMsg()
		var got [2]bool
		if err := c.dec.each([]byte(frame), m, func(m *msg) error { got = [2]bool{root.match(m), field.match(m)}; return nil }); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: {\".\": {}} and {data: {}, list: []} match %v, want %v", frame, got, want)
		}
	}
}

func TestCorrelationID(t *testing.T) {
	for in, want := range map[string]uint64{"12": 12, "h12": 12, "abc": 0, "": 0, "99999999999999999999999": 0} {
		got, ok := corrID(value{b: []byte(in), kind: kindString})
		if got != want || ok != (want != 0) {
			t.Errorf("corrID(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
}
