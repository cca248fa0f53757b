package mqtt

import "github.com/imcanary/imcanary/probe"

var _ probe.Rekeyer = (*Driver)(nil)

// Rekey implements probe.Rekeyer: the CONNECTs after it carry secret as
// their password. The broker checks a password once, at CONNECT, so a
// session connected already stays; imcanary registered nothing with the
// old one (a broker's users are its operator's), so none is locked out.
func (d *Driver) Rekey(secret []byte) { d.password.Set(secret) }
