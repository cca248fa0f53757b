package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/imcanary/imcanary/config"
)

// Preflight makes the checks of cfg that New makes before it opens
// anything, and returns every problem they find (errors.Join, one per
// line): the configuration's own rules (Validate), whether this process may
// hold the sessions of every population that can run at once (open files,
// and ephemeral ports per source address), the target secret and a driver
// that needs one, the headers' value files, the shard, and whether the run history can be kept under
// data_dir. It creates and changes nothing, so config check can call it to
// say whether run would start: what it cannot know is only what changes
// from one moment to the next, such as whether http.listen is free.
func Preflight(cfg config.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var errs []error
	pops := populations(cfg)
	users := 0
	for _, n := range pops {
		users += n
	}
	// As newEnv decides it: the reference server runs in this process
	// when there is no URL, and its connections count too.
	inProcess := cfg.Target.Protocol == "embedded" && cfg.Target.URL == ""
	errs = append(errs, checkFileLimit(users, inProcess))
	if sources, err := config.ParseSourceAddrs(cfg.Population.SourceAddrs); err != nil {
		errs = append(errs, fmt.Errorf("population.source_addrs: %w", err))
	} else {
		errs = append(errs, checkPorts(pops, len(sources), ephemeralPorts()))
	}
	secret, err := loadSecret(cfg)
	errs = append(errs, err)
	if _, err := requestHeader(cfg.Target.Headers); err != nil {
		errs = append(errs, err)
	}
	if err == nil && secret == nil && needsSecret[cfg.Target.Protocol] {
		errs = append(errs, fmt.Errorf("target.protocol %s: needs the target secret, which signs its tokens: set target.secret_file or %s",
			cfg.Target.Protocol, config.SecretEnv))
	}
	host, _ := os.Hostname()
	if _, err := config.ParseShard(cfg.Shard, host); err != nil {
		errs = append(errs, fmt.Errorf("shard %q: %w", cfg.Shard, err))
	}
	// The history is kept there; so is xmpp's own secret when none is
	// configured.
	errs = append(errs, checkDataDir(cfg.DataDir))
	return errors.Join(errs...)
}

// needsSecret are the protocols whose driver refuses to start without the
// target secret (see drivers): centrifugo signs its connection tokens with
// it. xmpp makes one of its own under data_dir instead.
var needsSecret = map[string]bool{"centrifugo": true}

// checkDataDir checks that history.Open can keep the run history in dir:
// that dir is a directory this process may write to, or can be made in the
// nearest directory above it that exists. It writes nothing.
func checkDataDir(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) && filepath.Dir(d) != d {
			// Made by history.Open, if what is above allows; a file
			// above is found and named on the way up.
			continue
		}
		switch {
		case err != nil:
			return fmt.Errorf("data_dir %q: %w", dir, err)
		case !fi.IsDir():
			return fmt.Errorf("data_dir %q: %s is not a directory", dir, d)
		}
		// Write to add entries, search to reach them; access(2) also
		// answers for a read-only file system, which root cannot write
		// either.
		if err := unix.Access(d, unix.W_OK|unix.X_OK); err != nil {
			if d == dir {
				return fmt.Errorf("data_dir %q: cannot write to it: %w", dir, err)
			}
			return fmt.Errorf("data_dir %q: cannot create it in %s: %w", dir, d, err)
		}
		return nil
	}
}
