package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
)

// background is the background population, resizable while it runs.
//
// Why blocks: a engine.Population's users, their pairs and groups and the
// ledger's expectations are laid out once; changing them under a running
// population would touch every user's streams. Instead a reload that adds
// users starts a block of its own, a Population numbered on from the last
// (PREFIX-uN, PREFIX-gN continue), and one that removes users stops whole
// blocks from the end. Nobody else reconnects, and the messages of users
// who stay are not disturbed. The one exception: a size that cuts through
// a block replaces that block by a smaller one, whose users log in again.
// All blocks share the process's connect limiter, with the canary and
// the soak runs, so population.max_connect_rate holds for the process.
type background struct {
	// newBlock builds a block of users, numbered from offset and
	// groupOffset.
	newBlock func(offset, groupOffset, users int) (*engine.Population, error)
	set      *metrics.Set
	log      *slog.Logger

	mu     sync.Mutex
	ctx    context.Context // run's; nil before run
	blocks []*block
	wg     sync.WaitGroup
}

// block is one engine.Population of the background population.
type block struct {
	pop                        *engine.Population
	offset, groupOffset, users int
	groups                     int
	cancel                     context.CancelFunc
	done                       chan struct{}
}

// readyEvery is how often the ready and wanted-sessions gauges are brought up to
// date with the blocks.
const readyEvery = 250 * time.Millisecond

func newBackground(users int, set *metrics.Set, log *slog.Logger, newBlock func(offset, groupOffset, users int) (*engine.Population, error)) (*background, error) {
	b := &background{newBlock: newBlock, set: set, log: log}
	if err := b.add(users); err != nil {
		return nil, err
	}
	return b, nil
}

// add appends a block of n users, started at once if run has begun.
// b.mu must be held, or b not yet shared.
func (b *background) add(n int) error {
	offset, groupOffset := 0, 0
	if len(b.blocks) > 0 {
		last := b.blocks[len(b.blocks)-1]
		offset, groupOffset = last.offset+last.users, last.groupOffset+last.groups
	}
	pop, err := b.newBlock(offset, groupOffset, n)
	if err != nil {
		return err
	}
	bl := &block{pop: pop, offset: offset, groupOffset: groupOffset, users: n, groups: len(pop.Plan().Groups)}
	b.blocks = append(b.blocks, bl)
	if b.ctx != nil {
		b.start(bl)
	}
	return nil
}

// start runs bl until b's context ends or bl is stopped.
func (b *background) start(bl *block) {
	ctx, cancel := context.WithCancel(b.ctx)
	bl.cancel, bl.done = cancel, make(chan struct{})
	b.wg.Add(1)
	// Exits when ctx ends, after closing its sessions.
	go func() {
		defer b.wg.Done()
		defer close(bl.done)
		_ = bl.pop.Run(ctx)
	}()
}

// run runs every block until ctx ends, and keeps the population's target
// and ready gauges.
func (b *background) run(ctx context.Context) {
	b.mu.Lock()
	b.ctx = ctx
	for _, bl := range b.blocks {
		b.start(bl)
	}
	b.mu.Unlock()
	tick := time.NewTicker(readyEvery)
	defer tick.Stop()
	for {
		b.gauges()
		select {
		case <-ctx.Done():
			b.wg.Wait()
			b.set.Ready.Set(0)
			return
		case <-tick.C:
		}
	}
}

func (b *background) gauges() {
	b.set.Wanted.Set(float64(b.Sessions()))
	ready := 0.0
	if b.Ready() {
		ready = 1
	}
	b.set.Ready.Set(ready)
}

// resize changes the population to n users: a block of the new users, or
// the blocks past n stopped (their sessions closed, as at shutdown). It
// returns once removed users are logged out. Resizes must not run
// concurrently (the daemon's reloads are serialised).
func (b *background) resize(n int) error {
	if n < 1 {
		return fmt.Errorf("population.users %d: must be at least 1", n)
	}
	b.mu.Lock()
	total := b.users()
	if n > total {
		defer b.mu.Unlock()
		if err := b.add(n - total); err != nil {
			return err
		}
		b.log.Info("population grown", "from", total, "to", n)
		return nil
	}
	var stop []*block
	keep := 0
	for n < b.users() {
		last := b.blocks[len(b.blocks)-1]
		b.blocks = b.blocks[:len(b.blocks)-1]
		stop = append(stop, last)
		keep = max(0, n-last.offset)
	}
	b.mu.Unlock()
	// Outside the lock: a block takes up to the shutdown timeout to log
	// its users out, and /readyz must not wait for it.
	for _, bl := range stop {
		if bl.cancel != nil {
			bl.cancel()
			<-bl.done
		}
	}
	if keep > 0 {
		// The size cut through the last block stopped: a smaller one
		// takes its place, and its users log in again.
		b.log.Info("population shrunk through a block: its remaining users log in again", "users", keep)
		b.mu.Lock()
		err := b.add(keep)
		b.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if n < total {
		b.log.Info("population shrunk", "from", total, "to", n)
	}
	return nil
}

// users is the total, b.mu held.
func (b *background) users() int {
	n := 0
	for _, bl := range b.blocks {
		n += bl.users
	}
	return n
}

// Users returns how many users the population has now.
func (b *background) Users() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.users()
}

// Sessions returns the sessions the blocks keep online: each user's
// devices.
func (b *background) Sessions() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, bl := range b.blocks {
		// This process's: a block laid out across shards runs a
		// slice of its users here.
		sl := bl.pop.Slice()
		n += (sl.Hi - sl.Lo) * bl.pop.Devices()
	}
	return n
}

// Online returns the sessions online over every block.
func (b *background) Online() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, bl := range b.blocks {
		n += bl.pop.Online()
	}
	return n
}

// Ready reports whether every block has been whole online.
func (b *background) Ready() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bl := range b.blocks {
		if !bl.pop.Ready() {
			return false
		}
	}
	return len(b.blocks) > 0
}
