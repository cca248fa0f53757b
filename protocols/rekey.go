package protocols

import (
	"bytes"
	"fmt"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// SecretChange reads the target secret of next, a configuration a reload
// is about to apply, from target.secret_file as Open read it, and returns
// it when it differs from the one in use; nil when it is the same or
// comes from elsewhere (the environment, which a process cannot see
// change, or data_dir). It changes nothing: Rekey does. A change this
// target cannot take while running is an error saying why, naming the
// file and never what is in it.
func (t *Target) SecretChange(next config.Config) ([]byte, error) {
	f := next.Target.SecretFile
	if f == "" {
		return nil, nil
	}
	secret, err := loadSecret(next)
	if err != nil {
		return nil, err
	}
	if bytes.Equal(secret, t.Secret) {
		return nil, nil
	}
	if t.server != nil {
		return nil, fmt.Errorf("target.secret_file %s changed, but the reference server this process runs keeps the secret it started with: restart imcanary to use the new one", f)
	}
	_, ok := t.Driver.(probe.Rekeyer)
	why := ""
	if c, checks := t.Driver.(probe.RekeyChecker); checks {
		if r := c.RekeyRefusal(); r != "" {
			ok, why = false, " ("+r+")"
		}
	}
	if !ok {
		if a, found := Lookup(t.Config.Target.Protocol); why == "" && found &&
			a.SecretNeed(config.Section[any](t.Config, a.Config.Name, a.Config.Section)) == probe.SecretKept {
			why = " (it derives the users' passwords from it: users registered with the old secret would no longer log in)"
		}
		return nil, fmt.Errorf("target.secret_file %s changed, but the %s driver cannot take a new secret while running%s: restart imcanary to use it",
			f, t.Config.Target.Protocol, why)
	}
	return secret, nil
}

// Rekey puts secret, from SecretChange, in use: the logins and token
// refreshes after it sign with it. The caller serialises it with
// SecretChange (a reload at a time).
func (t *Target) Rekey(secret []byte) {
	t.Driver.(probe.Rekeyer).Rekey(secret)
	t.Secret = secret
}
