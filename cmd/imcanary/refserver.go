package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/refserver"
)

func runRefserver(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("refserver", stdout, stderr)
	listen := fs.String("listen", "127.0.0.1:7070", "address to listen on; the WebSocket endpoint is /ws")
	secretFile := fs.String("secret-file", "", "file holding the token secret (else $"+config.SecretEnv+"; neither: accept any token)")
	var f refserver.Faults
	fs.Float64Var(&f.Drop, "drop", 0, "fraction of deliveries silently dropped, and hidden from the recipient's history (0..1)")
	fs.Float64Var(&f.DropPush, "drop-push", 0, "fraction of deliveries whose push is dropped while history keeps the message (0..1)")
	fs.Float64Var(&f.SkipDevice, "skip-device", 0, "fraction of deliveries to a user with two or more sessions that skip one of them (0..1)")
	fs.Float64Var(&f.Duplicate, "duplicate", 0, "fraction of deliveries sent twice (0..1)")
	fs.Float64Var(&f.Reorder, "reorder", 0, "fraction of deliveries held back behind the next one (0..1)")
	fs.DurationVar(&f.Delay, "delay", 0, "delay added to every delivery")
	fs.DurationVar(&f.Jitter, "jitter", 0, "uniform random extra delay, 0..jitter, per delivery")
	fs.Float64Var(&f.Refuse, "refuse", 0, "fraction of sends refused with an \"overloaded\" error instead of an ack, neither stored nor delivered (0..1)")
	fs.IntVar(&f.Capacity, "capacity", 0, "most deliveries per second: the rest queue (a delivery that would wait over 30s is dropped); 0: no limit")
	// StringArray, not StringSlice: the latter parses CSV, whose quoting
	// rules would only make odd user names fail obscurely.
	stall := fs.StringArray("stall", nil, "users whose sessions get no deliveries but stay open, pinged and acked (USER[,USER…]; repeatable)")
	sendQueue := fs.Int("send-queue", 256, "per-connection send queue; a reader that lets it fill is disconnected (close 4008)")
	sendBuffer := fs.Int("send-buffer", 0, "fixed kernel send buffer (SO_SNDBUF) per connection in bytes; 0 lets the kernel grow it")
	offlineQueue := fs.Int("offline-queue", refserver.DefaultOfflineQueue, "per-user queue of deliveries kept while the user is offline")
	maxDevices := fs.Int("max-devices", refserver.DefaultMaxDevices, "sessions a user may have at once; a delivery goes to every one")
	devicePolicy := fs.String("device-policy", string(refserver.DevicePolicyOldest),
		"a login past --max-devices: oldest (close the user's oldest session) or refuse (refuse the login); either closes with 4009")
	history := fs.Int("history", refserver.DefaultHistoryLimit, "messages kept per conversation for history requests; 0 keeps none")
	historyBytes := fs.Int64("history-bytes", refserver.DefaultHistoryBytes, "bytes the history of all conversations may hold; the oldest messages go first")
	reactor := fs.Bool("reactor", true, "read connections with an epoll poller, a goroutine per connection only while it has frames to write; false: two goroutines per connection")
	logLevel := fs.String("log.level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log.format", "text", "log format: text or json")
	if err := parseFlags(fs, "refserver", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	// Name the flag, not the option it feeds: the user typed the flag.
	for name, p := range map[string]float64{
		"--drop": f.Drop, "--drop-push": f.DropPush, "--skip-device": f.SkipDevice, "--duplicate": f.Duplicate, "--reorder": f.Reorder,
		"--refuse": f.Refuse,
	} {
		if !(p >= 0 && p <= 1) {
			return badConfig(fmt.Errorf("%s %v: must be a fraction in [0, 1]", name, p))
		}
	}
	if f.Capacity < 0 || f.Capacity > 1e9 {
		return badConfig(fmt.Errorf("--capacity %d: must be 0 (no limit) or deliveries per second up to 1e9", f.Capacity))
	}
	for name, d := range map[string]time.Duration{"--delay": f.Delay, "--jitter": f.Jitter} {
		if d < 0 {
			return badConfig(fmt.Errorf("%s %v: must not be negative", name, d))
		}
	}
	opts, err := refserverOptions(*maxDevices, *devicePolicy, *history, *historyBytes)
	if err != nil {
		return badConfig(err)
	}
	stalled, err := stallUsers(*stall)
	if err != nil {
		return badConfig(err)
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	var secret []byte
	switch {
	case *secretFile != "":
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			return badConfig(fmt.Errorf("--secret-file: %w", err))
		}
		secret = []byte(strings.TrimSpace(string(b)))
		if len(secret) == 0 {
			// An empty secret would silently open the target to anyone.
			return badConfig(fmt.Errorf("--secret-file: %s is empty", *secretFile))
		}
	case os.Getenv(config.SecretEnv) != "":
		secret = []byte(os.Getenv(config.SecretEnv))
	}
	opts.Secret, opts.Faults, opts.Stall, opts.Logger = secret, f, stalled, log
	opts.SendQueue, opts.SendBuffer, opts.OfflineQueue = *sendQueue, *sendBuffer, *offlineQueue
	opts.NoReactor = !*reactor
	srv, err := refserver.New(opts)
	if err != nil {
		return badConfig(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return badConfig(fmt.Errorf("--listen: %w", err))
	}
	fmt.Fprintf(stdout, "imcanary refserver: ws://%s/ws\n", ln.Addr())
	log.Info("target listening", "addr", ln.Addr().String(), "drop", f.Drop, "drop_push", f.DropPush, "skip_device", f.SkipDevice,
		"duplicate", f.Duplicate, "reorder", f.Reorder, "refuse", f.Refuse, "delay", f.Delay, "jitter", f.Jitter, "capacity", f.Capacity, "stall", stalled, "send_queue", *sendQueue,
		"max_devices", *maxDevices, "device_policy", *devicePolicy, "history", *history, "history_bytes", *historyBytes, "reactor", *reactor, "auth", secret != nil)
	return srv.Serve(ctx, ln)
}

// refserverOptions checks the device and history flags and returns the
// Options they set. They are checked here rather than left to
// refserver.New because the flags' zeros differ from the Options': 0 in
// Options means the default, while --history 0 keeps no history and
// --max-devices 0 would refuse everyone.
func refserverOptions(maxDevices int, policy string, history int, historyBytes int64) (refserver.Options, error) {
	var o refserver.Options
	if maxDevices < 1 {
		return o, fmt.Errorf("--max-devices %d: must be at least 1", maxDevices)
	}
	switch p := refserver.DevicePolicy(policy); p {
	case refserver.DevicePolicyOldest, refserver.DevicePolicyRefuse:
		o.DevicePolicy = p
	default:
		return o, fmt.Errorf("--device-policy %q: want %q or %q", policy, refserver.DevicePolicyOldest, refserver.DevicePolicyRefuse)
	}
	switch {
	case history < 0:
		return o, fmt.Errorf("--history %d: must not be negative; 0 keeps no history", history)
	case history == 0:
		o.HistoryLimit = -1
	default:
		o.HistoryLimit = history
	}
	if historyBytes < 1 {
		return o, fmt.Errorf("--history-bytes %d: must be at least 1; --history 0 keeps no history", historyBytes)
	}
	o.MaxDevices, o.HistoryBytes = maxDevices, historyBytes
	return o, nil
}

// stallUsers splits the values of --stall at commas, trimming the spaces
// of a list like "a, b". An empty name, as in "a,,b" or --stall "", is
// refused rather than skipped: it stalls nobody, which is never what was
// meant.
func stallUsers(values []string) ([]string, error) {
	var users []string
	for _, v := range values {
		for u := range strings.SplitSeq(v, ",") {
			u = strings.TrimSpace(u)
			if u == "" {
				return nil, fmt.Errorf("--stall %q: empty user name; want USER[,USER…]", v)
			}
			users = append(users, u)
		}
	}
	return users, nil
}
