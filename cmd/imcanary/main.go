// Command imcanary is an always-on synthetic monitor for instant-messaging
// servers. See the README for a tour.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
)

// Exit codes: 0 success, 1 failure, 2 bad usage or configuration.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// usageError marks errors that exit with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

const usage = `imcanary: synthetic monitoring for instant-messaging servers

Usage:
  imcanary [run] [--config FILE] [--KEY=VALUE ...]   run the daemon (default)
  imcanary target [flags]                            run the embedded reference target
  imcanary canary --once [--config FILE]             one canary round: exit 0 pass, 1 fail
  imcanary soak --profile NAME [--config FILE] [--json F] [--html F]
                                                     one soak run: exit 0 pass, 1 fail
  imcanary config check FILE                         validate a configuration file
  imcanary bench [--quick] [--json] [--processes N]  measure this machine's capacity and
                                                     print a plan of shards
  imcanary health [--url URL] [--timeout D]          ask a running daemon's /healthz:
                                                     exit 0 on 200, 1 otherwise
  imcanary help [COMMAND]

With no --config, imcanary starts an embedded target in-process on a free
loopback port and monitors it. Run 'imcanary run --help' for every key.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && (args[0] == "" || args[0][0] != '-') {
		cmd, args = args[0], args[1:]
	}
	// SIGINT and SIGTERM cancel the root context; every part of the daemon
	// derives its context from it and stops in order.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch cmd {
	case "run":
		err = runDaemon(ctx, args, stdout, stderr)
	case "target":
		err = runTarget(ctx, args, stdout, stderr)
	case "canary":
		err = runCanary(ctx, args, stdout, stderr)
	case "soak":
		err = runSoak(ctx, args, stdout, stderr)
	case "config":
		err = runConfig(args, stdout)
	case "bench":
		err = runBench(ctx, args, stdout, stderr)
	case "health":
		err = runHealth(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		err = usageError{fmt.Errorf("unknown command %q", cmd)}
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, pflag.ErrHelp):
		return exitOK
	case errors.Is(err, errFailed):
		return exitFail
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "imcanary %s: %v\n", cmd, err)
		if !errors.As(err, new(quietUsage)) {
			fmt.Fprint(stderr, "\n"+usage)
		}
		return exitUsage
	default:
		fmt.Fprintf(stderr, "imcanary %s: %v\n", cmd, err)
		return exitFail
	}
}

// quietUsage is a usage error (a bad configuration) whose message says all:
// printing the usage text after it would bury it.
type quietUsage struct{ error }

func badConfig(err error) error { return usageError{quietUsage{err}} }

// newLogger builds the one logger of the process.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Errorf("--log.level: %q: want debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log.format: %q: want text or json", format)}
}
