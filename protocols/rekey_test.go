package protocols

import (
	"bytes"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/probe/mqtt"
)

// TestSecretChange rotates the secret file of a target opened from each
// shipped configuration: a driver that signs with the secret takes the
// new one, and one that derives its users' passwords from it refuses,
// saying why and to restart, naming the file and never the secret.
func TestSecretChange(t *testing.T) {
	const oldSecret, newSecret = "protocols-old-secret-1d2e", "protocols-new-secret-7b4c"
	for _, tt := range []struct {
		name, file, protocol string
		// refused is what the refusal says, "" when the change is taken.
		refused string
	}{
		{name: "jsonws hmac", file: "../configs/jsonws-reference.yaml"},
		{name: "jsonws jwt", file: "../configs/talkwire.yaml"},
		{name: "jsonws password", file: "../configs/tinode.yaml",
			refused: "the jsonws driver cannot take a new secret while running (its mapping uses {{.Password}}, which it derives from it: users registered with the old secret would no longer log in): restart imcanary"},
		{name: "mqtt", file: "../configs/jsonws-reference.yaml", protocol: "mqtt"},
		{name: "xmpp", file: "../configs/jsonws-reference.yaml", protocol: "xmpp",
			refused: "the xmpp driver cannot take a new secret while running (it derives the users' passwords from it: users registered with the old secret would no longer log in): restart imcanary"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Loader().Load(tt.file, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.protocol != "" {
				cfg.Target.Protocol = tt.protocol
			}
			if tt.protocol == "mqtt" {
				// MQTT 3.1.1 sends a password only with a user name.
				m := mqtt.DefaultConfig()
				m.Username = "imcanary"
				cfg.Target.Sections = maps.Clone(cfg.Target.Sections)
				if cfg.Target.Sections == nil {
					cfg.Target.Sections = map[string]any{}
				}
				cfg.Target.Sections["mqtt"] = m
			}
			cfg.DataDir = t.TempDir()
			cfg.Target.SecretFile = filepath.Join(t.TempDir(), "secret")
			if err := os.WriteFile(cfg.Target.SecretFile, []byte(oldSecret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			target, err := Open(cfg, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			if got, err := target.SecretChange(cfg); got != nil || err != nil {
				t.Fatalf("SecretChange with the file unchanged = %q, %v; want nothing", got, err)
			}
			if err := os.WriteFile(cfg.Target.SecretFile, []byte(newSecret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := target.SecretChange(cfg)
			if tt.refused == "" {
				if err != nil || !bytes.Equal(got, []byte(newSecret)) {
					t.Fatalf("SecretChange after rotating = %v; want the new secret", err)
				}
				target.Rekey(got)
				if string(target.Secret) != newSecret {
					t.Errorf("Rekey left the old secret in use")
				}
				return
			}
			if err == nil {
				t.Fatalf("SecretChange after rotating took the new secret, want a refusal saying %q", tt.refused)
			}
			if msg := err.Error(); !strings.Contains(msg, "target.secret_file "+cfg.Target.SecretFile+" changed") ||
				!strings.Contains(msg, tt.refused) || strings.Contains(msg, newSecret) || strings.Contains(msg, oldSecret) {
				t.Errorf("refusal = %q, want it to name the file, say %q, and hold no secret", msg, tt.refused)
			}
		})
	}
}
