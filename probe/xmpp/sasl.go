package xmpp

import (
	"bytes"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha1"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// SASL: SCRAM-SHA-1 (RFC 5802) when the server offers it, PLAIN otherwise.
//
// SCRAM is preferred for the server's sake, not only the password's: a
// server that stores salted keys (Prosody's internal_hashed) verifies PLAIN
// by running PBKDF2 at every login, which makes a population's logins the
// server's main CPU cost; SCRAM moves that work to the client, which caches
// the salted password per user and so pays it once.
//
// Passwords are treated as their UTF-8 bytes without SASLprep, which is
// exact for the ASCII passwords a monitor uses.

// maxSCRAMIterations bounds the PBKDF2 work a server can ask of us per
// login. Servers use 4096 to 10000.
const maxSCRAMIterations = 1 << 17

// saltedKey is a cached SCRAM SaltedPassword.
type saltedKey struct {
	password, salt string
	iter           int
	key            []byte
}

// saltCache remembers the salted password of each user, keyed by user and
// valid only for the same password, salt and iteration count.
type saltCache struct {
	mu sync.Mutex
	m  map[string]saltedKey
}

func (c *saltCache) get(user, password, salt string, iter int) ([]byte, error) {
	c.mu.Lock()
	k, ok := c.m[user]
	c.mu.Unlock()
	if ok && k.password == password && k.salt == salt && k.iter == iter {
		return k.key, nil
	}
	key, err := pbkdf2.Key(sha1.New, password, []byte(salt), iter, sha1.Size)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string]saltedKey)
	}
	c.m[user] = saltedKey{password: password, salt: salt, iter: iter, key: key}
	c.mu.Unlock()
	return key, nil
}

// plainAuth returns the base64 initial response of SASL PLAIN.
func plainAuth(user, password string) []byte {
	raw := make([]byte, 0, 2+len(user)+len(password))
	raw = append(raw, 0)
	raw = append(raw, user...)
	raw = append(raw, 0)
	raw = append(raw, password...)
	out := make([]byte, base64.StdEncoding.EncodedLen(len(raw)))
	base64.StdEncoding.Encode(out, raw)
	return out
}

// scramClient is one SCRAM-SHA-1 exchange.
type scramClient struct {
	cache           *saltCache
	user, password  string
	nonce           string
	clientFirstBare string
	serverSignature []byte
}

// gs2Header is "no channel binding, no authzid"; "biws" is its base64.
const (
	gs2Header   = "n,,"
	gs2Header64 = "biws"
)

func newSCRAM(cache *saltCache, user, password string) (*scramClient, error) {
	var nb [18]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, err
	}
	c := &scramClient{cache: cache, user: user, password: password, nonce: base64.RawStdEncoding.EncodeToString(nb[:])}
	c.clientFirstBare = "n=" + saslName(user) + ",r=" + c.nonce
	return c, nil
}

// saslName escapes a username for SCRAM (RFC 5802 §5.1).
func saslName(s string) string {
	s = strings.ReplaceAll(s, "=", "=3D")
	return strings.ReplaceAll(s, ",", "=2C")
}

// first returns the base64 initial response.
func (c *scramClient) first() []byte {
	return []byte(base64.StdEncoding.EncodeToString([]byte(gs2Header + c.clientFirstBare)))
}

// respond answers the server-first message (base64, as sent in
// <challenge/>) with the base64 client-final message.
func (c *scramClient) respond(challenge64 []byte) ([]byte, error) {
	serverFirst, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(challenge64)))
	if err != nil {
		return nil, fmt.Errorf("scram: server-first message: %w", err)
	}
	var nonce, salt64, iters string
	for _, f := range strings.Split(string(serverFirst), ",") {
		k, v, ok := strings.Cut(f, "=")
		if !ok || len(k) != 1 {
			return nil, fmt.Errorf("scram: malformed server-first message %q", serverFirst)
		}
		switch k {
		case "r":
			nonce = v
		case "s":
			salt64 = v
		case "i":
			iters = v
		case "m":
			return nil, errors.New("scram: server requires an unsupported extension")
		}
	}
	if !strings.HasPrefix(nonce, c.nonce) || len(nonce) == len(c.nonce) {
		return nil, errors.New("scram: server nonce does not extend ours")
	}
	salt, err := base64.StdEncoding.DecodeString(salt64)
	if err != nil || len(salt) == 0 {
		return nil, fmt.Errorf("scram: bad salt %q", salt64)
	}
	iter, err := strconv.Atoi(iters)
	if err != nil || iter < 1 || iter > maxSCRAMIterations {
		return nil, fmt.Errorf("scram: iteration count %q outside 1..%d", iters, maxSCRAMIterations)
	}
	salted, err := c.cache.get(c.user, c.password, string(salt), iter)
	if err != nil {
		return nil, fmt.Errorf("scram: %w", err)
	}
	finalNoProof := "c=" + gs2Header64 + ",r=" + nonce
	authMessage := []byte(c.clientFirstBare + "," + string(serverFirst) + "," + finalNoProof)
	clientKey := hmacSHA1(salted, []byte("Client Key"))
	storedKey := sha1.Sum(clientKey)
	proof := hmacSHA1(storedKey[:], authMessage)
	for i := range proof {
		proof[i] ^= clientKey[i]
	}
	c.serverSignature = hmacSHA1(hmacSHA1(salted, []byte("Server Key")), authMessage)
	final := finalNoProof + ",p=" + base64.StdEncoding.EncodeToString(proof)
	return []byte(base64.StdEncoding.EncodeToString([]byte(final))), nil
}

// verify checks the server-final message (base64, as sent in <success/>):
// a server that cannot prove it knows the password is not the server.
func (c *scramClient) verify(success64 []byte) error {
	if c.serverSignature == nil {
		return errors.New("scram: success before the exchange finished")
	}
	serverFinal, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(success64)))
	if err != nil {
		return fmt.Errorf("scram: server-final message: %w", err)
	}
	f := string(serverFinal)
	if e, ok := strings.CutPrefix(f, "e="); ok {
		return fmt.Errorf("scram: server error %q", e)
	}
	v, ok := strings.CutPrefix(f, "v=")
	if !ok {
		return fmt.Errorf("scram: malformed server-final message %q", f)
	}
	sig, err := base64.StdEncoding.DecodeString(v)
	if err != nil || subtle.ConstantTimeCompare(sig, c.serverSignature) != 1 {
		return errors.New("scram: server signature does not verify")
	}
	return nil
}

func hmacSHA1(key, msg []byte) []byte {
	m := hmac.New(sha1.New, key)
	m.Write(msg)
	return m.Sum(nil)
}
