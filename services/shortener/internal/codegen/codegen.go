// Package codegen hands out short codes: sequential codes from IDs allocated
// in blocks (one database round trip per block per process), and random codes
// from a cryptographic source.
package codegen

import (
	"context"
	"fmt"
	"io"
	"sync"

	"kurz.dev/pkg/linkcode"
)

// BlockSource returns block numbers: block n is IDs [n*size, (n+1)*size).
// Each call must return a number no caller ever got before (a PostgreSQL
// sequence's nextval does).
type BlockSource func(ctx context.Context) (int64, error)

// Blocks hands out IDs from blocks of size; safe for concurrent use. Two
// processes never share a block, so replicas never collide, provided they all
// use the same size.
type Blocks struct {
	source BlockSource
	size   int64

	mu        sync.Mutex
	next, end int64
	fetched   func() // called after each block fetch (metrics)
}

// NewBlocks returns an allocator over source. onFetch, if not nil, runs after
// every block fetched.
func NewBlocks(source BlockSource, size int64, onFetch func()) *Blocks {
	return &Blocks{source: source, size: size, fetched: onFetch}
}

// Next returns an ID no other caller (in this or another process) gets. The
// lock is held across a block fetch on purpose: concurrent callers wait for
// that one fetch rather than each fetching a block.
func (b *Blocks) Next(ctx context.Context) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next == b.end {
		n, err := b.source(ctx)
		if err != nil {
			return 0, err
		}
		if n < 0 || n > (linkcode.MaxSequentialID+1)/b.size-1 {
			return 0, fmt.Errorf("block %d of size %d is past the last 7-character code", n, b.size)
		}
		b.next, b.end = n*b.size, (n+1)*b.size
		if b.fetched != nil {
			b.fetched()
		}
	}
	id := b.next
	b.next++
	return id, nil
}

// NextCode returns the sequential code of the next ID, skipping IDs whose
// code is a reserved word.
func (b *Blocks) NextCode(ctx context.Context) (string, error) {
	for {
		id, err := b.Next(ctx)
		if err != nil {
			return "", err
		}
		code, err := linkcode.Sequential(id)
		if err != nil {
			return "", err
		}
		if !linkcode.Reserved(code) {
			return code, nil
		}
	}
}

// Random draws random codes of a fixed length.
type Random struct {
	mu     sync.Mutex
	src    io.Reader
	length int
}

// NewRandom returns a generator of length-character codes from src
// (crypto/rand when nil; tests pass a seeded source to make collisions
// predictable).
func NewRandom(src io.Reader, length int) *Random {
	return &Random{src: src, length: length}
}

// Code returns a fresh random code that is not a reserved word.
func (r *Random) Code() (string, error) {
	r.mu.Lock() // a seeded test source is not safe for concurrent use
	defer r.mu.Unlock()
	for {
		code, err := linkcode.Random(r.src, r.length)
		if err != nil {
			return "", err
		}
		if !linkcode.Reserved(code) {
			return code, nil
		}
	}
}
