// Package codegen hands out short codes: block codes from IDs allocated in
// blocks (one database round trip per block per process; a batch fetches
// every block it needs in one round trip), each ID turned into its code by a
// keyed permutation (linkcode.Permutation) so that codes cannot be walked,
// and random codes from a cryptographic source.
package codegen

import (
	"context"
	"fmt"
	"io"
	"sync"

	"kurz.dev/pkg/linkcode"
)

// BlockSource returns n (n >= 1) block numbers in one round trip: block b is
// IDs [b*size, (b+1)*size). Each number must be one no caller ever got before
// (a PostgreSQL sequence's nextval is).
type BlockSource func(ctx context.Context, n int) ([]int64, error)

// Blocks hands out IDs from blocks of size, and their codes; safe for
// concurrent use. Two processes never share a block, so replicas never
// collide, provided they all use the same size and the same permutation key.
type Blocks struct {
	source BlockSource
	size   int64
	codes  *linkcode.Permutation

	mu        sync.Mutex
	next, end int64
	fetched   func() // called once per block fetched (metrics)
}

// NewBlocks returns an allocator over source whose IDs become codes through
// codes. onFetch, if not nil, runs once for every block fetched.
func NewBlocks(source BlockSource, size int64, codes *linkcode.Permutation, onFetch func()) *Blocks {
	return &Blocks{source: source, size: size, codes: codes, fetched: onFetch}
}

// Next returns an ID no other caller (in this or another process) gets.
func (b *Blocks) Next(ctx context.Context) (int64, error) {
	ids, err := b.Take(ctx, 1)
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// Take returns n (n >= 1) IDs no other caller gets, with at most one round
// trip to the source: the IDs left in the current block come first, and the
// blocks that cover the rest are fetched together (ceil(rest/size) of them in
// one call). The last fetched block's unused IDs stay for later calls, so a
// batch wastes nothing. The lock is held across the fetch on purpose:
// concurrent callers wait for that one fetch rather than each fetching.
func (b *Blocks) Take(ctx context.Context, n int) ([]int64, error) {
	if n < 1 {
		return nil, fmt.Errorf("take %d IDs: want at least 1", n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	want := int64(n)
	var blocks []int64
	if missing := want - (b.end - b.next); missing > 0 {
		var err error
		if blocks, err = b.source(ctx, int((missing+b.size-1)/b.size)); err != nil {
			return nil, err
		}
		for _, blk := range blocks {
			if blk < 0 || blk > linkcode.CodeSpace/b.size-1 {
				return nil, fmt.Errorf("block %d of size %d is past the last 7-character code", blk, b.size)
			}
		}
		if b.fetched != nil {
			for range blocks {
				b.fetched()
			}
		}
	}
	ids := make([]int64, 0, n)
	for {
		for b.next < b.end && int64(len(ids)) < want {
			ids = append(ids, b.next)
			b.next++
		}
		if int64(len(ids)) == want {
			return ids, nil
		}
		if len(blocks) == 0 {
			return nil, fmt.Errorf("block source returned too few blocks for %d IDs", n)
		}
		b.next, b.end = blocks[0]*b.size, (blocks[0]+1)*b.size
		blocks = blocks[1:]
	}
}

// NextCode returns the code of the next ID, skipping IDs whose code is a
// reserved word.
func (b *Blocks) NextCode(ctx context.Context) (string, error) {
	codes, err := b.NextCodes(ctx, 1)
	if err != nil {
		return "", err
	}
	return codes[0], nil
}

// NextCodes returns the codes of n fresh IDs, skipping IDs whose code is a
// reserved word. One Take covers the n IDs (at most one round trip);
// only when reserved words among them leave it short does it Take the few it
// lacks, which come from the current block's remainder unless that block
// ended exactly at the batch (then it costs a second round trip).
func (b *Blocks) NextCodes(ctx context.Context, n int) ([]string, error) {
	codes := make([]string, 0, n)
	for len(codes) < n {
		ids, err := b.Take(ctx, n-len(codes))
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			code, err := b.codes.Code(id)
			if err != nil {
				return nil, err
			}
			if !linkcode.Reserved(code) {
				codes = append(codes, code)
			}
		}
	}
	return codes, nil
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
