package logging

import (
	"io"
	"sync"
	"time"
)

// bufferedLimit is how many bytes a Buffered writer holds before it writes
// them at once, whatever its interval.
const bufferedLimit = 64 << 10

// Buffered collects log lines and writes them to the underlying writer in
// one write each interval, when it holds 64 KiB, and on Flush and Close:
// under load the limiter logs every denial, and a write system call per line
// cost more than encoding it. A line is never split across writes. What a
// crash or SIGKILL leaves in the buffer is lost: at most one interval of
// lines.
type Buffered struct {
	mu   sync.Mutex
	w    io.Writer
	buf  []byte
	err  error // the last write error, returned by the next Write and Flush
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewBuffered returns a Buffered writer to w that flushes every interval,
// which must be positive.
func NewBuffered(w io.Writer, interval time.Duration) *Buffered {
	b := &Buffered{w: w, buf: make([]byte, 0, bufferedLimit), stop: make(chan struct{}), done: make(chan struct{})}
	go b.run(interval)
	return b
}

func (b *Buffered) run(interval time.Duration) {
	defer close(b.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			_ = b.Flush()
		case <-b.stop:
			return
		}
	}
}

// Write buffers p, one log line; it writes the buffer first if p would not
// fit, and p directly if it is larger than the buffer.
func (b *Buffered) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf)+len(p) > bufferedLimit {
		b.flushLocked()
		if len(p) > bufferedLimit {
			if _, err := b.w.Write(p); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	b.buf = append(b.buf, p...)
	err := b.err
	b.err = nil
	return len(p), err
}

// Flush writes what the buffer holds.
func (b *Buffered) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	err := b.err
	b.err = nil
	return err
}

func (b *Buffered) flushLocked() {
	if len(b.buf) == 0 {
		return
	}
	if _, err := b.w.Write(b.buf); err != nil {
		b.err = err
	}
	b.buf = b.buf[:0]
}

// Close stops the interval flushes and writes what is left. Lines written
// after Close are buffered until the next Flush, so call it last.
func (b *Buffered) Close() error {
	b.once.Do(func() {
		close(b.stop)
		<-b.done
	})
	return b.Flush()
}
