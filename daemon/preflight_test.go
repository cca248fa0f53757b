package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
)

// TestPreflight holds Preflight to New: what one refuses the other
// refuses, for the same reason, and Preflight makes nothing on the way.
func TestPreflight(t *testing.T) {
	t.Setenv(config.SecretEnv, "")
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	_, shardErr := config.ParseShard("auto/3", host)
	tests := []struct {
		name   string
		change func(*config.Config)
		want   []string // in Preflight's error, in order; none: no error
	}{
		{"good", func(*config.Config) {}, nil},
		{"data_dir made later", func(c *config.Config) { c.DataDir = filepath.Join(c.DataDir, "a", "b") }, nil},
		{"too many sessions", func(c *config.Config) { c.Population.Users = 1_000_000 }, []string{"RLIMIT_NOFILE", "ip_local_port_range"}},
		{"missing secret file", func(c *config.Config) { c.Target.SecretFile = file + ".gone" }, []string{"target.secret_file"}},
		{"centrifugo without a secret", func(c *config.Config) {
			c.Target.Protocol, c.Target.URL = "centrifugo", "ws://127.0.0.1:1/connection/websocket"
		}, []string{"centrifugo", config.SecretEnv}},
		{"missing header file", func(c *config.Config) {
			c.Target.Headers = []config.Header{{Name: "X-Token", ValueFile: file + ".gone"}}
		}, []string{"target.headers[0].value_file"}},
		{"data_dir under a file", func(c *config.Config) { c.DataDir = filepath.Join(file, "data") }, []string{"data_dir"}},
		{"data_dir a file", func(c *config.Config) { c.DataDir = file }, []string{"data_dir", "not a directory"}},
	}
	if shardErr != nil {
		tests = append(tests, struct {
			name   string
			change func(*config.Config)
			want   []string
		}{"shard without an ordinal", func(c *config.Config) { c.Shard = "auto/3" }, []string{`shard "auto/3"`}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			tt.change(&cfg)
			err := Preflight(cfg)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Preflight() = %v, want nil", err)
				}
			} else {
				rest := ""
				if err != nil {
					rest = err.Error()
				}
				for _, w := range tt.want {
					i := strings.Index(rest, w)
					if i < 0 {
						t.Fatalf("Preflight() = %v, want an error with %q", err, tt.want)
					}
					rest = rest[i+len(w):]
				}
			}
			if _, statErr := os.Stat(cfg.DataDir); tt.name == "data_dir made later" && statErr == nil {
				t.Errorf("Preflight() made data_dir %s", cfg.DataDir)
			}
			d, newErr := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
			if newErr == nil {
				d.target.Close()
				d.httpLn.Close()
			}
			if (err == nil) != (newErr == nil) {
				t.Errorf("Preflight() = %v but New() = %v: they must agree", err, newErr)
			}
		})
	}
}

// TestPreflightUnwritable needs a user that permissions stop.
func TestPreflightUnwritable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes anywhere")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	for _, dataDir := range []string{dir, filepath.Join(dir, "data")} {
		cfg := testConfig(t)
		cfg.DataDir = dataDir
		if err := Preflight(cfg); err == nil || !strings.Contains(err.Error(), "data_dir") {
			t.Errorf("Preflight(data_dir %s in a read-only directory) = %v, want an error naming data_dir", dataDir, err)
		}
	}
}
