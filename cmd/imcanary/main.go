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
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
)

// Exit codes: 0 success, 1 failure, 2 bad usage or configuration, 3 a
// one-shot command whose verdict passed but whose push to the Pushgateway
// failed.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
	exitPush  = 3
)

// usageError marks errors that exit with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// command is one subcommand, as help describes it.
type command struct {
	name     string
	synopsis string // after "Usage: "
	summary  string // one line, in the list of commands
	about    string // what it does, at the top of its own help
}

// commands are imcanary's subcommands, in the order help lists them.
var commands = []command{
	{"run", "imcanary [run] [--config FILE] [--KEY=VALUE ...]",
		"run the daemon (the default command)",
		`Runs the daemon: keeps the background population online and messaging,
runs the canary rounds and the scheduled soak runs, keeps their history under
data_dir, and serves /metrics, /healthz, /readyz, the status page and its API.
With no --config it monitors a reference server in-process. SIGHUP or
POST /-/reload reads the configuration again.`},
	{"canary", "imcanary canary --once [--config FILE] [--KEY=VALUE ...]",
		"run one canary round and exit: 0 pass, 1 fail",
		`Brings the canary users online against the target, runs one round, prints
its checks and exits: 0 pass, 1 fail, 2 bad usage or configuration, 3 passed
but --push.gateway failed. For a deploy pipeline; scheduled rounds run inside
imcanary run.`},
	{"soak", "imcanary soak --profile NAME [--config FILE] [--json FILE] [--html FILE] [--push.gateway URL] [--shard I/N] [--start_at TIME] [--KEY=VALUE ...]\n" +
		"       imcanary soak pin RUN_ID [--config FILE] [--data_dir DIR]\n" +
		"       imcanary soak merge [--json FILE] [--html FILE] SHARD_REPORT.json|DIR...",
		"run one soak profile and exit: 0 pass, 1 fail",
		`Runs the soak profile NAME of soak.profiles once, showing its progress,
prints the report, saves it in the history under data_dir and exits: 0 pass,
1 fail, 2 bad usage or configuration, 3 passed but --push.gateway failed.
Ctrl-C stops the run cleanly; its report says aborted. The report compares
the run with the previous run of the profile and with its pinned baseline;
"imcanary soak pin RUN_ID" pins a run of the history as its profile's
baseline. A profile with a search (search.vary) runs a search for the
server's limit instead: a run per step, then the knee, the threshold that
broke first and each step's figures, compared with the previous search and
the pinned one; it exits 0 when it found the knee or no limit within
search.max, 1 otherwise. With --shard I/N the run is shard I of N of one
run, with users of its own, and --start_at starts it at a given moment, so
that the shards start together. "imcanary soak merge" makes one report of
the JSON reports of every shard of one sharded run (files, or a directory
of them):
counts summed, latencies from the shards' histograms merged, thresholds
judged on the sums; it exits 0 pass, 1 fail, 2 when the reports are not
every shard of one run.`},
	{"config", "imcanary config check [FILE] [--config FILE] [--KEY=VALUE ...]",
		"check a configuration as imcanary run would load it",
		`Loads the configuration exactly as imcanary run does, from FILE (or
--config), the IMCANARY_* environment and the flags, and makes the checks run
makes before it starts: unknown keys, values, the files it names, the open
files and ports its populations need, the target secret, data_dir. Prints ok,
or every problem, one per line, and exits 2. It takes run's flags, so that
"run" in a command line can be replaced by "config check".`},
	{"jsonws", "imcanary jsonws try --config FILE [--users A,B] [--timeout D] [--KEY=VALUE ...]",
		"walk a jsonws mapping against the real server, printing every frame",
		`Walks the target.jsonws mapping of FILE against the server, one step at a
time: provisions a group of users A and B, logs both in, sends one direct and
one group message from A, and waits for each ack and for B's deliveries. It
prints every frame written and read (secrets redacted) and every rule that
matched, and exits 0 when every step passed, 1 naming the step that failed, 2
on bad usage or configuration: a mapping is written against a server in
minutes this way.`},
	{"refserver", "imcanary refserver [--listen ADDR] [--drop P] [--delay D] [flags]",
		"run the reference IM server, with fault injection",
		`Serves imcanary's reference IM server on its own, with faults of a known
size to prove the detectors against. Its WebSocket endpoint is /ws. The old
name of this command, "target", still works and says it is deprecated.`},
	{"bench", "imcanary bench [--quick] [--json] [--processes N] [--config FILE] [flags]",
		"measure this machine's capacity and plan shards",
		`Measures how many sessions and deliveries this machine's imcanary holds, and
prints a capacity plan: how many shards to run for a configuration. It runs
reference servers and probers as processes of this binary on loopback, reads
their /metrics and /proc, and stops at the first step where a prober's
saturation detector fires. Progress goes to standard error, the report to
standard output.`},
	{"health", "imcanary health [--url URL] [--timeout D] [--tls.insecure-skip-verify] [--basic-auth.username U]",
		"ask a running daemon's /healthz: exit 0 on 200, 1 otherwise",
		`GETs URL once and exits 0 if it answers 200, 1 otherwise, bad usage
included (Docker reserves 2): the container image's HEALTHCHECK, which has no
shell or curl to call.`},
	{"version", "imcanary version",
		"print the version and how it was built",
		`Prints imcanary's version, revision and branch, and the Go release and
platform it was built with; --version does the same.`},
	{"help", "imcanary help [COMMAND]",
		"print help: the commands, or one command's flags",
		`Prints the list of commands, or with COMMAND that command's help.`},
}

// lookup returns the command named name.
func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// helpWidth is where help wraps flag descriptions: a terminal's width, give
// or take, and still complete lines for grep.
const helpWidth = 100

// printUsage writes the general help: every command, and what applies to
// all of them.
func printUsage(w io.Writer) {
	fmt.Fprint(w, "imcanary: synthetic monitoring for instant-messaging servers\n\n"+
		"Usage:\n  imcanary [COMMAND] [FLAGS]\n\nCommands:\n")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s   %s\n", width, c.name, c.summary)
	}
	fmt.Fprint(w, `
Flags:
  -h, --help      print this help
      --version   print the version

With no command, or with flags only, imcanary runs the daemon; with no
--config it monitors a reference server in-process. Every configuration key
(configs/imcanary.yaml lists them) is also an environment variable,
IMCANARY_ and the key in upper case with "_" for "." (IMCANARY_POPULATION_USERS),
and a flag (--population.users); flags win over the environment, which wins
over the file.
`)
	printEnv(w, "")
	fmt.Fprint(w, "\nRun 'imcanary help COMMAND' for a command's flags.\n")
}

// printEnv lists the IMCANARY_* variables that are not keys, those that
// command reads ("" for all).
func printEnv(w io.Writer, command string) {
	var vars []config.EnvVar
	width := 0
	for _, v := range config.OtherEnv {
		if command == "" || slices.Contains(v.UsedBy, command) {
			vars = append(vars, v)
			width = max(width, len(v.Name))
		}
	}
	if len(vars) == 0 {
		return
	}
	fmt.Fprint(w, "\nEnvironment:\n")
	for _, v := range vars {
		text := v.Usage
		if command == "" {
			text += " (" + strings.Join(v.UsedBy, ", ") + ")"
		}
		fmt.Fprintf(w, "  %-*s   %s\n", width, v.Name, wrap(text, helpWidth-width-5, width+5))
	}
}

// wrap breaks text into lines of at most width characters, at spaces, and
// indents every line after the first.
func wrap(text string, width, indent int) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(text) {
		switch {
		case i == 0:
		case n+1+len(word) > width:
			b.WriteString("\n" + strings.Repeat(" ", indent))
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

func main() {
	// Before anything reads it: the build-info metric, the User-Agent
	// of every request to a target, --version.
	setVersion()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 {
		switch a := args[0]; {
		case a == "-h" || a == "--help" || a == "-help":
			printUsage(stdout)
			return exitOK
		case a == "--version":
			printVersion(stdout)
			return exitOK
		case a == "" || a[0] != '-':
			cmd, args = a, args[1:]
		}
	}
	// SIGINT and SIGTERM cancel the root context; every part of the daemon
	// derives its context from it and stops in order.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	runners := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"run":       runDaemon,
		"refserver": runRefserver,
		"canary":    runCanary,
		"soak":      runSoak,
		"config": func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			return runConfig(args, stdout, stderr)
		},
		"bench":   runBench,
		"jsonws":  runJSONWS,
		"health":  runHealth,
		"version": func(_ context.Context, args []string, stdout, _ io.Writer) error { return runVersion(args, stdout) },
	}
	runners["help"] = func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		switch {
		case len(args) == 0:
			printUsage(stdout)
			return nil
		case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
			c, _ := lookup("help")
			fmt.Fprintf(stdout, "Usage: %s\n\n%s\n", c.synopsis, c.about)
			return nil
		case len(args) > 1:
			return usageError{fmt.Errorf("want one command, not %q", args)}
		}
		r, ok := runners[args[0]]
		if !ok {
			return unknownCommand(args[0])
		}
		// Every command prints its own help for --help, having run
		// nothing yet.
		return r(ctx, []string{"--help"}, stdout, stderr)
	}

	if cmd == "target" {
		// The old name, from before "target" meant only the server
		// under test: it still works, and says it is deprecated.
		fmt.Fprintln(stderr, `imcanary: the command "target" is deprecated: use "imcanary refserver"`)
		cmd = "refserver"
	}
	var err error
	if r, ok := runners[cmd]; ok {
		err = r(ctx, args, stdout, stderr)
	} else {
		err = unknownCommand(cmd)
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, pflag.ErrHelp):
		return exitOK
	case errors.Is(err, errFailed):
		return exitFail
	case errors.Is(err, errReported):
		return exitUsage
	case errors.As(err, new(pushFailed)):
		printError(stderr, cmd, err)
		return exitPush
	case errors.As(err, new(usageError)):
		printError(stderr, cmd, err)
		if !errors.As(err, new(quietUsage)) {
			hint := "imcanary help " + cmd
			if errors.As(err, new(noCommand)) {
				hint = "imcanary help"
			}
			fmt.Fprintf(stderr, "Run '%s' for usage.\n", hint)
		}
		return exitUsage
	default:
		printError(stderr, cmd, err)
		return exitFail
	}
}

// printError writes err, every line of it (one per problem) prefixed with
// the command, so that each can be found with grep.
func printError(w io.Writer, cmd string, err error) {
	prefix := "imcanary " + cmd + ": "
	if _, known := lookup(cmd); !known {
		prefix = "imcanary: "
	}
	for line := range strings.Lines(err.Error()) {
		fmt.Fprint(w, prefix+strings.TrimSuffix(line, "\n")+"\n")
	}
}

// noCommand is the error of a command imcanary does not have.
type noCommand struct{ name string }

func (e noCommand) Error() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	if near := config.Closest(e.name, names); near != "" {
		return fmt.Sprintf("unknown command %q: did you mean %q?", e.name, near)
	}
	return fmt.Sprintf("unknown command %q", e.name)
}

func unknownCommand(name string) error { return usageError{noCommand{name}} }

// quietUsage is a usage error (a bad configuration) whose message says all:
// a hint to read the help after it would only distract from it.
type quietUsage struct{ error }

func badConfig(err error) error { return usageError{quietUsage{err}} }

// errReported makes a command exit 2 after it has printed its own account
// of what is wrong (config check's problems).
var errReported = errors.New("reported")

// newLogger builds the one logger of the process.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Errorf("--log.level: %q: want debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationText}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log.format: %q: want text or json", format)}
}

// durationText writes a duration as time.Duration writes it ("1.5s"),
// which the text handler does already but the JSON handler would not: it
// writes nanoseconds, a number nobody reads right. slog calls it for every
// attribute, those inside groups too.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
