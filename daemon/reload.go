package daemon

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/report"
)

// WithReload lets the daemon reload its configuration (SIGHUP, POST
// /-/reload) from load, which reads the same sources as the first load did:
// the file, the environment and the command line.
func WithReload(load func() (config.Config, error)) Option {
	return func(d *Daemon) { d.load = load }
}

// WithReloadEndpoint serves POST /-/reload when on (the default).
func WithReloadEndpoint(on bool) Option {
	return func(d *Daemon) { d.noReloadEndpoint = !on }
}

// liveKeys are what a reload applies while everything runs: the population's
// size (a block of users added or removed, nobody else reconnected), and
// the schedules and profiles of the canary and soak runs (the scheduler
// rebuilt, no session touched). Every other key is fixed at start: a change
// to it is refused, naming it, and the running configuration stays.
var liveKeys = map[string]bool{
	"population.users": true,
	"canary.schedule":  true,
	"canary.jitter":    true,
	// Read at each failed round.
	"canary.retry_after": true,
	"soak.profiles":      true,
}

// Reload reads the configuration again and applies it, or returns why not.
// On any error the running configuration stays, whole.
// imcanary_config_last_reload_successful says which.
func (d *Daemon) Reload() error {
	_, err := d.reloadChanges()
	return err
}

// secretChanged is how a reload's changes name a new target secret: the
// file's contents changed, not the key, and never what they are.
const secretChanged = "target secret (contents of target.secret_file)"

// reloadChanges is Reload, returning what changed: the keys, and
// secretChanged for a rotated secret file.
func (d *Daemon) reloadChanges() ([]string, error) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	changed, err := d.reload()
	if err != nil {
		d.metrics.ConfigLastReloadOK.Set(0)
		d.log.Error("configuration reload failed; the running configuration stays", "err", err)
		return nil, err
	}
	d.metrics.ConfigLastReloadOK.Set(1)
	d.metrics.ConfigLastReloadSuccess.SetToCurrentTime()
	d.log.Info("configuration reloaded", "changed", changed)
	return changed, nil
}

func (d *Daemon) reload() ([]string, error) {
	if d.load == nil {
		return nil, errors.New("reload: this daemon has no configuration source to read again")
	}
	d.curMu.RLock()
	jobs, running := d.jobs, d.sched != nil
	d.curMu.RUnlock()
	if !running {
		return nil, errors.New("reload: the daemon is not running")
	}
	next, err := d.load()
	if err != nil {
		return nil, err
	}
	if d.target.InProcess() && next.Target.URL == "" {
		// As at start: an empty URL is the reference server this process
		// runs, whose URL New filled in.
		next.Target.URL = d.cfg.Target.URL
	}
	cur := d.current()
	changed := protocols.Loader().Changed(cur, next)
	var fixed []string
	for _, k := range changed {
		if !liveKeys[k] {
			fixed = append(fixed, k)
		}
	}
	if len(fixed) > 0 {
		return nil, fmt.Errorf("reload: %s changed: only population.users, canary.schedule, canary.jitter, canary.retry_after and soak.profiles "+
			"apply while running; restart imcanary for the rest", strings.Join(fixed, ", "))
	}
	if (cur.Canary.Schedule == "") != (next.Canary.Schedule == "") {
		return nil, errors.New("reload: canary.schedule: turning the canary on or off needs a restart (its users log in at start)")
	}
	// Read after the keys' check: a file that moved is a key's change.
	secret, err := d.target.SecretChange(next)
	if err != nil {
		return nil, fmt.Errorf("reload: %w", err)
	}
	for _, dep := range next.Deprecated {
		d.log.Warn(dep)
	}
	if secret != nil {
		changed = append(changed, secretChanged)
	}
	if len(changed) == 0 {
		return nil, nil
	}
	if err := d.checkCapacity(next); err != nil {
		return nil, err
	}
	sched, err := d.schedule(jobs, next)
	if err != nil {
		return nil, err
	}
	if next.Population.Users != cur.Population.Users {
		if err := d.bg.resize(next.Population.Users); err != nil {
			return nil, err
		}
	}
	for _, pr := range next.Soak.Profiles {
		d.registerProfile(pr)
	}
	d.curMu.Lock()
	d.cur = next
	old := d.sched
	d.sched = sched
	d.curMu.Unlock()
	sched.Start()
	// Jobs already running go on: their context is jobs, not the
	// scheduler's.
	old.Stop()
	// A new schedule has a new next round: the gauge the canary-stopped
	// alert reads must not keep the old one's.
	d.setCanaryDue(time.Now())
	if secret != nil {
		// Last: nothing after it can fail, so a refused reload never
		// leaves the new secret half applied.
		d.target.Rekey(secret)
		d.log.Info("target secret changed: new logins and token refreshes use it; sessions logged in stay", "file", next.Target.SecretFile)
	}
	return changed, nil
}

// checkCapacity checks the file and port headroom of next's populations,
// as New checked the first configuration's.
func (d *Daemon) checkCapacity(next config.Config) error {
	return protocols.CheckCapacity(next, populations(next), d.target.InProcess())
}

// populations lists the sizes of the populations cfg may run at once.
func populations(cfg config.Config) []int {
	// Sessions, not users: each device of a user is a connection.
	pops := []int{cfg.Population.Users * cfg.Population.Devices}
	if cfg.Canary.Schedule != "" {
		pops = append(pops, cfg.Canary.Users)
	}
	soakUsers := 0
	for _, p := range cfg.Soak.Profiles {
		// One soak runs at a time: the largest is what must fit.
		soakUsers = max(soakUsers, p.MostUsers()*max(p.Devices, 1))
	}
	if soakUsers > 0 {
		pops = append(pops, soakUsers)
	}
	return pops
}

// registerProfile makes a profile's series exist from the start, at 0.
func (d *Daemon) registerProfile(p config.Profile) {
	t, name := d.cfg.Target.Name, p.Name
	if p.Search.Vary != "" {
		// A search's results are its own; its steps are not soak runs.
		for _, r := range []string{report.SearchFound, report.SearchNoLimit, report.SearchBelowStart, report.SearchInconclusive, report.SearchAborted} {
			d.metrics.SearchRuns.WithLabelValues(t, name, r)
		}
	} else {
		for _, r := range []string{metrics.ResultPass, metrics.ResultFail, metrics.ResultAborted, metrics.ResultInconclusive} {
			d.metrics.SoakRuns.WithLabelValues(t, name, r)
		}
	}
	d.metrics.SoakSkipped.WithLabelValues(t, name)
	d.metrics.SoakRunning.WithLabelValues(t, name)
}

// reloadAnswer is POST /-/reload's answer to a reload that succeeded.
func reloadAnswer(changed []string) string {
	if len(changed) == 0 {
		return "configuration reloaded: nothing changed"
	}
	return "configuration reloaded: changed " + strings.Join(changed, ", ")
}
