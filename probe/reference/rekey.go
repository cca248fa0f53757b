package reference

import "github.com/imcanary/imcanary/probe"

var _ probe.Rekeyer = (*Driver)(nil)

// Rekey implements probe.Rekeyer: the logins after it sign their tokens
// with secret. A session logged in keeps its token, which the server
// checked once, at its login.
func (d *Driver) Rekey(secret []byte) { d.key.Set(secret) }
