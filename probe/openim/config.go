package openim

import (
	"errors"
	"fmt"
	"net/url"
	"slices"

	"github.com/imcanary/imcanary/config"
)

// Config is the target.openim section. target.url is the message
// gateway's WebSocket (ws://HOST:10001); the REST API is apart.
type Config struct {
	// APIURL is OpenIM's REST API (http://HOST:10002): the admin token,
	// user registration, user tokens and groups.
	APIURL string `koanf:"api_url"`
	// AdminUserID is the admin that gets the admin token with the API
	// secret (share.yml imAdminUserID).
	AdminUserID string `koanf:"admin_user_id"`
	// Platforms are the OpenIM platform ids the devices of a user log in
	// as, device i as Platforms[i]. Under OpenIM's default login policy
	// a second connection on one platform kicks the first, so each
	// device needs its own.
	Platforms []int `koanf:"platforms"`
	// MaxConnections bounds the REST API's HTTP connections.
	MaxConnections int `koanf:"max_connections"`
	// MaxFrame bounds one frame read from the gateway.
	MaxFrame int `koanf:"max_frame"`
}

// DefaultConfig is the section's default. Web first: OpenIM pings only
// that platform's clients, as its JS SDK is, and the others as a desktop
// and a mobile client of the same user are.
func DefaultConfig() Config {
	return Config{
		APIURL: "http://127.0.0.1:10002", AdminUserID: "imAdmin",
		Platforms:      []int{webPlatform, 3, 4, 7, 2, 1, 6, 8, 9},
		MaxConnections: 64, MaxFrame: 4 << 20,
	}
}

// webPlatform is OpenIM's Web platform id (constant.WebPlatformID); the
// gateway pings only its connections.
const webPlatform = 5

// Validate returns what is wrong with the section, naming each key.
func (c Config) Validate() []*config.ValidationError {
	var out []*config.ValidationError
	bad := func(key string, v any, err error) {
		out = append(out, &config.ValidationError{Key: key, Value: v, Err: err})
	}
	if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("api_url", c.APIURL, errors.New("must be the REST API's http:// or https:// URL, such as http://127.0.0.1:10002"))
	}
	if c.AdminUserID == "" {
		bad("admin_user_id", c.AdminUserID, errors.New("must name OpenIM's admin user (share.yml imAdminUserID)"))
	}
	if len(c.Platforms) == 0 {
		bad("platforms", c.Platforms, errors.New("must list at least one platform id"))
	}
	for i, p := range c.Platforms {
		// 10 is the admin platform: not a device's.
		if p < 1 || p > 9 {
			bad("platforms", c.Platforms, fmt.Errorf("platform %d: must be a device platform, 1 to 9", p))
		}
		if slices.Index(c.Platforms, p) != i {
			bad("platforms", c.Platforms, fmt.Errorf("platform %d listed twice: two devices on one platform kick each other", p))
		}
	}
	if c.MaxConnections < 1 || c.MaxConnections > 65536 {
		bad("max_connections", c.MaxConnections, errors.New("must be between 1 and 65536"))
	}
	if c.MaxFrame < 64<<10 || c.MaxFrame > 64<<20 {
		bad("max_frame", c.MaxFrame, fmt.Errorf("must be between %d and %d bytes", 64<<10, 64<<20))
	}
	return out
}
