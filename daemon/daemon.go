// Package daemon wires imcanary together: it picks the protocol driver named
// in the configuration, starts the embedded target when asked to, runs the
// population and serves /metrics, /healthz and /readyz. It is the only
// package that knows every adapter.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/embedded"
	"github.com/imcanary/imcanary/target"
)

// drivers maps target.protocol to its adapter: the one place that lists
// them.
var drivers = map[string]func(cfg config.Config, secret []byte) (probe.Driver, error){
	"embedded": func(cfg config.Config, secret []byte) (probe.Driver, error) {
		return embedded.New(embedded.Options{URL: cfg.Target.URL, Secret: secret, Heartbeat: cfg.Population.Heartbeat})
	},
}

// ShutdownTimeout bounds the whole shutdown: closing every session with a
// close frame, the HTTP server and the embedded target.
const ShutdownTimeout = 5 * time.Second

// Daemon is one running imcanary.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *metrics.Metrics
	pop     *probe.Population
	target  *target.Server
	secret  []byte
	run     string

	httpLn net.Listener
	// targetLn is the in-process target's listener, nil when the target
	// is remote.
	targetLn net.Listener
}

// New validates cfg, checks the process can hold the population, and
// prepares everything Run starts. It opens the HTTP listener (and the
// embedded target's, when it runs in-process) so that a port conflict is
// reported before anything runs.
func New(cfg config.Config, log *slog.Logger, reg *prometheus.Registry) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, reg: reg, run: newRunID()}
	if err := checkFileLimit(cfg); err != nil {
		return nil, err
	}
	secret, err := loadSecret(cfg)
	if err != nil {
		return nil, err
	}
	d.secret = secret
	ok := false
	defer func() {
		if !ok {
			d.closeListeners()
		}
	}()
	if cfg.Target.Protocol == "embedded" && cfg.Target.URL == "" {
		if d.secret == nil {
			d.secret = make([]byte, 32)
			_, _ = rand.Read(d.secret)
		}
		ts, err := target.New(target.Options{Secret: d.secret, Logger: log.With("component", "target")})
		if err != nil {
			return nil, fmt.Errorf("embedded target: %w", err)
		}
		d.target = ts
		if d.targetLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("embedded target: %w", err)
		}
		d.cfg.Target.URL = "ws://" + d.targetLn.Addr().String() + "/ws"
	}
	newDriver, found := drivers[d.cfg.Target.Protocol]
	if !found {
		return nil, fmt.Errorf("target.protocol: %q: no such driver", d.cfg.Target.Protocol)
	}
	drv, err := newDriver(d.cfg, d.secret)
	if err != nil {
		return nil, fmt.Errorf("target.protocol %s: %w", d.cfg.Target.Protocol, err)
	}
	d.metrics = metrics.New(reg)
	p := d.cfg.Population
	d.pop, err = probe.New(probe.Options{
		Driver:      drv,
		Set:         d.metrics.For(d.cfg.Target.Name, metrics.SourceBackground),
		Logger:      log.With("target", d.cfg.Target.Name, "source", metrics.SourceBackground),
		Run:         d.run,
		Prefix:      p.Prefix,
		Users:       p.Users,
		Ramp:        p.Ramp,
		GroupSize:   p.GroupSize,
		Rate:        p.Rate,
		Heartbeat:   p.Heartbeat,
		Deadline:    p.Deadline,
		LostAfter:   p.LostAfter,
		MessageSize: p.MessageSize,
		BackoffMin:  p.Backoff.Initial,
		BackoffMax:  p.Backoff.Max,
	})
	if err != nil {
		return nil, err
	}
	if d.httpLn, err = net.Listen("tcp", cfg.HTTP.Listen); err != nil {
		return nil, fmt.Errorf("http.listen: %w", err)
	}
	ok = true
	return d, nil
}

// HTTPAddr is the address the HTTP server listens on.
func (d *Daemon) HTTPAddr() string { return d.httpLn.Addr().String() }

// TargetURL is the URL of the target being monitored.
func (d *Daemon) TargetURL() string { return d.cfg.Target.URL }

// Population returns the background population.
func (d *Daemon) Population() *probe.Population { return d.pop }

func (d *Daemon) closeListeners() {
	for _, ln := range []net.Listener{d.httpLn, d.targetLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Run serves until ctx ends, then shuts down in order within
// ShutdownTimeout: the population closes its sessions with close frames,
// then the HTTP server and the embedded target stop.
func (d *Daemon) Run(ctx context.Context) error {
	log := d.log
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	tctx, stopTarget := context.WithCancel(context.Background())
	defer stopTarget()
	if d.target != nil {
		log.Info("embedded target listening", "url", d.cfg.Target.URL)
		// Exits when stopTarget is called, after the population is down,
		// so that sessions end with imcanary's close, not the target's.
		wg.Go(func() {
			if err := d.target.Serve(tctx, d.targetLn); err != nil {
				errc <- fmt.Errorf("embedded target: %w", err)
			}
		})
	}
	srv := &http.Server{Handler: d.handler(), ReadHeaderTimeout: 10 * time.Second}
	// Exits when srv.Shutdown is called below.
	wg.Go(func() {
		if err := srv.Serve(d.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	})
	log.Info("imcanary running", "run", d.run, "http", d.HTTPAddr(), "target", d.cfg.Target.Name,
		"url", d.cfg.Target.URL, "users", d.cfg.Population.Users)

	pctx, stopPop := context.WithCancel(ctx)
	popDone := make(chan struct{})
	go func() {
		defer close(popDone)
		if err := d.pop.Run(pctx); err != nil {
			errc <- err
		}
	}()
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	// One budget for the whole shutdown. The population gets most of it;
	// the embedded target needs up to a second to close what is left.
	log.Info("shutting down")
	end := time.Now().Add(ShutdownTimeout)
	stopPop()
	popWait := time.NewTimer(time.Until(end) - 1500*time.Millisecond)
	defer popWait.Stop()
	select {
	case <-popDone:
	case <-popWait.C:
		log.Error("population did not stop in time; closing anyway")
	}
	sctx, cancel := context.WithDeadline(context.Background(), end.Add(-time.Second))
	defer cancel()
	_ = srv.Shutdown(sctx)
	stopTarget()
	wg.Wait()
	return runErr
}

func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.pop.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %d of %d sessions online\n", d.pop.Online(), d.cfg.Population.Users)
			return
		}
		fmt.Fprintf(w, "ready: %d of %d sessions online\n", d.pop.Online(), d.cfg.Population.Users)
	})
	return mux
}

// checkFileLimit refuses a population the process cannot hold: each session
// is an open file, twice over when the embedded target runs in-process.
func checkFileLimit(cfg config.Config) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	need := uint64(cfg.Population.Users) + 64
	how := ""
	if cfg.Target.Protocol == "embedded" && cfg.Target.URL == "" {
		need += uint64(cfg.Population.Users)
		how = " (two per user: the embedded target runs in this process)"
	}
	if need > lim.Cur {
		return fmt.Errorf("population.users: %d: needs about %d open files%s but the limit (RLIMIT_NOFILE) is %d: "+
			"raise the limit, lower population.users, or run more shards", cfg.Population.Users, need, how, lim.Cur)
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

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
