package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/centrifugo"
	"github.com/imcanary/imcanary/probe/embedded"
	"github.com/imcanary/imcanary/probe/xmpp"
	"github.com/imcanary/imcanary/target"
)

// drivers maps target.protocol to its adapter: the one place that lists
// them.
var drivers = map[string]func(cfg config.Config, secret []byte) (probe.Driver, error){
	"embedded": func(cfg config.Config, secret []byte) (probe.Driver, error) {
		return embedded.New(embedded.Options{URL: cfg.Target.URL, Secret: secret, Heartbeat: cfg.Population.Heartbeat})
	},
	"xmpp": func(cfg config.Config, secret []byte) (probe.Driver, error) {
		if secret == nil {
			return nil, fmt.Errorf("xmpp derives the users' passwords from the target secret: set target.secret_file or %s", config.SecretEnv)
		}
		x := cfg.Target.XMPP
		return xmpp.New(xmpp.Options{
			URL: cfg.Target.URL, Domain: x.Domain, MUCService: x.MUCService, Register: x.Register, Resume: x.Resume,
			Heartbeat: cfg.Population.Heartbeat,
			// Each user's password is an HMAC of its name: one secret
			// provisions and logs in every user, none is written down.
			Password: func(user string) string { return target.Token(secret, user) },
		})
	},
	"centrifugo": func(cfg config.Config, secret []byte) (probe.Driver, error) {
		if secret == nil {
			return nil, fmt.Errorf("centrifugo needs the token secret: set target.secret_file or %s", config.SecretEnv)
		}
		c := cfg.Target.Centrifugo
		return centrifugo.New(centrifugo.Options{
			URL: cfg.Target.URL, Secret: secret, GroupNamespace: c.GroupNamespace, DirectNamespace: c.DirectNamespace,
			TokenTTL: c.TokenTTL, Heartbeat: cfg.Population.Heartbeat, Recover: c.Recover,
		})
	},
}

// env is what every command that talks to a target needs: the driver, and
// the embedded target when it runs in this process.
type env struct {
	cfg    config.Config // with target.url filled in for an in-process target
	driver probe.Driver
	secret []byte
	run    string

	target   *target.Server
	targetLn net.Listener
	wg       sync.WaitGroup
	stop     context.CancelFunc
}

// newEnv builds the driver for cfg. users is how many sessions the command
// will hold, for the open-file check. With protocol embedded and no URL it
// opens an embedded target's listener on a free loopback port; startTarget
// serves it.
func newEnv(cfg config.Config, users int, log *slog.Logger) (*env, error) {
	e := &env{cfg: cfg, run: newRunID()}
	inProcess := cfg.Target.Protocol == "embedded" && cfg.Target.URL == ""
	if err := checkFileLimit(users, inProcess); err != nil {
		return nil, err
	}
	secret, err := loadSecret(cfg)
	if err != nil {
		return nil, err
	}
	e.secret = secret
	if e.secret == nil && cfg.Target.Protocol == "xmpp" {
		// XMPP passwords are imcanary's own: with no secret configured,
		// one is made once and kept in the data directory, so that the
		// users registered today can still log in after a restart.
		if e.secret, err = localSecret(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if inProcess {
		if e.secret == nil {
			e.secret = make([]byte, 32)
			_, _ = rand.Read(e.secret)
		}
		ts, err := target.New(target.Options{Secret: e.secret, Logger: log.With("component", "target")})
		if err != nil {
			return nil, fmt.Errorf("embedded target: %w", err)
		}
		e.target = ts
		if e.targetLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("embedded target: %w", err)
		}
		e.cfg.Target.URL = "ws://" + e.targetLn.Addr().String() + "/ws"
	}
	newDriver, found := drivers[e.cfg.Target.Protocol]
	if !found {
		e.close()
		return nil, fmt.Errorf("target.protocol: %q: no such driver", e.cfg.Target.Protocol)
	}
	if e.driver, err = newDriver(e.cfg, e.secret); err != nil {
		e.close()
		return nil, fmt.Errorf("target.protocol %s: %w", e.cfg.Target.Protocol, err)
	}
	return e, nil
}

// startTarget serves the in-process target, if any, until close.
func (e *env) startTarget(log *slog.Logger) {
	if e.target == nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	e.stop = stop
	log.Info("embedded target listening", "url", e.cfg.Target.URL)
	// Exits when close cancels ctx.
	e.wg.Go(func() {
		if err := e.target.Serve(ctx, e.targetLn); err != nil {
			log.Error("embedded target stopped", "err", err)
		}
	})
}

// close stops the in-process target and waits for it.
func (e *env) close() {
	if e.stop != nil {
		e.stop()
		e.wg.Wait()
		return
	}
	if e.targetLn != nil {
		e.targetLn.Close()
	}
}

// checkFileLimit refuses more sessions than the process can hold: each is
// an open file, twice over when the embedded target runs in-process.
func checkFileLimit(users int, inProcess bool) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	need := uint64(users) + 64
	how := ""
	if inProcess {
		need += uint64(users)
		how = " (two per user: the embedded target runs in this process)"
	}
	if need > lim.Cur {
		return fmt.Errorf("population.users: %d sessions in all need about %d open files%s but the limit (RLIMIT_NOFILE) is %d: "+
			"raise the limit, lower the user counts, or run more shards", users, need, how, lim.Cur)
	}
	return nil
}

// loadSecret reads the target secret from target.secret_file, else from
// the environment. It returns nil when neither is set.
func loadSecret(cfg config.Config) ([]byte, error) {
	if f := cfg.Target.SecretFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			// The error names the file, never its content.
			return nil, fmt.Errorf("target.secret_file: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return nil, fmt.Errorf("target.secret_file: %s is empty", f)
		}
		return []byte(s), nil
	}
	if s := os.Getenv(config.SecretEnv); s != "" {
		return []byte(s), nil
	}
	return nil, nil
}

// localSecret reads DIR/secret, creating it with a random secret the first
// time (mode 0600; the secret is never logged).
func localSecret(dir string) ([]byte, error) {
	path := filepath.Join(dir, "secret")
	if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return bytes.TrimSpace(b), nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	s := []byte(hex.EncodeToString(b))
	// O_EXCL: if another process made it meanwhile, use theirs.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return localSecret(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	if _, err := f.Write(s); err != nil {
		f.Close()
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	return s, f.Close()
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
