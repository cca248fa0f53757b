// Package protocols is the registry of imcanary's protocol adapters, the
// one list of them (All), and what a process needs to reach the target
// through one (Open): the driver made from the configuration, the target
// secret, the source addresses, and the reference server when it runs in
// the process. Adding a protocol is its adapter package and one line in
// All.
package protocols

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/centrifugo"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/probe/matrix"
	"github.com/imcanary/imcanary/probe/mattermost"
	"github.com/imcanary/imcanary/probe/mqtt"
	"github.com/imcanary/imcanary/probe/openim"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/probe/xmpp"
	"github.com/imcanary/imcanary/refserver"
	"github.com/prometheus/common/version"
)

// All is the registry of protocols: the one place that lists them. Each
// entry is its adapter's own (see probe.Adapter): its configuration
// section, its needs of the secret, and how its driver is made.
var All = []probe.Adapter{
	reference.Adapter,
	xmpp.Adapter,
	centrifugo.Adapter,
	jsonws.Adapter,
	matrix.Adapter,
	mattermost.Adapter,
	mqtt.Adapter,
	openim.Adapter,
}

// Loader returns the configuration loader of every protocol in All, made
// once: target.protocol's names, each protocol's section of keys, and
// their rules.
var Loader = sync.OnceValue(func() *config.Loader {
	ps := make([]config.Protocol, len(All))
	for i, a := range All {
		ps[i] = a.Config
	}
	return config.NewLoader(ps...)
})

// InProcess reports whether cfg asks for a reference server in this
// process: a protocol that can run in-process, and no target.url.
func InProcess(cfg config.Config) bool {
	a, ok := Lookup(cfg.Target.Protocol)
	return ok && a.Config.InProcess && cfg.Target.URL == ""
}

// Lookup returns the adapter of the protocol name (or one of its aliases).
func Lookup(name string) (probe.Adapter, bool) {
	for _, a := range All {
		if a.Config.Name == name || slices.Contains(a.Config.Aliases, name) {
			return a, true
		}
	}
	return probe.Adapter{}, false
}

// Target is the server under test as this process reaches it: the driver
// of its protocol, and the reference server when it runs in this process.
type Target struct {
	// Config is the configuration it was opened with, target.url filled
	// in for an in-process reference server.
	Config config.Config
	Driver probe.Driver
	Secret []byte
	// Run identifies this process in every message body.
	Run string
	// Sources are the addresses of population.source_addrs, which every
	// population spreads its users over; nil lets the kernel pick.
	Sources []netip.Addr

	server   *refserver.Server
	serverLn net.Listener
	wg       sync.WaitGroup
	stop     context.CancelFunc
}

// InProcess reports whether the reference server runs in this process,
// its connections counting against the same file limit.
func (t *Target) InProcess() bool { return t.server != nil || t.serverLn != nil }

// Open makes the driver for cfg, after checking that this process can hold
// the populations of pops (their sizes, run at once: open files, and
// ephemeral ports per source address). For a protocol that can run
// in-process and no URL it opens a reference server's listener on a free
// loopback port, served once Start is called. It logs what of cfg is
// deprecated, at WARN. Close releases what it made.
func Open(cfg config.Config, pops []int, log *slog.Logger) (*Target, error) {
	adapter, ok := Lookup(cfg.Target.Protocol)
	if !ok {
		return nil, fmt.Errorf("target.protocol: %q: no such protocol", cfg.Target.Protocol)
	}
	inProcess := InProcess(cfg)
	if err := CheckCapacity(cfg, pops, inProcess); err != nil {
		return nil, err
	}
	for _, d := range cfg.Deprecated {
		log.Warn(d)
	}
	t := &Target{Config: cfg, Run: newRunID()}
	var err error
	if t.Sources, err = config.ParseSourceAddrs(cfg.Population.SourceAddrs); err != nil {
		return nil, fmt.Errorf("population.source_addrs: %w", err)
	}
	if t.Secret, err = loadSecret(cfg); err != nil {
		return nil, err
	}
	need := adapter.SecretNeed(config.Section[any](cfg, adapter.Config.Name, adapter.Config.Section))
	if t.Secret == nil && need == probe.SecretKept {
		// The protocol's passwords are imcanary's own: with no secret
		// configured, one is made once and kept in the data directory,
		// so that the users registered today can still log in after a
		// restart.
		if t.Secret, err = localSecret(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if inProcess {
		if t.Secret == nil {
			t.Secret = make([]byte, 32)
			_, _ = rand.Read(t.Secret)
		}
		if t.server, err = refserver.New(refserver.Options{Secret: t.Secret, Logger: log.With("component", "refserver")}); err != nil {
			return nil, fmt.Errorf("reference server: %w", err)
		}
		if t.serverLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("reference server: %w", err)
		}
		t.Config.Target.URL = "ws://" + t.serverLn.Addr().String() + "/ws"
	}
	section := config.Section[any](cfg, adapter.Config.Name, adapter.Config.Section)
	if err := secretProblem(adapter, section, t.Secret); err != nil {
		t.Close()
		return nil, err
	}
	header, err := requestHeader(cfg.Target.Headers)
	if err != nil {
		t.Close()
		return nil, err
	}
	t.Driver, err = adapter.New(probe.Target{
		URL: t.Config.Target.URL, Header: header, Secret: t.Secret, Heartbeat: cfg.Population.Heartbeat,
		Section: section,
		DataDir: cfg.DataDir, Logger: log.With("component", adapter.Config.Name),
	})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("target.protocol %s: %w", adapter.Config.Name, err)
	}
	return t, nil
}

// Start serves the in-process reference server, if any, until Close.
func (t *Target) Start(log *slog.Logger) {
	if t.server == nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	t.stop = stop
	log.Info("reference server listening", "url", t.Config.Target.URL)
	// Exits when Close cancels ctx.
	t.wg.Go(func() {
		if err := t.server.Serve(ctx, t.serverLn); err != nil {
			log.Error("reference server stopped", "err", err)
		}
	})
}

// Close closes the driver's idle connections (probe.IdleCloser), and
// stops the in-process reference server and waits for it.
func (t *Target) Close() {
	if ic, ok := t.Driver.(probe.IdleCloser); ok {
		ic.CloseIdleConnections()
	}
	if t.stop != nil {
		t.stop()
		t.wg.Wait()
		return
	}
	if t.serverLn != nil {
		t.serverLn.Close()
	}
}

// CheckCapacity refuses populations this process cannot hold: pops are
// their sizes, run at once; inProcess says the reference server runs in
// this process too. Each session is an open file (two with the server in
// the process), and takes an ephemeral port of its source address.
func CheckCapacity(cfg config.Config, pops []int, inProcess bool) error {
	users := 0
	for _, n := range pops {
		users += n
	}
	errs := []error{checkFileLimit(users, inProcess)}
	if sources, err := config.ParseSourceAddrs(cfg.Population.SourceAddrs); err != nil {
		errs = append(errs, fmt.Errorf("population.source_addrs: %w", err))
	} else {
		errs = append(errs, checkPorts(pops, len(sources), ephemeralPorts()))
	}
	return errors.Join(errs...)
}

// CheckSecret checks what the target's protocol needs of the secret and
// the headers, as Open will read them: a secret file that reads, the
// headers' value files, and a secret at all for a protocol that requires
// one.
func CheckSecret(cfg config.Config) error {
	var errs []error
	secret, err := loadSecret(cfg)
	errs = append(errs, err)
	if _, err := requestHeader(cfg.Target.Headers); err != nil {
		errs = append(errs, err)
	}
	if a, ok := Lookup(cfg.Target.Protocol); ok && err == nil {
		errs = append(errs, secretProblem(a, config.Section[any](cfg, a.Config.Name, a.Config.Section), secret))
	}
	return errors.Join(errs...)
}

// secretProblem says what is wrong with the secret, nil for none, for what
// the adapter declares of it: one it requires, one its section cannot use.
// Config check (CheckSecret) and Open both ask it, so that no adapter
// checks for itself and no command that opens a target skips it.
func secretProblem(a probe.Adapter, section any, secret []byte) error {
	if secret == nil && a.SecretNeed(section) == probe.SecretRequired {
		is := ""
		if a.SecretIs != "" {
			is = ", " + a.SecretIs
		}
		return fmt.Errorf("target.protocol %s: needs the target secret%s: set target.secret_file or %s", a.Config.Name, is, config.SecretEnv)
	}
	if a.SecretFits != nil {
		return a.SecretFits(section, secret != nil)
	}
	return nil
}

// checkFileLimit refuses more sessions than the process can hold: each is
// an open file, twice over when the reference server runs in-process.
func checkFileLimit(users int, inProcess bool) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	need := uint64(users) + 64
	how := ""
	if inProcess {
		need += uint64(users)
		how = " (two per user: the reference server runs in this process)"
	}
	if need > lim.Cur {
		return fmt.Errorf("population.users: %d sessions in all need about %d open files%s but the limit (RLIMIT_NOFILE) is %d: "+
			"raise the limit, lower the user counts, or run more shards", users, need, how, lim.Cur)
	}
	return nil
}

// portRange is the kernel's ephemeral port range, first to last port
// inclusive; the zero value is a range not known.
type portRange struct{ first, last int }

// ports returns how many ports the range holds.
func (r portRange) ports() int {
	if r.first <= 0 || r.last < r.first {
		return 0
	}
	return r.last - r.first + 1
}

// portRangeFile holds the ephemeral port range, for IPv6 too.
const portRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// ephemeralPorts reads the ephemeral port range, or returns the zero range
// where there is no such file (not Linux, or /proc not mounted).
func ephemeralPorts() portRange {
	b, err := os.ReadFile(portRangeFile)
	if err != nil {
		return portRange{}
	}
	return parsePortRange(string(b))
}

// parsePortRange reads the file's first and last port, or returns the
// zero range.
func parsePortRange(s string) portRange {
	f := strings.Fields(s)
	if len(f) != 2 {
		return portRange{}
	}
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return portRange{}
	}
	return portRange{first, last}
}

// portShare is the part of the ephemeral port range that one source
// address may fill: the rest is for the host's other connections and for
// reconnects while old ports wait out TIME_WAIT.
const portShare = 0.9

// checkPorts refuses more sessions on one source address than it has
// ephemeral ports for: each session to the one server port takes a port
// of its source address. pops are the sizes of the populations that run at
// once, each spread round-robin over addrs source addresses (0: the one
// the kernel picks), so the first address holds the most; r is the
// ephemeral port range, whose zero value skips the check.
func checkPorts(pops []int, addrs int, r portRange) error {
	if r.ports() == 0 {
		return nil
	}
	limit := int(float64(r.ports()) * portShare)
	perAddr := sessionsPerAddr(pops, max(addrs, 1))
	if perAddr <= limit {
		return nil
	}
	users := 0
	for _, n := range pops {
		users += n
	}
	// The fewest addresses that would do, for the advice.
	need := max(addrs, 1)
	for need < users && sessionsPerAddr(pops, need) > limit {
		need++
	}
	var fix string
	switch {
	case sessionsPerAddr(pops, need) > limit:
		fix = "widen net.ipv4.ip_local_port_range"
	case need < 255:
		fix = fmt.Sprintf("add addresses to population.source_addrs (at least %d in all, e.g. 127.0.0.1-127.0.0.%d), or run more shards", need, need)
	default:
		fix = fmt.Sprintf("add addresses to population.source_addrs (at least %d in all), or run more shards", need)
	}
	how := fmt.Sprintf("the limit is %d (%.0f%% of the %d in net.ipv4.ip_local_port_range, %d-%d)", limit, portShare*100, r.ports(), r.first, r.last)
	if addrs == 0 {
		return fmt.Errorf("population.users: %d sessions in all connect from the one source address the kernel picks (population.source_addrs is empty) "+
			"and need %d ephemeral ports, but %s: %s", users, perAddr, how, fix)
	}
	return fmt.Errorf("population.source_addrs: %d sessions in all over %d source addresses put up to %d on one, "+
		"which needs as many ephemeral ports, but %s: %s", users, addrs, perAddr, how, fix)
}

// sessionsPerAddr returns how many sessions the busiest of addrs source
// addresses holds: the first, with ⌈n/addrs⌉ of each population.
func sessionsPerAddr(pops []int, addrs int) int {
	n := 0
	for _, p := range pops {
		n += (p + addrs - 1) / addrs
	}
	return n
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

// localSecret reads DIR/secret, creating it with a random secret the first
// time (mode 0600; the secret is never logged).
func localSecret(dir string) ([]byte, error) {
	path := filepath.Join(dir, "secret")
	if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return bytes.TrimSpace(b), nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	s := []byte(hex.EncodeToString(b))
	// O_EXCL: if another process made it meanwhile, use theirs.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return localSecret(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	if _, err := f.Write(s); err != nil {
		f.Close()
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	return s, f.Close()
}

// Connection is what every population of this process shares: the
// driver, the run id, keepalive, backoff, connect rate and source
// addresses of the configuration, the prober's self-monitor h and its view
// of the target's reach (nil for a soak run, whose failures are its own).
func (t *Target) Connection(h engine.Health, reach *engine.Reach) engine.Connection {
	p := t.Config.Population
	return engine.Connection{
		Driver: t.Driver, Run: t.Run, Heartbeat: p.Heartbeat,
		BackoffMin: p.Backoff.Initial, BackoffMax: p.Backoff.Max,
		SourceAddrs: t.Sources, MaxConnectRate: p.MaxConnectRate,
		Health: h, Reach: reach,
		CatchUp: t.Config.Target.CatchUp != config.CatchUpOff,
		Reactor: p.Reactor,
	}
}

// UserAgent is what imcanary calls itself in every request to a target,
// so that the server's operators can tell synthetic traffic apart:
// "imcanary/VERSION".
func UserAgent() string {
	v := version.Version
	if v == "" {
		v = "unknown"
	}
	return "imcanary/" + v
}

// requestHeader is the header of every request to the target: the
// User-Agent, then target.headers, whose values it reads (a User-Agent
// among them replaces imcanary's). Errors name the header, never a value.
func requestHeader(extra []config.Header) (http.Header, error) {
	h := http.Header{}
	h.Set("User-Agent", UserAgent())
	for i, x := range extra {
		v, err := x.Read()
		if err != nil {
			return nil, fmt.Errorf("target.headers[%d].value_file: %w", i, err)
		}
		h.Set(x.Name, v)
	}
	return h, nil
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
