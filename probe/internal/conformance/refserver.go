package conformance

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
)

// Reference serves a reference server with o (and faults f) on loopback
// until the test ends, for the adapters that speak its protocol (the
// reference adapter, and jsonws with its mapping): a Server's Start.
// tg is the rest of the target (its Secret is the server's, its Section
// the adapter's); a second login of a user is the kick (MaxDevices 1),
// which the adapter must report as a conflict.
func Reference(t *testing.T, o refserver.Options, f Faults, via func(string) string, a probe.Adapter, tg probe.Target) Instance {
	t.Helper()
	return ReferenceTLS(t, nil, o, f, via, a, tg)
}

// ReferenceTLS is Reference over TLS of cfg (wss://), or plain if cfg is
// nil. The adapter's driver must trust cfg's certificate.
func ReferenceTLS(t *testing.T, cfg *tls.Config, o refserver.Options, f Faults, via func(string) string, a probe.Adapter, tg probe.Target) Instance {
	t.Helper()
	o.Secret = tg.Secret
	o.Faults.Duplicate, o.Faults.DropPush = f.Duplicate, f.DropPush
	o.MaxDevices = 1
	srv, err := refserver.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "ws://"
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
		scheme = "wss://"
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	tg.URL = scheme + via(ln.Addr().String()) + "/ws"
	return Instance{
		Target: tg,
		Injected: func() (uint64, uint64) {
			st := srv.Stats()
			return st.Duplicated, st.DroppedPush
		},
		Kick:       func(user string) { LoginAgain(t, a, tg, user, probe.Device{Index: 1}) },
		KickReason: metrics.ReasonConflict,
	}
}
