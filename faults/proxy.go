// Package faults injects real faults into the real local stack — a killed
// Redis master, a slow or unreachable dependency, a service killed mid-work,
// a rolling restart — and checks that every service keeps the promise it
// makes for that fault. The tests run the services as processes on loopback
// ports; the faults are processes killed with SIGKILL and TCP proxies that
// add latency or cut connections between a service and what it depends on.
package faults

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from its own loopback address to a target
// and injects faults on the way: latency on every chunk a client sends, a
// cut (open connections reset, new ones accepted and reset at once, as a
// crashed host behind a live address would), or the open connections
// isolated (what either side sends is dropped, as across a partition).
type Proxy struct {
	lis    net.Listener
	target string

	mu       sync.Mutex
	delay    time.Duration
	cut      bool
	conns    map[net.Conn]struct{}
	isolated map[net.Conn]struct{}
	done     chan struct{}
	wg       sync.WaitGroup
}

// NewProxy listens on addr ("127.0.0.1:0" for any free port) and forwards to
// target until Close.
func NewProxy(addr, target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}, isolated: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// SetDelay holds every chunk a client sends for d before forwarding it: each
// request/response round trip takes d longer. Zero removes the latency.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Cut resets every open connection and every new one until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		reset(c)
	}
}

// Isolate drops, from now on, whatever either side of every connection
// open now sends, and leaves the connections open, as a network partition
// between the two ends would; connections opened later are forwarded as
// usual. It is never undone (a stream that lost bytes cannot go on): Cut
// or Close ends those connections.
func (p *Proxy) Isolate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.isolated[c] = struct{}{}
	}
}

func (p *Proxy) isIsolated(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.isolated[c]
	return ok
}

// Restore ends a Cut and removes any latency.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut, p.delay = false, 0
	p.mu.Unlock()
}

// Close stops listening, resets every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	close(p.done)
	err := p.lis.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	for {
		client, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			reset(client)
			continue
		}
		p.wg.Go(func() { p.forward(client) })
	}
}

// track registers an accepted connection unless the proxy is cut or closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
	}
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.isolated, c)
	p.mu.Unlock()
}

func (p *Proxy) currentDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

func (p *Proxy) forward(client net.Conn) {
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		reset(client)
		return
	}
	if !p.track(server) {
		reset(server)
		reset(client)
		return
	}
	defer p.untrack(server)
	var both sync.WaitGroup
	both.Go(func() { p.pipe(server, client, true) })
	both.Go(func() { p.pipe(client, server, false) })
	both.Wait()
}

// pipe copies src to dst. Chunks from a client are held for the latency in
// force when each arrived, counted from its arrival, so pipelined requests
// are each late by the latency rather than by its multiples. When either side
// ends, both connections are closed.
func (p *Proxy) pipe(dst, src net.Conn, delayed bool) {
	defer dst.Close()
	defer src.Close()
	type chunk struct {
		data []byte
		due  time.Time
	}
	chunks := make(chan chunk, 64)
	var readErr error
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				c := chunk{data: buf[:n]}
				if delayed {
					c.due = time.Now().Add(p.currentDelay())
				}
				chunks <- c
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()
	for c := range chunks {
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait) // the fault itself: this chunk is late
		}
		if p.isIsolated(src) {
			continue // the fault itself: this chunk never arrives
		}
		if _, err := dst.Write(c.data); err != nil {
			src.Close() // unblocks the reader
			for range chunks {
			}
			return
		}
	}
	if !errors.Is(readErr, io.EOF) {
		reset(dst)
	}
}

// reset closes c with an RST instead of a FIN, as a crashed peer does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
