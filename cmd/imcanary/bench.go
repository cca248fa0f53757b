package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/bench"
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/protocols"
)

// runBench runs the capacity benchmark, or, as "bench bare-reader" and
// "bench bare-login", the baselines that the benchmark runs as workers of
// its own.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "bare-reader" {
		return runBareReader(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "bare-login" {
		return runBareLogin(ctx, args[1:], stdout, stderr)
	}
	fs := newFlags("bench", stdout, stderr)
	quick := fs.Bool("quick", false, "CI scale: two small steps and short windows, under a minute")
	jsonOut := fs.Bool("json", false, "print the report as one JSON object instead of text")
	processes := fs.Int("processes", 1, "probers (and reference servers) side by side, to go past one process's file limit")
	targetURL := fs.String("target", "", "WebSocket URL of a running reference-protocol server to use instead of embedded ones")
	secretFile := fs.String("secret-file", "", "file holding the --target's token secret (else $"+config.SecretEnv+")")
	cfgFile := fs.String("config", "", "configuration to size, and whose population shape and saturation limits the probers use")
	steps := fs.String("steps", "", "sessions per process of each step, comma-separated (default: up to the file limit)")
	rate := fs.Float64("rate", 0, "messages per second per user in the session steps; 0 holds idle sessions with heartbeats (traffic is measured in the self-noise step)")
	connectRate := fs.Float64("connect-rate", 0, "logins per second allowed to each prober (default 10000)")
	if err := parseFlags(fs, "bench", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	stepList, err := parseSteps(*steps)
	if err != nil {
		return usageError{err}
	}
	cfg, err := protocols.Loader().Load(*cfgFile, os.Environ(), nil)
	if err != nil {
		return badConfig(err)
	}
	if *targetURL != "" && cfg.Target.Protocol != reference.Adapter.Config.Name {
		return badConfig(fmt.Errorf("target.protocol %q: the bench drives the reference server's protocol only", cfg.Target.Protocol))
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to run workers: %w", err)
	}
	dir, err := os.MkdirTemp("", "imcanary-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	pr := newBenchProgress(stderr)
	rep, err := bench.Run(ctx, bench.Options{
		Exe: exe, Dir: dir, Quick: *quick, Processes: *processes,
		TargetURL: *targetURL, SecretFile: *secretFile,
		Steps: stepList, Rate: *rate, ConnectRate: *connectRate,
		Config: cfg, ConfigFile: *cfgFile,
		Progress: pr.print,
	})
	pr.done()
	if rep == nil {
		return badConfig(err)
	}
	// A run cut short still prints what it measured, with its stop
	// reason.
	write := bench.WriteText
	if *jsonOut {
		write = bench.WriteJSON
	}
	if werr := write(stdout, rep); werr != nil {
		return werr
	}
	if errors.Is(err, context.Canceled) {
		return errors.New("interrupted; the report above holds what was measured until then")
	}
	return err
}

// parseSteps reads --steps.
func parseSteps(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var steps []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--steps %q: want positive session counts, comma-separated", s)
		}
		steps = append(steps, n)
	}
	return steps, nil
}

// runBareReader is the bench's baseline client, a worker it starts itself.
func runBareReader(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("imcanary bench bare-reader", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "flood server endpoint")
	conns := fs.Int("conns", 100, "connections to hold")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *url == "" {
		return usageError{errors.New("--url is required")}
	}
	return bench.BareReader{URL: *url, Conns: *conns}.Run(ctx, os.Stdin, stdout)
}

// runBareLogin is the bench's ramp baseline, a worker it starts itself.
func runBareLogin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("imcanary bench bare-login", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "reference server endpoint")
	secretFile := fs.String("secret-file", "", "file holding the target's token secret (none: the target is open)")
	users := fs.Int("users", 1000, "sessions to log in")
	workers := fs.Int("workers", 64, "logins in flight at once")
	prefix := fs.String("prefix", "bare", "user name prefix")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *url == "" {
		return usageError{errors.New("--url is required")}
	}
	var secret []byte
	if *secretFile != "" {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			// Names the file, never its content.
			return fmt.Errorf("--secret-file: %w", err)
		}
		secret = []byte(strings.TrimSpace(string(b)))
	}
	return bench.BareLogin{URL: *url, Secret: secret, Users: *users, Workers: *workers, Prefix: *prefix}.Run(ctx, os.Stdin, stdout)
}

// benchProgress shows where a bench run is: one redrawn line on a
// terminal; elsewhere (CI logs) a line at every change of phase or step
// and otherwise every few seconds.
type benchProgress struct {
	w        io.Writer
	terminal bool
	last     time.Time
	lastKey  string
	drawn    bool
}

func newBenchProgress(w io.Writer) *benchProgress {
	p := &benchProgress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

func (p *benchProgress) print(pr bench.Progress) {
	var b strings.Builder
	fmt.Fprintf(&b, "%6s  %s", pr.Elapsed.Round(time.Second), pr.Phase)
	if pr.Step > 0 {
		fmt.Fprintf(&b, " %d/%d", pr.Step, pr.Steps)
	}
	if pr.SessionsPerProcess > 0 {
		fmt.Fprintf(&b, ": %d sessions × %d process(es)", pr.SessionsPerProcess, pr.Processes)
	}
	if pr.Sessions > 0 {
		fmt.Fprintf(&b, "  online %d/%d", pr.Online, pr.Sessions)
	}
	if pr.LoginsPerSecond > 0 {
		fmt.Fprintf(&b, "  %.0f logins/s", pr.LoginsPerSecond)
	}
	if pr.DeliveriesPerSecond > 0 {
		fmt.Fprintf(&b, "  %.0f deliveries/s", pr.DeliveriesPerSecond)
	}
	if pr.Note != "" {
		fmt.Fprintf(&b, "  (%s)", pr.Note)
	}
	line := b.String()
	if p.terminal {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.drawn = true
		return
	}
	key := fmt.Sprint(pr.Phase, pr.Step, pr.Note)
	if key != p.lastKey || time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.w, line)
		p.last, p.lastKey = time.Now(), key
	}
}

func (p *benchProgress) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
