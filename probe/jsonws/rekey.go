package jsonws

import "github.com/imcanary/imcanary/probe"

var _ probe.RekeyChecker = (*Driver)(nil)

// Rekey implements probe.Rekeyer: the logins after it sign their tokens
// (token.source jwt or hmac) with secret. A session logged in keeps the
// token it logged in with, which the server checked once, at its login:
// jsonws renews no token within a session.
func (d *Driver) Rekey(secret []byte) { d.key.Set(secret) }

// RekeyRefusal implements probe.RekeyChecker: a mapping that uses
// {{.Password}} derives its users' passwords from the secret, and the
// users were registered with the old one.
func (d *Driver) RekeyRefusal() string {
	if d.m.password {
		return "its mapping uses {{.Password}}, which it derives from it: users registered with the old secret would no longer log in"
	}
	return ""
}
