package jsonws

import (
	"time"
)

// Config is the jsonws section of the configuration, target.jsonws: the
// mapping of a JSON-over-WebSocket protocol. Steps and match rules are
// mappings the section's compiler reads itself (see compile), so that an
// error names the exact key inside them.
type Config struct {
	// Framing is how messages sit in text frames: object, lines or
	// engineio.
	Framing string `koanf:"framing"`
	// Subprotocol, if set, is the WebSocket subprotocol to ask for.
	Subprotocol string `koanf:"subprotocol"`
	// MaxFrame bounds one received frame, in bytes.
	MaxFrame int `koanf:"max_frame"`
	// MirrorsOwn says the server delivers what a user sends to the user's
	// other sessions (probe.Mirror).
	MirrorsOwn bool `koanf:"mirrors_own"`
	// UserName is how imcanary's user names are spelled to the server.
	UserName UserNameConfig `koanf:"user_name"`
	Token    TokenConfig    `koanf:"token"`
	// Login is the steps run on every connection, in order.
	Login     []any           `koanf:"login"`
	Subscribe SubscribeConfig `koanf:"subscribe"`
	Groups    GroupsConfig    `koanf:"groups"`
	Send      SendConfig      `koanf:"send"`
	Delivery  DeliveryConfig  `koanf:"delivery"`
	CatchUp   CatchUpConfig   `koanf:"catch_up"`
	Keepalive KeepaliveConfig `koanf:"keepalive"`
	// Disconnects maps close codes and error frames to why a session
	// ended.
	Disconnects DisconnectsConfig `koanf:"disconnects"`
	// Ignore lists rules of frames that are known and not needed: they
	// are not counted unmatched.
	Ignore []any `koanf:"ignore"`
}

// UserNameConfig rewrites imcanary's user names (imcanary-u17) for a
// server that refuses some of their characters or their length.
type UserNameConfig struct {
	// Replace maps a string to what replaces it, applied in a sorted
	// order of the keys.
	Replace map[string]string `koanf:"replace"`
	// MaxLength, if not 0, bounds a name: a longer one keeps its start
	// and ends in 8 hex digits of a hash of the whole, so that names stay
	// distinct.
	MaxLength int `koanf:"max_length"`
}

// TokenConfig says how .Token is made.
type TokenConfig struct {
	Source    string         `koanf:"source"`
	Algorithm string         `koanf:"algorithm"`
	Claims    map[string]any `koanf:"claims"`
	TTL       time.Duration  `koanf:"ttl"`
	File      string         `koanf:"file"`
}

// SubscribeConfig holds the steps run after login for each conversation.
type SubscribeConfig struct {
	Direct map[string]any `koanf:"direct"`
	Group  map[string]any `koanf:"group"`
}

// GroupsConfig holds the provisioning steps of groups.
type GroupsConfig struct {
	Create map[string]any `koanf:"create"`
	Join   map[string]any `koanf:"join"`
}

// SendConfig holds the send templates and how their acks look.
type SendConfig struct {
	Direct string    `koanf:"direct"`
	Group  string    `koanf:"group"`
	Ack    AckConfig `koanf:"ack"`
}

// AckConfig says which frames are acks and where their fields are.
type AckConfig struct {
	Match    map[string]any `koanf:"match"`
	ID       string         `koanf:"id"`
	Success  map[string]any `koanf:"success"`
	Code     string         `koanf:"code"`
	ServerID string         `koanf:"server_id"`
	Seq      string         `koanf:"seq"`
	Conv     string         `koanf:"conv"`
}

// DeliveryConfig says which frames are deliveries and where their fields
// are.
type DeliveryConfig struct {
	Match map[string]any `koanf:"match"`
	Body  string         `koanf:"body"`
	From  string         `koanf:"from"`
	Conv  string         `koanf:"conv"`
	Seq   string         `koanf:"seq"`
	Group map[string]any `koanf:"group"`
}

// CatchUpConfig is the history request, when target.catch_up is on.
type CatchUpConfig struct {
	Fetch  string       `koanf:"fetch"`
	Limit  int          `koanf:"limit"`
	Done   DoneConfig   `koanf:"done"`
	Newest NewestConfig `koanf:"newest"`
	// DirectConv and GroupConv name a user's conversations as the server
	// does, so that a device has a place in each from its first login,
	// before anything was said in it.
	DirectConv string `koanf:"direct_conv"`
	GroupConv  string `koanf:"group_conv"`
}

// NewestConfig is the request for the newest seq of each of the user's
// conversations: what shows a device that the last messages of a
// conversation never reached it, which no later message would.
type NewestConfig struct {
	Send  string         `koanf:"send"`
	Reply map[string]any `koanf:"reply"`
	// Convs is the path of an object mapping each conversation to its
	// newest seq, or, with Conv and Seq, of a list of objects holding
	// them.
	Convs string `koanf:"convs"`
	Conv  string `koanf:"conv"`
	Seq   string `koanf:"seq"`
}

// DoneConfig says which frame ends a fetch's answer.
type DoneConfig struct {
	Match map[string]any `koanf:"match"`
	ID    string         `koanf:"id"`
	Last  string         `koanf:"last"`
	// Deliveries, if set, is a list of the fetched messages inside the
	// answer itself (Centrifugo's history.publications).
	Deliveries ListConfig `koanf:"deliveries"`
}

// ListConfig is a list of deliveries inside a reply: the path of the
// array, and the paths of each element's fields, from the element.
type ListConfig struct {
	List string `koanf:"list"`
	Body string `koanf:"body"`
	Seq  string `koanf:"seq"`
	From string `koanf:"from"`
}

// KeepaliveConfig is the session's keepalive.
type KeepaliveConfig struct {
	// Ping is websocket, none, or an application ping's template.
	Ping string `koanf:"ping"`
	// Pong is the rule of the server's answer to an application ping.
	Pong   map[string]any `koanf:"pong"`
	Answer []any          `koanf:"answer"`
}

// DisconnectsConfig maps how a server ends a session to a reason.
type DisconnectsConfig struct {
	CloseCodes map[string]string `koanf:"close_codes"`
	Frames     []any             `koanf:"frames"`
}

// DefaultConfig is the section's default: no mapping, which the driver
// refuses (a jsonws target needs one); the defaults of the keys a mapping
// leaves out.
func DefaultConfig() Config {
	return Config{
		Framing:   framingObject,
		MaxFrame:  1 << 20,
		Token:     TokenConfig{Source: "none", Algorithm: "HS256", TTL: time.Hour},
		CatchUp:   CatchUpConfig{Limit: 100},
		Keepalive: KeepaliveConfig{Ping: "websocket"},
	}
}

// help describes each key of the section, for imcanary config keys.
var help = map[string]string{
	"framing":                       "how messages sit in text frames: object (one JSON value per frame), lines (newline-separated) or engineio (Socket.IO's Engine.IO v4)",
	"subprotocol":                   "WebSocket subprotocol to ask for, if any",
	"max_frame":                     "largest frame read, in bytes",
	"mirrors_own":                   "the server delivers what a user sends to the user's other sessions",
	"user_name.replace":             "how imcanary's user names are spelled to the server: a mapping of strings to their replacements ({\"-\": \"_\"})",
	"user_name.max_length":          "longest user name the server takes; a longer one is cut and ends in 8 hex digits of its hash",
	"token.source":                  "how {{.Token}} is made: none, jwt (signed with the target secret), hmac (hex HMAC-SHA256 of the user) or file",
	"token.algorithm":               "JWT signing algorithm: HS256, HS384 or HS512",
	"token.claims":                  "JWT claims, templates ({{.User}}); iat and exp are added from token.ttl",
	"token.ttl":                     "JWT lifetime",
	"token.file":                    "file of per-user tokens, one \"USER TOKEN\" line each (token.source file)",
	"login":                         "steps run in order on every connection: send, reply, success, reason, unauthorized, capture, otherwise",
	"subscribe.direct":              "step run after login once per direct peer ({{.Peer}}, {{.Conv}}); with target.catch_up on it may resume, list deliveries, say the newest seq and capture .Conv.x (see docs: resume, deliveries, newest, capture)",
	"subscribe.group":               "step run after login once per group ({{.Group}}, {{.Conv}}); the same keys as subscribe.direct",
	"groups.create":                 "provisioning step run once per group by its first member ({{.Group}}, {{.Members}}); its captures are kept in data_dir",
	"groups.join":                   "provisioning step run once by each other member of a group",
	"send.direct":                   "template of a direct message ({{.ID}}, {{.To}}, {{.Body}})",
	"send.group":                    "template of a group message ({{.ID}}, {{.Group}}, {{.Body}})",
	"send.ack.match":                "rule of the frames that are acks",
	"send.ack.id":                   "path of the ack's correlation id: the send's {{.ID}}",
	"send.ack.success":              "rule an accepting ack matches; an ack that does not is a rejection",
	"send.ack.code":                 "path of a rejection's code",
	"send.ack.server_id":            "path of the server's message id",
	"send.ack.seq":                  "path of the message's sequence number in its conversation",
	"send.ack.conv":                 "path of the message's conversation",
	"delivery.match":                "rule of the frames that are deliveries",
	"delivery.body":                 "path of the delivered body (a JSON string)",
	"delivery.from":                 "path of the sender",
	"delivery.conv":                 "path of the conversation",
	"delivery.seq":                  "path of the server's sequence number in the conversation; a gap in it is loss the server's own numbering shows",
	"delivery.group":                "rule of the deliveries that are group messages",
	"catch_up.fetch":                "template of a history request ({{.Conv}}, {{.After}}, {{.Since}}, {{.Before}}, {{.Limit}}, {{.ID}})",
	"catch_up.limit":                "most messages the server sends for one history request",
	"catch_up.done.match":           "rule of the frame that ends a history answer",
	"catch_up.done.id":              "path of its correlation id: the request's {{.ID}}",
	"catch_up.done.last":            "path of the conversation's newest seq in it, if the server says",
	"catch_up.done.deliveries.list": "path of an array of the fetched messages inside the answer itself, if the server sends them there (Centrifugo's history.publications) rather than as deliveries of their own",
	"catch_up.done.deliveries.body": "path of a listed message's body, from the element",
	"catch_up.done.deliveries.seq":  "path of a listed message's seq, from the element",
	"catch_up.done.deliveries.from": "path of a listed message's sender, from the element",
	"catch_up.direct_conv":          "a direct conversation's name as delivery.conv gives it ({{.User}}, {{.Peer}}; {{pair .User .Peer \":\"}} sorts the two), so that a device has a place in it from its first login",
	"catch_up.group_conv":           "a group conversation's name as delivery.conv gives it ({{.Group}})",
	"catch_up.newest.send":          "template of the request for the newest seq of each of the user's conversations ({{.ID}}), asked at login and every lost_after/4",
	"catch_up.newest.reply":         "rule of its reply ({{.ID}} allowed)",
	"catch_up.newest.convs":         "path of the reply's object of conversation to newest seq, or with conv and seq of its list of objects",
	"catch_up.newest.conv":          "path of the conversation in each object of the list at convs",
	"catch_up.newest.seq":           "path of the newest seq in each object of the list at convs",
	"keepalive.ping":                "websocket, none, or the template of an application ping",
	"keepalive.pong":                "rule of the server's answer to an application ping: read as keepalive, not counted unmatched",
	"keepalive.answer":              "the server's application pings and their answers: a list of {when: RULE, send: TEMPLATE}",
	"disconnects.close_codes":       "close codes and their reasons: slow_consumer, conflict, server_close, error (the server found the client at fault), or unauthorized (credentials refused: a login closed with it fails as unauthorized, a running session ends as server_close)",
	"disconnects.frames":            "frames that end the session: a list of {match: RULE, reason: REASON, text: PATH}",
	"ignore":                        "rules of frames known and not needed, which are not counted unmatched",
}
