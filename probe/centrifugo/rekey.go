package centrifugo

import "github.com/imcanary/imcanary/probe"

var _ probe.Rekeyer = (*Driver)(nil)

// Rekey implements probe.Rekeyer: the connection tokens signed after it,
// at a connect or a session's next refresh, use secret; so a session
// logged in moves to the new secret by its next refresh, half a token
// lifetime at most.
func (d *Driver) Rekey(secret []byte) { d.key.Set(secret) }
