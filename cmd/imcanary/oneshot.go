package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/canary"
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/soak"
)

// errFailed makes a command exit 1 after it has printed its own verdict.
var errFailed = errors.New("failed")

// commonFlags registers what the one-shot commands take: the file, the
// log, and the configuration keys that cmd uses.
func commonFlags(fs *pflag.FlagSet, cmd config.Command) (cfgFile, logLevel, logFormat *string) {
	cfgFile = fs.String("config", "", "configuration file (YAML); without it, a reference server in-process")
	logLevel = fs.String("log.level", "warn", "log level: debug, info, warn, error")
	logFormat = fs.String("log.format", "text", "log format: text or json")
	protocols.Loader().RegisterCommandFlags(fs, cmd)
	return
}

func runCanary(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("canary", stdout, stderr)
	once := fs.Bool("once", false, "run one round and exit: 0 pass, 1 fail, 2 bad usage or configuration, 3 push failed")
	pushOpt := pushFlags(fs, pushJobCanary)
	cfgFile, logLevel, logFormat := commonFlags(fs, config.CommandCanary)
	if err := parseFlags(fs, "canary", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	if !*once {
		return usageError{errors.New("--once is required: scheduled rounds run inside 'imcanary run'")}
	}
	if err := pushOpt.check(); err != nil {
		return usageError{err}
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg, err := protocols.Loader().Load(*cfgFile, os.Environ(), fs)
	if err != nil {
		return badConfig(err)
	}
	r, err := canary.Once(ctx, cfg, log, 30*time.Second)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return badConfig(err)
	}
	if err := report.WriteRoundText(stdout, r); err != nil {
		return err
	}
	var verdict, pushErr error
	if r.Result != metrics.ResultPass {
		verdict = errFailed
	}
	if pushOpt.gateway != "" {
		pushErr = pushOpt.push(ctx, canaryPushRegistry(r), pushJobCanary, verdict == nil, "target", r.Target)
	}
	return verdictAndPush(verdict, pushErr, func(err error) { printError(stderr, "canary", err) })
}

func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "pin" {
		return runSoakPin(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "merge" {
		return runSoakMerge(args[1:], stdout, stderr)
	}
	fs := newFlags("soak", stdout, stderr)
	profile := fs.String("profile", "", "name of the soak profile to run (from soak.profiles)")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file")
	htmlOut := fs.String("html", "", "also write the report as HTML to this file")
	startAt := fs.String("start_at", "", "start the run at this time (RFC 3339, such as 2026-12-07T03:00:00Z), so that the shards of one run (--shard) start together; a time already past is refused")
	pushOpt := pushFlags(fs, pushJobSoak)
	cfgFile, logLevel, logFormat := commonFlags(fs, config.CommandSoak)
	if err := parseFlags(fs, "soak", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	if *profile == "" {
		return usageError{errors.New("--profile is required")}
	}
	var at time.Time
	if *startAt != "" {
		var err error
		if at, err = time.Parse(time.RFC3339, *startAt); err != nil {
			return usageError{fmt.Errorf("--start_at %q: want an RFC 3339 time such as 2026-12-07T03:00:00Z", *startAt)}
		}
	}
	if err := pushOpt.check(); err != nil {
		return usageError{err}
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg, err := protocols.Loader().Load(*cfgFile, os.Environ(), fs)
	if err != nil {
		return badConfig(err)
	}
	// The run writes data_dir's history, as a daemon does: one process
	// at a time (see history.Acquire).
	lock, err := history.Acquire(cfg.DataDir, "imcanary soak --profile "+*profile)
	if err != nil {
		return badConfig(err)
	}
	defer lock.Release()
	if p, ok := cfg.Profile(*profile); ok && p.Search.Vary != "" {
		return runSearch(ctx, cfg, *profile, log, *jsonOut, *htmlOut, pushOpt.gateway, stdout, stderr)
	}
	if !at.IsZero() {
		// Checked once the configuration is known good, so that a bad
		// one fails now rather than at the start time.
		if late := time.Since(at); late > time.Second {
			return usageError{fmt.Errorf("--start_at %s was %s ago: this run would not start together with the others", *startAt, late.Round(time.Second))}
		}
		fmt.Fprintf(stdout, "waiting until %s to start\n", at.UTC().Format(time.RFC3339))
		if !probe.Sleep(ctx, time.Until(at)) {
			return errors.New("stopped while waiting for --start_at")
		}
	}
	pr := newProgressPrinter(stdout)
	rep, err := soak.Once(ctx, cfg, *profile, log, pr.print)
	pr.done()
	if err != nil {
		if errors.Is(err, soak.ErrUnknownProfile) {
			return badConfig(err)
		}
		return err
	}
	if err := writeSoakReport(stdout, rep, *jsonOut, *htmlOut); err != nil {
		return err
	}
	var verdict, pushErr error
	if rep.Result != metrics.ResultPass {
		verdict = errFailed
	}
	if pushOpt.gateway != "" {
		pushErr = pushOpt.push(ctx, soakPushRegistry(rep), pushJobSoak, verdict == nil,
			"profile", rep.Profile.Name, "target", rep.Target)
	}
	return verdictAndPush(verdict, pushErr, func(err error) { printError(stderr, "soak", err) })
}

// runSoakPin is imcanary soak pin RUN_ID: it pins a run of the history
// under data_dir as the baseline of its profile, which every later run of
// the profile is then compared with.
func runSoakPin(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("soak", stdout, stderr)
	cfgFile, _, _ := commonFlags(fs, config.CommandSoak)
	if err := parseFlags(fs, "soak", args); err != nil {
		return usageError{err}
	}
	if fs.NArg() != 1 {
		return usageError{errors.New("soak pin: want one RUN_ID (or a search's id), as 'imcanary soak --profile NAME' printed it or the status page lists it")}
	}
	cfg, err := protocols.Loader().Load(*cfgFile, os.Environ(), fs)
	if err != nil {
		return badConfig(err)
	}
	store, err := history.Open(cfg.DataDir, history.Options{
		MaxRuns: cfg.History.MaxRuns, MaxAge: cfg.History.MaxAge, MaxCanaryRounds: cfg.History.MaxCanaryRounds,
	})
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	id := fs.Arg(0)
	sum, err := store.PinBaseline(id)
	if errors.Is(err, history.ErrNotFound) {
		return badConfig(fmt.Errorf("soak pin: no run %q in the history under %s", id, cfg.DataDir))
	}
	if err != nil {
		return badConfig(err)
	}
	fmt.Fprintf(stdout, "pinned %s (%s, started %s) as the baseline of profile %q: its later runs are compared with it\n",
		sum.ID, sum.Result, report.FormatTime(sum.Start), sum.Profile)
	return nil
}

// runSoakMerge is imcanary soak merge REPORT...: it merges the JSON
// reports of every shard of one sharded soak run into one report, prints
// it, and exits on its verdict, judged on the sums.
func runSoakMerge(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("soak", stdout, stderr)
	jsonOut := fs.String("json", "", "also write the merged report as JSON to this file")
	htmlOut := fs.String("html", "", "also write the merged report as HTML to this file")
	if err := parseFlags(fs, "soak", args); err != nil {
		return usageError{err}
	}
	if fs.NArg() == 0 {
		return usageError{errors.New("soak merge: want the JSON report of every shard of the run (each shard's --json, or DATA_DIR/runs/RUN_ID.json), or a directory holding them")}
	}
	paths, err := reportPaths(fs.Args())
	if err != nil {
		return badConfig(fmt.Errorf("soak merge: %w", err))
	}
	var shards []*report.Soak
	for _, path := range paths {
		r, err := readReport(path)
		if err != nil {
			return badConfig(fmt.Errorf("soak merge: %w", err))
		}
		shards = append(shards, r)
	}
	rep, err := soak.Merge(shards)
	if err != nil {
		return badConfig(fmt.Errorf("soak merge: %w", err))
	}
	if err := writeSoakReport(stdout, rep, *jsonOut, *htmlOut); err != nil {
		return err
	}
	if rep.Result != metrics.ResultPass {
		return errFailed
	}
	return nil
}

// writeSoakReport prints rep as text and writes it as JSON and HTML to
// the files named, if any.
func writeSoakReport(stdout io.Writer, rep *report.Soak, jsonPath, htmlPath string) error {
	if err := report.WriteText(stdout, rep); err != nil {
		return err
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer, *report.Soak) error
	}{{jsonPath, report.WriteJSON}, {htmlPath, report.WriteHTML}} {
		if out.path == "" {
			continue
		}
		if err := writeFile(out.path, func(w io.Writer) error { return out.write(w, rep) }); err != nil {
			return err
		}
	}
	return nil
}

// reportPaths is args with each directory replaced by the .json files in
// it, in name order: a shared volume where every shard wrote its report.
func reportPaths(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, a)
			continue
		}
		found, err := filepath.Glob(filepath.Join(a, "*.json"))
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: no .json report in the directory", a)
		}
		out = append(out, found...)
	}
	return out, nil
}

// maxReportBytes bounds a report file soak merge reads: a long run's
// report, samples and histograms included, is well under a megabyte.
const maxReportBytes = 64 << 20

func readReport(path string) (*report.Soak, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxReportBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than a soak report's %d at most", path, st.Size(), maxReportBytes)
	}
	r, err := report.ReadJSON(io.LimitReader(f, maxReportBytes))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// writeFile writes a file of the command's output, making its directory
// if it does not exist (a shard's directory of a run on a shared volume).
func writeFile(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// runSearch is imcanary soak --profile NAME for a profile with a search:
// the steps as they end, then the knee. It exits 0 once the knee is found
// or there is no limit within reach, 1 when every value tried failed or
// the prober was the limit.
func runSearch(ctx context.Context, cfg config.Config, profile string, log *slog.Logger, jsonOut, htmlOut, gateway string, stdout, stderr io.Writer) error {
	if gateway != "" {
		return usageError{errors.New("--push.gateway: a search's result is not pushed; its steps are soak runs of their own")}
	}
	pr := newProgressPrinter(stdout)
	rep, err := soak.SearchOnce(ctx, cfg, profile, log, pr.print, func(st report.SearchStep) {
		pr.done()
		fmt.Fprintf(stdout, "step %s: %s\n", strconv.FormatFloat(st.Value, 'f', -1, 64), st.Result)
	})
	pr.done()
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := report.WriteSearchText(stdout, rep); err != nil {
		return err
	}
	if jsonOut != "" {
		if err := writeFile(jsonOut, func(w io.Writer) error { return report.WriteSearchJSON(w, rep) }); err != nil {
			return err
		}
	}
	if htmlOut != "" {
		if err := writeFile(htmlOut, func(w io.Writer) error { return report.WriteSearchHTML(w, rep) }); err != nil {
			return err
		}
	}
	if rep.Result != report.SearchFound && rep.Result != report.SearchNoLimit {
		printError(stderr, "soak", fmt.Errorf("search: %s", rep.Verdict()))
		return errFailed
	}
	return nil
}
