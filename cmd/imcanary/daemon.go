package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/daemon"
	"github.com/imcanary/imcanary/protocols"
)

// daemonFlags are the flags of imcanary run, which config check takes too.
type daemonFlags struct {
	cfgFile, logLevel, logFormat, webConfig *string
	enableReload                            *bool
}

func addDaemonFlags(fs *pflag.FlagSet) daemonFlags {
	df := daemonFlags{
		cfgFile:      fs.String("config", "", "configuration file (YAML); without it, monitor a reference server"),
		logLevel:     fs.String("log.level", "info", "log level: debug, info, warn, error"),
		logFormat:    fs.String("log.format", "text", "log format: text or json"),
		webConfig:    fs.String("web.config.file", "", "exporter-toolkit web configuration file: TLS and basic authentication for every HTTP endpoint"),
		enableReload: fs.Bool("web.enable-reload", true, "serve POST /-/reload (SIGHUP reloads either way)"),
	}
	protocols.Loader().RegisterFlags(fs)
	return df
}

// load loads the configuration as run does, from the file, the environment
// and fs, and makes the checks run makes before it opens anything
// (daemon.Preflight, and the --web.config.file as daemon.New reads it),
// returning every problem. run and config check both call it, so that one
// cannot accept what the other refuses.
func (df daemonFlags) load(fs *pflag.FlagSet) (config.Config, error) {
	cfg, err := protocols.Loader().Load(*df.cfgFile, os.Environ(), fs)
	if err != nil {
		return cfg, err
	}
	errs := []error{daemon.Preflight(cfg)}
	if *df.webConfig != "" {
		if err := web.Validate(*df.webConfig); err != nil {
			errs = append(errs, fmt.Errorf("--web.config.file %s: %w", *df.webConfig, err))
		}
	}
	return cfg, errors.Join(errs...)
}

func runDaemon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", stdout, stderr)
	df := addDaemonFlags(fs)
	if err := parseFlags(fs, "run", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	log, err := newLogger(stderr, *df.logLevel, *df.logFormat)
	if err != nil {
		return err
	}
	cfg, err := df.load(fs)
	if err != nil {
		return badConfig(err)
	}
	host, _ := os.Hostname()
	shard, err := config.ParseShard(cfg.Shard, host)
	if err != nil {
		return badConfig(fmt.Errorf("shard %q: %w", cfg.Shard, err))
	}
	log.Info("starting imcanary", "version", version.Info())
	reg := prometheus.NewRegistry()
	// The collectors carry the shard label like imcanary's own series
	// (daemon.New adds it to those).
	prometheus.WrapRegistererWith(prometheus.Labels{"shard": shard.Label()}, reg).MustRegister(
		// The scheduler's latency and GC pauses are two of the
		// saturation monitor's signals; exported too, so that a reader
		// of imcanary_probe_saturated can see them. The collector's
		// pace and CPU say whether it, not the sessions, is what
		// costs (imcanary bench reads them).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^(/sched/(latencies|pauses/total/gc):seconds|/gc/gomemlimit:bytes|/gc/gogc:percent|/cpu/classes/(gc/total|total):cpu-seconds)$`)},
		)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		// go_build_info: the Go module's path, version and checksum.
		collectors.NewBuildInfoCollector(),
		// imcanary_build_info: the version, revision and branch, as
		// every Prometheus exporter exports them.
		versioncollector.NewCollector("imcanary"),
	)
	// A reload reads the same sources again: the file, the environment
	// as it is then, and the command line.
	reload := func() (config.Config, error) { return protocols.Loader().Load(*df.cfgFile, os.Environ(), fs) }
	d, err := daemon.New(cfg, log, reg, daemon.WithWebConfig(*df.webConfig),
		daemon.WithReload(reload), daemon.WithReloadEndpoint(*df.enableReload))
	if err != nil {
		return badConfig(err)
	}
	fmt.Fprintf(stdout, "imcanary: metrics on http://%s/metrics, monitoring %s\n", d.HTTPAddr(), d.TargetURL())
	tune, stopTuning := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Exits when Run returns.
	wg.Go(func() { daemon.PaceCollector(tune, d.Ready, log) })
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// Exits when Run returns. Reload logs its own outcome.
	wg.Go(func() {
		for {
			select {
			case <-tune.Done():
				return
			case <-hup:
				_ = d.Reload()
			}
		}
	})
	defer wg.Wait()
	defer stopTuning()
	return d.Run(ctx)
}

// runConfig runs config check: it loads and checks the configuration as
// run would, and prints ok or every problem, one per line.
func runConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("config", stdout, stderr)
	df := addDaemonFlags(fs)
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help"):
		fs.Usage()
		return pflag.ErrHelp
	case len(args) == 0:
		return usageError{errors.New("want: config check [FILE] [--KEY=VALUE ...]")}
	case args[0] != "check":
		return usageError{fmt.Errorf("unknown config command %q: want: config check [FILE] [--KEY=VALUE ...]", args[0])}
	}
	args = args[1:]
	if err := parseFlags(fs, "config", args); err != nil {
		return usageError{err}
	}
	switch {
	case fs.NArg() > 1:
		return usageError{fmt.Errorf("unexpected argument %q: want one FILE", fs.Arg(1))}
	case fs.NArg() == 1 && *df.cfgFile != "" && *df.cfgFile != fs.Arg(0):
		return usageError{fmt.Errorf("two files, %s and --config %s: want one", fs.Arg(0), *df.cfgFile)}
	case fs.NArg() == 1:
		*df.cfgFile = fs.Arg(0)
	}
	var problems []error
	if _, err := newLogger(io.Discard, *df.logLevel, *df.logFormat); err != nil {
		problems = append(problems, err)
	}
	cfg, err := df.load(fs)
	if err != nil {
		problems = append(problems, err)
	}
	if err := errors.Join(problems...); err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	// Still ok, but what run will warn of is worth knowing now.
	for _, d := range cfg.Deprecated {
		fmt.Fprintf(stderr, "warning: %s\n", d)
	}
	if *df.cfgFile != "" {
		fmt.Fprintf(stdout, "%s: ok\n", *df.cfgFile)
	} else {
		fmt.Fprintln(stdout, "ok")
	}
	return nil
}
