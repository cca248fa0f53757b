package minheap

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPopsInOrder(t *testing.T) {
	less := func(a, b int) bool { return a < b }
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 10, 500} {
		var h []int
		var want []int
		for range n {
			x := rng.IntN(100) // ties included
			h = Push(h, x, less)
			want = append(want, x)
		}
		slices.Sort(want)
		var got []int
		for len(h) > 0 {
			var x int
			x, h = Pop(h, less)
			got = append(got, x)
		}
		if !slices.Equal(got, want) {
			t.Errorf("n=%d: popped %v, want %v", n, got, want)
		}
	}
}

// TestPopClearsSlot: what a pop takes out is no longer in the array.
func TestPopClearsSlot(t *testing.T) {
	less := func(a, b *int) bool { return *a < *b }
	one, two := 1, 2
	h := Push(Push([]*int(nil), &two, less), &one, less)
	_, h = Pop(h, less)
	if full := h[:cap(h)]; full[1] != nil {
		t.Errorf("the popped slot still holds %v", *full[1])
	}
}

func TestInterleaved(t *testing.T) {
	less := func(a, b int) bool { return a < b }
	var h []int
	h = Push(h, 5, less)
	h = Push(h, 3, less)
	x, h := Pop(h, less)
	h = Push(h, 4, less)
	h = Push(h, 1, less)
	y, h := Pop(h, less)
	z, _ := Pop(h, less)
	if x != 3 || y != 1 || z != 4 {
		t.Errorf("popped %d, %d, %d; want 3, 1, 4", x, y, z)
	}
}
