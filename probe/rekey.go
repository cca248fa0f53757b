package probe

import (
	"bytes"
	"sync/atomic"
)

// Rekeyer is a Driver that takes a new target secret while it runs, for a
// reload after the secret file was rotated: the logins and token refreshes
// after Rekey sign with the new secret, and sessions logged in already stay
// as they are. A driver that derives its users' passwords from the secret
// does not implement it: a new secret would lock out the users it
// registered with the old one; one that does for some configurations only
// says which by RekeyChecker.
type Rekeyer interface {
	Rekey(secret []byte)
}

// Key holds a target secret that Rekey can replace while sessions read it.
// The zero Key holds none.
type Key struct{ p atomic.Pointer[[]byte] }

// NewKey returns a Key holding a copy of secret (none for nil).
func NewKey(secret []byte) *Key {
	k := &Key{}
	k.Set(secret)
	return k
}

// Bytes returns the secret in use, nil for none. The caller must not
// change it.
func (k *Key) Bytes() []byte {
	if b := k.p.Load(); b != nil {
		return *b
	}
	return nil
}

// Set puts a copy of secret in use; nil holds none.
func (k *Key) Set(secret []byte) {
	if secret == nil {
		k.p.Store(nil)
		return
	}
	b := bytes.Clone(secret)
	k.p.Store(&b)
}

// RekeyChecker is a Rekeyer whose configuration decides whether it can
// take a new secret: a mapped protocol signs with it in some mappings and
// derives passwords from it in others. RekeyRefusal returns why it cannot
// ("" when it can), which the reload's refusal gives the operator.
type RekeyChecker interface {
	Rekeyer
	RekeyRefusal() string
}
