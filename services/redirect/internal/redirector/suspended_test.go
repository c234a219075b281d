package redirector

import (
	"sync"
	"testing"
)

// A nil set and one never Set hold no tenant; Set replaces the whole set.
func TestSuspendedSet(t *testing.T) {
	var none *Suspended
	if none.Has("a") || none.Len() != 0 || none.Loaded() {
		t.Error("a nil set holds something")
	}
	s := &Suspended{}
	if s.Has("a") || s.Len() != 0 || s.Loaded() {
		t.Error("a set never Set holds something")
	}
	s.Set(map[string]struct{}{"a": {}, "b": {}})
	if !s.Has("a") || !s.Has("b") || s.Has("c") || s.Has("") || s.Len() != 2 || !s.Loaded() {
		t.Errorf("after Set(a, b): Has(a)=%v Has(b)=%v Has(c)=%v Len=%d", s.Has("a"), s.Has("b"), s.Has("c"), s.Len())
	}
	s.Set(map[string]struct{}{"c": {}})
	if s.Has("a") || !s.Has("c") || s.Len() != 1 {
		t.Errorf("after Set(c): Has(a)=%v Has(c)=%v Len=%d; want the set replaced", s.Has("a"), s.Has("c"), s.Len())
	}
	s.Set(map[string]struct{}{})
	if s.Has("c") || s.Len() != 0 || !s.Loaded() {
		t.Error("after Set(): want nobody suspended, and the set still loaded")
	}
}

// Readers never block on, nor race with, a replacement (go test -race).
func TestSuspendedSetConcurrently(t *testing.T) {
	s := &Suspended{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					_ = s.Has("a")
				}
			}
		})
	}
	for i := range 1000 {
		m := map[string]struct{}{}
		if i%2 == 0 {
			m["a"] = struct{}{}
		}
		s.Set(m)
	}
	close(stop)
	wg.Wait()
	if s.Has("a") {
		t.Error("after the last Set (without a): a is suspended")
	}
}

// Has allocates nothing: it runs on every redirect.
func TestSuspendedHasAllocatesNothing(t *testing.T) {
	s := &Suspended{}
	s.Set(map[string]struct{}{"a": {}})
	if n := testing.AllocsPerRun(100, func() { _ = s.Has("t") }); n != 0 {
		t.Errorf("Has allocates %v times", n)
	}
}
