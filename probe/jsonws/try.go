package jsonws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// SetTrace makes the driver tell trace every frame its sessions write and
// read and every rule that matched, secrets redacted (imcanary jsonws try).
// It is set before the driver's first session.
func (d *Driver) SetTrace(trace func(Event)) { d.opts.Trace = trace }

// Try walks a mapping through what a monitor does, against the real
// server, one step at a time, and writes every frame and every rule that
// matched to w: it provisions a group of users a and b and their direct
// conversation, logs both in, sends one direct and one group message from
// a, and waits for each ack and for b's delivery of each. It returns the
// first step that failed, named; a user writing a mapping sees exactly
// where the server and the mapping part.
func Try(ctx context.Context, d *Driver, a, b string, timeout time.Duration, w io.Writer) error {
	var mu sync.Mutex
	printf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format, args...)
	}
	d.SetTrace(func(e Event) {
		switch e.What {
		case "send":
			printf("  %s > %s\n", e.User, e.Detail)
		case "read":
			printf("  %s < %s\n", e.User, e.Detail)
		case "match":
			if e.Key == "" {
				printf("  %s   %s\n", e.User, e.Detail)
			} else {
				printf("  %s   matched %s: %s\n", e.User, e.Key, e.Detail)
			}
		case "step":
			printf("  %s   %s: %s\n", e.User, e.Key, e.Detail)
		case "error":
			printf("  %s   %s: %s\n", e.User, e.Key, e.Detail)
		}
	})
	step := func(name string) { printf("\n== %s\n", name) }
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	group := "imcanary-try-group"
	plan := probe.Plan{
		Users:  []string{a, b},
		Direct: []probe.Pair{{From: a, To: b}, {From: b, To: a}},
	}
	if d.m.sendGroup != nil {
		plan.Groups = []probe.Group{{Name: group, Members: []string{a, b}}}
	}
	step("provision: users " + a + ", " + b + groupNote(plan))
	if err := d.Provision(ctx, plan); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	hs := map[string]*tryHandler{}
	sessions := map[string]probe.Session{}
	var wg sync.WaitGroup
	defer func() {
		for _, s := range sessions {
			_ = s.Close()
		}
		wg.Wait()
	}()
	for _, u := range []string{a, b} {
		step("login: " + u)
		s, err := d.Connect(ctx, u, probe.Device{})
		if err != nil {
			return fmt.Errorf("login %s: %w", u, err)
		}
		h := &tryHandler{acks: make(chan tryAck, 4), deliveries: make(chan []byte, 4)}
		hs[u], sessions[u] = h, s
		wg.Go(func() {
			err := s.Serve(h)
			if probe.ReasonOf(err) != "shutdown" {
				printf("  %s   session ended: %v\n", u, err)
			}
		})
	}
	sends := []struct {
		what string
		m    probe.Message
	}{{"direct message " + a + " -> " + b, probe.Message{Ref: 1, To: b}}}
	if d.m.sendGroup != nil {
		sends = append(sends, struct {
			what string
			m    probe.Message
		}{"group message " + a + " -> " + group, probe.Message{Ref: 2, Group: group}})
	}
	for _, sd := range sends {
		step(sd.what)
		m := sd.m
		m.Body = []byte(fmt.Sprintf("imcanary try %d %d", m.Ref, time.Now().UnixNano()))
		sentAt := time.Now()
		if err := sessions[a].Send(&m); err != nil {
			return fmt.Errorf("%s: send: %w", sd.what, err)
		}
		select {
		case ack := <-hs[a].acks:
			if ack.rejected != "" {
				return fmt.Errorf("%s: the server rejected it: %s", sd.what, ack.rejected)
			}
			printf("  ok: acked in %v\n", ack.at.Sub(sentAt).Round(time.Microsecond))
		case <-ctx.Done():
			return fmt.Errorf("%s: no ack matched send.ack within %v", sd.what, timeout)
		}
		select {
		case body := <-hs[b].deliveries:
			if !bytes.Equal(body, m.Body) {
				return fmt.Errorf("%s: %s got a delivery whose body (%q) is not the one sent: check delivery.body", sd.what, b, body)
			}
			printf("  ok: %s got it\n", b)
		case <-ctx.Done():
			return fmt.Errorf("%s: %s got no frame matching delivery.match within %v", sd.what, b, timeout)
		}
	}
	printf("\n== every step passed\n")
	return nil
}

func groupNote(p probe.Plan) string {
	if len(p.Groups) == 0 {
		return " (no send.group: no group)"
	}
	return ", group " + p.Groups[0].Name
}

type tryAck struct {
	rejected string
	at       time.Time
}

// tryHandler hands what a session reads to Try.
type tryHandler struct {
	acks       chan tryAck
	deliveries chan []byte
}

func (h *tryHandler) OnAck(uint64, probe.Ack) {
	select {
	case h.acks <- tryAck{at: time.Now()}:
	default:
	}
}

func (h *tryHandler) OnReject(_ uint64, reason string) {
	if reason == "" {
		reason = "(no code)"
	}
	select {
	case h.acks <- tryAck{rejected: reason, at: time.Now()}:
	default:
	}
}

func (h *tryHandler) OnDelivery(d *probe.Delivery) {
	select {
	case h.deliveries <- bytes.Clone(d.Body):
	default:
	}
}

// ErrNotJSONWS is Try's error for a driver of another protocol.
var ErrNotJSONWS = errors.New("target.protocol is not jsonws: imcanary jsonws try walks a jsonws mapping")
