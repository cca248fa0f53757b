package openim

import "time"

// SetToken puts tok in the driver's cache as user's token on platform, as
// if OpenIM had issued it: a test of what a refused token does.
func (d *Driver) SetToken(user string, platform int32, tok string) {
	d.tmu.Lock()
	d.tokens[tokenKey{user, platform}] = userTok{token: tok, exp: time.Now().Add(time.Hour)}
	d.tmu.Unlock()
}
