package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/daemon"
)

func runDaemon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("imcanary run", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgFile := fs.String("config", "", "configuration file (YAML); without it, monitor an embedded target")
	logLevel := fs.String("log.level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log.format", "text", "log format: text or json")
	webConfig := fs.String("web.config.file", "", "exporter-toolkit web configuration file: TLS and basic authentication for every HTTP endpoint")
	enableReload := fs.Bool("web.enable-reload", true, "serve POST /-/reload (SIGHUP reloads either way)")
	config.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: imcanary run [--config FILE] [--KEY=VALUE ...]\n\n"+
			"Each KEY is a configuration key; flags override the file and IMCANARY_* environment.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg, err := config.Load(*cfgFile, os.Environ(), fs)
	if err != nil {
		return badConfig(err)
	}
	host, _ := os.Hostname()
	shard, err := config.ParseShard(cfg.Shard, host)
	if err != nil {
		return badConfig(fmt.Errorf("shard %q: %w", cfg.Shard, err))
	}
	reg := prometheus.NewRegistry()
	// The collectors carry the shard label like imcanary's own series
	// (daemon.New adds it to those).
	prometheus.WrapRegistererWith(prometheus.Labels{"shard": shard.Label()}, reg).MustRegister(
		// The scheduler's latency and GC pauses are two of the
		// saturation monitor's signals; exported too, so that a reader
		// of imcanary_probe_saturated can see them.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^(/sched/(latencies|pauses/total/gc):seconds|/gc/gomemlimit:bytes)$`)},
		)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	)
	// A reload reads the same sources again: the file, the environment
	// as it is then, and the command line.
	reload := func() (config.Config, error) { return config.Load(*cfgFile, os.Environ(), fs) }
	d, err := daemon.New(cfg, log, reg, daemon.WithWebConfig(*webConfig),
		daemon.WithReload(reload), daemon.WithReloadEndpoint(*enableReload))
	if err != nil {
		return badConfig(err)
	}
	fmt.Fprintf(stdout, "imcanary: metrics on http://%s/metrics, monitoring %s\n", d.HTTPAddr(), d.TargetURL())
	tune, stopTuning := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Exits when Run returns.
	wg.Go(func() { daemon.TuneMemory(tune, d.MemoryLimit, d.Ready, log) })
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

func runConfig(args []string, stdout io.Writer) error {
	if len(args) != 2 || args[0] != "check" {
		return usageError{fmt.Errorf("want: config check FILE")}
	}
	if _, err := config.Load(args[1], nil, nil); err != nil {
		return badConfig(err)
	}
	fmt.Fprintf(stdout, "%s: ok\n", args[1])
	return nil
}
