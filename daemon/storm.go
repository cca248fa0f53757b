package daemon

import (
	"time"

	"github.com/imcanary/imcanary/engine"
)

// Drop is a reconnect-storm drill's drop of the background population
// (soak.StormTarget): fraction of the sessions online in every block,
// aborted at once. Users are numbered over the whole population, as
// PREFIX-uN names them.
func (b *background) Drop(fraction float64, obs engine.StormObserver) (online, dropped int, err error) {
	b.mu.Lock()
	blocks := append([]*block(nil), b.blocks...)
	b.mu.Unlock()
	// Each block is marked and aborted in turn: microseconds apart per
	// session, which is at once next to any reconnect.
	for _, bl := range blocks {
		on, n, err := bl.pop.Drop(fraction, offsetStorm{obs, bl.offset})
		if err != nil {
			return online, dropped, err
		}
		online, dropped = online+on, dropped+n
	}
	return online, dropped, nil
}

// offsetStorm numbers a block's users from the block's offset.
type offsetStorm struct {
	engine.StormObserver
	offset int
}

func (o offsetStorm) Dropped(user, device int) { o.StormObserver.Dropped(o.offset+user, device) }

func (o offsetStorm) Attempt(user int, start, end time.Time, err error) {
	o.StormObserver.Attempt(o.offset+user, start, end, err)
}
