package probe

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

type answerRecorder struct {
	acks    []string
	rejects []string
	failed  []uint64
}

func (r *answerRecorder) OnAck(ref uint64, a Ack)         { r.acks = append(r.acks, string(a.ServerID)) }
func (r *answerRecorder) OnReject(ref uint64, why string) { r.rejects = append(r.rejects, why) }
func (r *answerRecorder) OnDelivery(*Delivery)            {}
func (r *answerRecorder) OnSendFailed(ref uint64, _ error) {
	r.failed = append(r.failed, ref)
}

// plainRecorder is a Handler that is no SendFailer.
type plainRecorder struct{ rejects []string }

func (r *plainRecorder) OnAck(uint64, Ack)             {}
func (r *plainRecorder) OnReject(_ uint64, why string) { r.rejects = append(r.rejects, why) }
func (r *plainRecorder) OnDelivery(*Delivery)          {}

func TestAnswers(t *testing.T) {
	var a Answers
	a.Report(Answer{Ref: 1, ServerID: "p1"})
	a.Report(Answer{Ref: 2, Reject: "refused"})
	r := &answerRecorder{}
	if a.Handler() != nil {
		t.Fatal("a handler before Serve")
	}
	a.Serve(r)
	if len(r.acks) != 1 || r.acks[0] != "p1" || len(r.rejects) != 1 || r.rejects[0] != "refused" {
		t.Fatalf("kept answers: acks %v rejects %v", r.acks, r.rejects)
	}
	a.Report(Answer{Ref: 3, Err: errors.New("no answer")})
	if len(r.failed) != 1 || r.failed[0] != 3 {
		t.Errorf("unanswered send: failed %v, want [3]", r.failed)
	}
	var b Answers
	p := &plainRecorder{}
	b.Serve(p)
	b.Report(Answer{Ref: 4, Err: errors.New("no answer")})
	if len(p.rejects) != 1 || p.rejects[0] != "no answer" {
		t.Errorf("unanswered send to a plain handler: %v, want a rejection", p.rejects)
	}
}

func TestParallel(t *testing.T) {
	var done atomic.Int64
	if err := Parallel(context.Background(), 100, 8, func(context.Context, int) error { done.Add(1); return nil }); err != nil || done.Load() != 100 {
		t.Fatalf("%v, %d done", err, done.Load())
	}
	var running, most atomic.Int64
	boom := errors.New("boom")
	err := Parallel(context.Background(), 1000, 3, func(ctx context.Context, i int) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("error %v, want boom", err)
	}
	if most.Load() > 3 {
		t.Errorf("%d at once, want at most 3", most.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Parallel(ctx, 5, 2, func(context.Context, int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
