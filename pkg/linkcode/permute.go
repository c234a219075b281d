package linkcode

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"fmt"
)

// CodeSpace (62^7) is the number of 7-character base62 codes: the domain and
// range of a Permutation.
const CodeSpace int64 = 62 * SequentialOffset

// MinKeyLength is the shortest key NewPermutation accepts (32 characters,
// e.g. `openssl rand -hex 32` gives 64).
const MinKeyLength = 32

// codeHalfBits: the Feistel network works on 42-bit numbers (2^42 > 62^7,
// two 21-bit halves). feistelRounds is well above the 4 rounds a strong
// pseudorandom permutation needs (Luby-Rackoff), as small domains want.
const (
	codeHalfBits  = 21
	feistelRounds = 10
)

// Permutation is a keyed bijection of [0, 62^7): the ID a block allocation
// hands out becomes a 7-character code that looks random to anyone without
// the key, so codes cannot be walked from one another, while one nextval
// still covers a whole block and no two IDs ever share a code (no insert
// retries among permuted codes). It is a 10-round Feistel network over 42
// bits whose round function is AES under a key derived from the secret,
// restricted to [0, 62^7) by cycle walking. Safe for concurrent use.
type Permutation struct {
	block cipher.Block
	// half is the bit width of a Feistel half and space the size of the
	// permuted domain (< 2^(2*half)): codeHalfBits and CodeSpace, except in
	// the tests that check every point of a small domain.
	half  uint
	space uint64
}

// NewPermutation returns the permutation keyed by key (at least
// MinKeyLength bytes). The same key always gives the same permutation.
func NewPermutation(key []byte) (*Permutation, error) {
	return newPermutation(key, codeHalfBits, uint64(CodeSpace))
}

func newPermutation(key []byte, half uint, space uint64) (*Permutation, error) {
	if len(key) < MinKeyLength {
		return nil, fmt.Errorf("linkcode: permutation key has %d bytes, want at least %d", len(key), MinKeyLength)
	}
	h := sha256.New()
	h.Write([]byte("kurz linkcode permutation v1\x00"))
	h.Write(key)
	block, err := aes.NewCipher(h.Sum(nil)) // 32 bytes: AES-256
	if err != nil {
		return nil, fmt.Errorf("linkcode: permutation cipher: %w", err)
	}
	return &Permutation{block: block, half: half, space: space}, nil
}

// Code returns the 7-character code of id (0 <= id < CodeSpace): the
// permuted number in base62, padded with leading zeros.
func (p *Permutation) Code(id int64) (string, error) {
	if id < 0 || uint64(id) >= p.space {
		return "", fmt.Errorf("%w: %d", ErrOutOfRange, id)
	}
	n := p.walk(uint64(id), p.forward)
	var buf [SequentialLength]byte
	for i := len(buf) - 1; i >= 0; i-- {
		buf[i] = Alphabet[n%62]
		n /= 62
	}
	return string(buf[:]), nil
}

// ID reverses Code; ok is false for anything that is not 7 base62
// characters.
func (p *Permutation) ID(code string) (id int64, ok bool) {
	if len(code) != SequentialLength {
		return 0, false
	}
	n, ok := Decode(code) // 7 digits: always below CodeSpace
	if !ok || uint64(n) >= p.space {
		return 0, false
	}
	return int64(p.walk(uint64(n), p.backward)), true
}

// walk applies step until the result falls back into [0, space) (cycle
// walking). step permutes [0, 2^42), so restricted this way it permutes
// [0, space): the walk from x follows x's cycle, which comes back to x itself
// at worst. For codes about 1 step in 5 lands outside, so a walk takes 1.25
// steps on average.
func (p *Permutation) walk(x uint64, step func(uint64) uint64) uint64 {
	for {
		x = step(x)
		if x < p.space {
			return x
		}
	}
}

func (p *Permutation) forward(x uint64) uint64 {
	l, r := x>>p.half, x&(1<<p.half-1)
	for i := range feistelRounds {
		l, r = r, l^p.round(i, r)
	}
	return l<<p.half | r
}

func (p *Permutation) backward(x uint64) uint64 {
	l, r := x>>p.half, x&(1<<p.half-1)
	for i := feistelRounds - 1; i >= 0; i-- {
		l, r = r^p.round(i, l), l
	}
	return l<<p.half | r
}

// round is the round function: a half's width of AES(i, v).
func (p *Permutation) round(i int, v uint64) uint64 {
	var in, out [aes.BlockSize]byte
	in[0] = byte(i)
	in[1], in[2], in[3] = byte(v>>16), byte(v>>8), byte(v)
	p.block.Encrypt(out[:], in[:])
	return (uint64(out[0])<<16 | uint64(out[1])<<8 | uint64(out[2])) & (1<<p.half - 1)
}
