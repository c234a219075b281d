package logging

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// writes records every write it is given, whole.
type writes struct {
	mu     sync.Mutex
	chunks []string
	err    error
	wrote  chan struct{}
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	w.chunks = append(w.chunks, string(p))
	if w.wrote != nil {
		select {
		case w.wrote <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (w *writes) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.chunks...)
}

func TestBufferedHoldsLinesUntilFlushThenWritesThemOnce(t *testing.T) {
	var w writes
	b := NewBuffered(&w, time.Hour)
	defer b.Close()
	fmt.Fprintln(b, "one")
	fmt.Fprintln(b, "two")
	if got := w.got(); len(got) != 0 {
		t.Fatalf("written before a flush: %q", got)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := w.got(); len(got) != 1 || got[0] != "one\ntwo\n" {
		t.Errorf("after Flush: %q, want one write of both lines", got)
	}
}

func TestBufferedFlushesEveryInterval(t *testing.T) {
	w := writes{wrote: make(chan struct{}, 1)}
	b := NewBuffered(&w, time.Millisecond)
	defer b.Close()
	fmt.Fprintln(b, "waiting")
	select {
	case <-w.wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("no write within 10s of a 1ms interval")
	}
	if got := w.got(); len(got) != 1 || got[0] != "waiting\n" {
		t.Errorf("written %q", got)
	}
}

func TestBufferedWritesWhenFullAndNeverSplitsALine(t *testing.T) {
	var w writes
	b := NewBuffered(&w, time.Hour)
	defer b.Close()
	line := strings.Repeat("x", 1000) + "\n"
	n := bufferedLimit/len(line) + 1 // one more than fits
	for range n {
		fmt.Fprint(b, line)
	}
	got := w.got()
	if len(got) != 1 || len(got[0]) != (n-1)*len(line) {
		t.Fatalf("after %d lines of %d bytes: %d writes (%d bytes first), want one write of the %d that fit", n, len(line), len(got), len(firstOr(got)), n-1)
	}
	huge := strings.Repeat("y", 2*bufferedLimit) + "\n"
	fmt.Fprint(b, huge)
	got = w.got()
	if len(got) != 3 || got[1] != line || got[2] != huge {
		t.Errorf("a line larger than the buffer: writes of %v bytes, want the buffered line then the huge one whole", lens(got))
	}
}

func TestBufferedCloseWritesWhatIsLeft(t *testing.T) {
	var w writes
	b := NewBuffered(&w, time.Hour)
	fmt.Fprintln(b, "last words")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := w.got(); len(got) != 1 || got[0] != "last words\n" {
		t.Errorf("after Close: %q", got)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestBufferedReportsAFailedWrite(t *testing.T) {
	w := writes{err: errors.New("disk full")}
	b := NewBuffered(&w, time.Hour)
	defer b.Close()
	fmt.Fprintln(b, "lost")
	if err := b.Flush(); err == nil || err.Error() != "disk full" {
		t.Errorf("Flush = %v, want the write's error", err)
	}
}

func TestBufferedKeepsEveryLineOfConcurrentWriters(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	b := NewBuffered(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	}), 50*time.Microsecond)
	log, err := New(b, Config{Level: "info", Format: "json"}, "limiter")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				log.Warn("quota denied", "g", g, "i", i, "pad", strings.Repeat("p", 100))
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if !strings.HasPrefix(l, "{") || !strings.HasSuffix(l, "}") {
			t.Fatalf("a torn line: %.120q", l)
		}
		seen[l[strings.Index(l, `"g":`):]] = true
	}
	if len(seen) != 8*2000 {
		t.Errorf("%d distinct lines, want %d", len(seen), 8*2000)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func firstOr(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func lens(s []string) []int {
	n := make([]int, len(s))
	for i, c := range s {
		n[i] = len(c)
	}
	return n
}
