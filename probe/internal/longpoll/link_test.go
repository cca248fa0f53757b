package longpoll

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// TestClientPerLinkKind checks two populations' links that differ only in
// their connect series share one transport: MaxConns bounds the pool, not
// each population.
func TestClientPerLinkKind(t *testing.T) {
	m := metrics.New(prometheus.NewPedanticRegistry())
	bg, canary := m.For("t", metrics.SourceBackground), m.For("t", metrics.SourceCanary)
	p := NewPool(Settings{})
	a := p.client(probe.Link{Connect: &bg.Connect})
	b := p.client(probe.Link{Connect: &canary.Connect})
	if a != b {
		t.Errorf("client(link of background) != client(link of canary): want one transport for one kind of link")
	}
	if slow := p.client(probe.Link{Slow: true, Connect: &bg.Connect}); slow == a {
		t.Errorf("client(slow link) = client(fast link): want a transport per kind of link")
	}
}
