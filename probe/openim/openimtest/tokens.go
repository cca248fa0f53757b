package openimtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/openimsdk/protocol/constant"
)

// tokenTTL is config/openim-rpc-auth.yml's tokenPolicy.expire, 90 days;
// GetAdminToken and GetUserToken answer it in seconds
// (internal/rpc/auth/auth.go:103, 129).
const tokenTTL = 90 * 24 * time.Hour

// claims are tools tokenverify.Claims (tokenverify/jwt_token.go:27-31),
// plus a random jti: the real claims carry only the user, the platform
// and second-resolution times, so two tokens issued to the same
// (user, platform) within a second are the same string there; here every
// token is distinct.
type claims struct {
	UserID     string
	PlatformID int
	jwt.RegisteredClaims
}

// tokens is the auth service's token state: OpenIM keeps, in Redis, a map
// token→state per (user, platform) (storage/controller/auth.go), and a
// valid JWT is accepted only while its entry says NormalToken. The
// signing key is random per server (the real one signs with
// share.yml's secret); the tokens are opaque to clients either way.
type tokens struct {
	key    []byte
	admins []string

	mu sync.Mutex
	n  uint64 // issue order, to keep the newest token of a platform
	// by user, then platform: token → state (constant.NormalToken or
	// constant.KickedToken) and when it was issued.
	m map[string]map[int]map[string]tokenEntry
}

type tokenEntry struct {
	state int
	n     uint64
}

func newTokens(admins []string) (*tokens, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &tokens{key: key, admins: admins, m: make(map[string]map[int]map[string]tokenEntry)}, nil
}

func (t *tokens) isAdmin(userID string) bool {
	for _, a := range t.admins {
		if a == userID {
			return true
		}
	}
	return false
}

// issue is authDatabase.CreateToken (storage/controller/auth.go:82-125)
// under multiLogin policy 1, AllLoginButSameTermKick (config/share.yml:
// 16-17): before the new token is stored, every NormalToken of the same
// platform becomes KickedToken, other platforms keep their newest one
// (checkToken, auth.go:164-170), and the same platform's tokens that were
// already kicked are deleted (auth.go:94-99: the delete goes to the new
// platform's key only, so other platforms' kicked tokens stay). A kicked
// token answers TokenKickedError until a later issue on its platform
// deletes it; then it answers TokenNotExistError. Admin tokens are never
// stored, so nothing kicks them (auth.go:83, 118).
func (t *tokens) issue(userID string, platformID int) (string, error) {
	jti := make([]byte, 16)
	if _, err := rand.Read(jti); err != nil {
		return "", err
	}
	now := time.Now()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{
		UserID:     userID,
		PlatformID: platformID,
		RegisteredClaims: jwt.RegisteredClaims{
			ExpiresAt: jwt.NewNumericDate(now.Add(tokenTTL)),
			// tokenverify.BuildClaims backdates issue by 5 s.
			IssuedAt: jwt.NewNumericDate(now.Add(-5 * time.Second)),
			ID:       hex.EncodeToString(jti),
		},
	}).SignedString(t.key)
	if err != nil {
		return "", err
	}
	if t.isAdmin(userID) {
		return tok, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	byPlatform := t.m[userID]
	if byPlatform == nil {
		byPlatform = make(map[int]map[string]tokenEntry)
		t.m[userID] = byPlatform
	}
	for plt, m := range byPlatform {
		var newest string
		for k, e := range m {
			if e.state == constant.NormalToken && (newest == "" || e.n > m[newest].n) {
				newest = k
			}
		}
		for k, e := range m {
			switch {
			case e.state != constant.NormalToken:
				if plt == platformID {
					delete(m, k)
				}
			case plt == platformID || k != newest:
				m[k] = tokenEntry{state: constant.KickedToken, n: e.n}
			}
		}
	}
	m := byPlatform[platformID]
	if m == nil {
		m = make(map[string]tokenEntry)
		byPlatform[platformID] = m
	}
	t.n++
	m[tok] = tokenEntry{state: constant.NormalToken, n: t.n}
	return tok, nil
}

// parse is the auth service's parseToken (internal/rpc/auth/auth.go:
// 133-160) with the JWT errors of tools tokenverify (jwt_token.go:47-72).
func (t *tokens) parse(tok string) (userID string, platformID int, err error) {
	var c claims
	_, err = jwt.ParseWithClaims(tok, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}))
	switch {
	case err == nil:
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "", 0, newCode(codeTokenMalformed, "jwt parse error")
	case errors.Is(err, jwt.ErrTokenExpired):
		return "", 0, newCode(codeTokenExpired, "jwt parse error")
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "", 0, newCode(codeTokenNotValidYet, "jwt parse error")
	default:
		return "", 0, newCode(codeTokenUnknown, "%s", err.Error())
	}
	if t.isAdmin(c.UserID) {
		return c.UserID, c.PlatformID, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.m[c.UserID][c.PlatformID]
	e, ok := m[tok]
	switch {
	case !ok:
		return "", 0, newCode(codeTokenNotExist, "token not in the user's token map")
	case e.state == constant.NormalToken:
		return c.UserID, c.PlatformID, nil
	case e.state == constant.KickedToken:
		return "", 0, newCode(codeTokenKicked, "token kicked")
	default:
		return "", 0, newCode(codeTokenUnknown, "token state %d", e.state)
	}
}

// invalidate is InvalidateToken (internal/rpc/auth/auth.go:216-239), what
// the gateway calls after a same-platform login kicked older connections
// (internal/msggateway/ws_server.go:357-365): every token of the
// platform but the new connection's own becomes KickedToken. A client
// that reconnects with the token it already had keeps it valid.
func (t *tokens) invalidate(userID string, platformID int, preserved string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.m[userID][platformID] {
		if k != preserved {
			t.m[userID][platformID][k] = tokenEntry{state: constant.KickedToken, n: e.n}
		}
	}
}
