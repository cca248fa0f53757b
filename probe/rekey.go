package probe

import (
	"bytes"
	"sync/atomic"
)

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
