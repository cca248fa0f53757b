package daemon

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
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/centrifugo"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/probe/xmpp"
	"github.com/imcanary/imcanary/refserver"
	"github.com/prometheus/common/version"
)

// drivers maps target.protocol to its adapter: the one place that lists
// them.
var drivers = map[string]func(cfg config.Config, secret []byte, header http.Header) (probe.Driver, error){
	"embedded": func(cfg config.Config, secret []byte, header http.Header) (probe.Driver, error) {
		return reference.New(reference.Options{URL: cfg.Target.URL, Header: header, Secret: secret, Heartbeat: cfg.Population.Heartbeat})
	},
	"xmpp": func(cfg config.Config, secret []byte, header http.Header) (probe.Driver, error) {
		if secret == nil {
			return nil, fmt.Errorf("xmpp derives the users' passwords from the target secret: set target.secret_file or %s", config.SecretEnv)
		}
		x := cfg.Target.XMPP
		return xmpp.New(xmpp.Options{
			URL: cfg.Target.URL, Header: header, Domain: x.Domain, MUCService: x.MUCService, Register: x.Register, Resume: x.Resume,
			Heartbeat: cfg.Population.Heartbeat,
			// Each user's password is an HMAC of its name: one secret
			// provisions and logs in every user, none is written down.
			Password: func(user string) string { return refserver.Token(secret, user) },
		})
	},
	"centrifugo": func(cfg config.Config, secret []byte, header http.Header) (probe.Driver, error) {
		if secret == nil {
			return nil, fmt.Errorf("centrifugo needs the token secret: set target.secret_file or %s", config.SecretEnv)
		}
		c := cfg.Target.Centrifugo
		return centrifugo.New(centrifugo.Options{
			URL: cfg.Target.URL, Header: header, Secret: secret, GroupNamespace: c.GroupNamespace, DirectNamespace: c.DirectNamespace,
			TokenTTL: c.TokenTTL, Heartbeat: cfg.Population.Heartbeat, Recover: c.Recover,
		})
	},
}

// env is what every command that talks to a target needs: the driver, and
// the reference server when it runs in this process.
type env struct {
	cfg    config.Config // with target.url filled in for an in-process target
	driver probe.Driver
	secret []byte
	run    string
	// sources are the addresses of population.source_addrs, which every
	// population spreads its users over; nil lets the kernel pick.
	sources []netip.Addr

	target   *refserver.Server
	targetLn net.Listener
	wg       sync.WaitGroup
	stop     context.CancelFunc
}

// inProcess reports whether the reference server runs in this process, its
// connections counting against the same file limit.
func (e *env) inProcess() bool { return e.target != nil || e.targetLn != nil }

// newEnv builds the driver for cfg. pops are the sizes of the populations
// the command will run at once, for the open-file and port checks. With
// protocol embedded and no URL it opens a reference server's listener on a
// free loopback port; startTarget serves it.
func newEnv(cfg config.Config, pops []int, log *slog.Logger) (*env, error) {
	e := &env{cfg: cfg, run: newRunID()}
	inProcess := cfg.Target.Protocol == "embedded" && cfg.Target.URL == ""
	users := 0
	for _, n := range pops {
		users += n
	}
	if err := checkFileLimit(users, inProcess); err != nil {
		return nil, err
	}
	sources, err := config.ParseSourceAddrs(cfg.Population.SourceAddrs)
	if err != nil {
		return nil, fmt.Errorf("population.source_addrs: %w", err)
	}
	e.sources = sources
	if err := checkPorts(pops, len(sources), ephemeralPorts()); err != nil {
		return nil, err
	}
	secret, err := loadSecret(cfg)
	if err != nil {
		return nil, err
	}
	e.secret = secret
	if e.secret == nil && cfg.Target.Protocol == "xmpp" {
		// XMPP passwords are imcanary's own: with no secret configured,
		// one is made once and kept in the data directory, so that the
		// users registered today can still log in after a restart.
		if e.secret, err = localSecret(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if inProcess {
		if e.secret == nil {
			e.secret = make([]byte, 32)
			_, _ = rand.Read(e.secret)
		}
		ts, err := refserver.New(refserver.Options{Secret: e.secret, Logger: log.With("component", "target")})
		if err != nil {
			return nil, fmt.Errorf("reference server: %w", err)
		}
		e.target = ts
		if e.targetLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("reference server: %w", err)
		}
		e.cfg.Target.URL = "ws://" + e.targetLn.Addr().String() + "/ws"
	}
	header, err := requestHeader(cfg.Target.Headers)
	if err != nil {
		e.close()
		return nil, err
	}
	newDriver, found := drivers[e.cfg.Target.Protocol]
	if !found {
		e.close()
		return nil, fmt.Errorf("target.protocol: %q: no such driver", e.cfg.Target.Protocol)
	}
	if e.driver, err = newDriver(e.cfg, e.secret, header); err != nil {
		e.close()
		return nil, fmt.Errorf("target.protocol %s: %w", e.cfg.Target.Protocol, err)
	}
	return e, nil
}

// startTarget serves the in-process target, if any, until close.
func (e *env) startTarget(log *slog.Logger) {
	if e.target == nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	e.stop = stop
	log.Info("reference server listening", "url", e.cfg.Target.URL)
	// Exits when close cancels ctx.
	e.wg.Go(func() {
		if err := e.target.Serve(ctx, e.targetLn); err != nil {
			log.Error("reference server stopped", "err", err)
		}
	})
}

// close stops the in-process target and waits for it.
func (e *env) close() {
	if e.stop != nil {
		e.stop()
		e.wg.Wait()
		return
	}
	if e.targetLn != nil {
		e.targetLn.Close()
	}
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

// connection is what every population of this process shares: the
// driver, the run id, keepalive, backoff, connect rate and source
// addresses of the configuration, the prober's self-monitor and its view
// of the target's reach (nil for a soak run, whose failures are its own).
func (e *env) connection(h probe.Health, reach *probe.Reach) probe.Connection {
	p := e.cfg.Population
	return probe.Connection{
		Driver: e.driver, Run: e.run, Heartbeat: p.Heartbeat,
		BackoffMin: p.Backoff.Initial, BackoffMax: p.Backoff.Max,
		SourceAddrs: e.sources, MaxConnectRate: p.MaxConnectRate,
		Health: h, Reach: reach,
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
