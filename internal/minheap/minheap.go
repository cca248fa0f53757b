// Package minheap keeps a slice as a binary min-heap. It is container/heap
// without the interface: container/heap's Push and Pop box each element,
// an allocation every time, which the places that keep a heap here (a
// delay line, a poller's deadlines) do per message or per session.
package minheap

// Push adds x to the heap h, ordered by less, and returns the heap.
func Push[S ~[]T, T any](h S, x T, less func(a, b T) bool) S {
	h = append(h, x)
	for i := len(h) - 1; i > 0; {
		up := (i - 1) / 2
		if !less(h[i], h[up]) {
			break
		}
		h[i], h[up] = h[up], h[i]
		i = up
	}
	return h
}

// Pop removes the least element of the non-empty heap h and returns it
// and the heap. The slot it leaves is zeroed, so that the array keeps
// nothing alive.
func Pop[S ~[]T, T any](h S, less func(a, b T) bool) (T, S) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	var zero T
	h[last] = zero
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && less(h[l], h[m]) {
			m = l
		}
		if r < len(h) && less(h[r], h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}
