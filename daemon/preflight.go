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
	"github.com/imcanary/imcanary/protocols"
)

// Preflight makes the checks of a loaded cfg that New makes as it opens what
// it needs, and returns every problem they find (errors.Join, one per
// line): whether this process may hold the sessions of every population
// that can run at once (open files, and ephemeral ports per source
// address), the target secret and a protocol that needs one, the headers'
// value files, the shard, and whether the run history can be kept under
// data_dir. The configuration's own rules are the Loader's, which has
// checked them. Preflight creates and changes nothing, so config check can
// call it to say whether run would start: what it cannot know is only what
// changes from one moment to the next, such as whether http.listen is
// free.
func Preflight(cfg config.Config) error {
	errs := []error{
		protocols.CheckCapacity(cfg, populations(cfg), protocols.InProcess(cfg)),
		protocols.CheckSecret(cfg),
	}
	host, _ := os.Hostname()
	if _, err := config.ParseShard(cfg.Shard, host); err != nil {
		errs = append(errs, fmt.Errorf("shard %q: %w", cfg.Shard, err))
	}
	// The history is kept there; so is a protocol's own secret when none
	// is configured.
	errs = append(errs, checkDataDir(cfg.DataDir))
	return errors.Join(errs...)
}

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
