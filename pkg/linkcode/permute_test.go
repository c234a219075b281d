package linkcode

import (
	"errors"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
)

var testKey = []byte("linkcode-test-key-0123456789abcdef")

func mustPermutation(t *testing.T, key []byte) *Permutation {
	t.Helper()
	p, err := NewPermutation(key)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPermutationIsABijectionOfSmallDomains checks every point of small
// domains, where the whole permutation fits in memory: the same Feistel
// network and cycle walk as codes use, with narrower halves. Each maps
// [0, space) onto itself with no two points sharing an image, and ID undoes
// Code.
func TestPermutationIsABijectionOfSmallDomains(t *testing.T) {
	for _, dom := range []struct {
		half  uint
		space uint64
	}{{5, 700}, {5, 1024}, {8, 40_000}, {9, 250_000}} {
		p, err := newPermutation(testKey, dom.half, dom.space)
		if err != nil {
			t.Fatal(err)
		}
		seen := make([]bool, dom.space)
		for id := range int64(dom.space) {
			code, err := p.Code(id)
			if err != nil {
				t.Fatalf("space %d: Code(%d): %v", dom.space, id, err)
			}
			n, _ := Decode(code)
			if n < 0 || uint64(n) >= dom.space || seen[n] {
				t.Fatalf("space %d: Code(%d) = %q (%d): outside the domain or taken twice", dom.space, id, code, n)
			}
			seen[n] = true
			if back, ok := p.ID(code); !ok || back != id {
				t.Fatalf("space %d: ID(Code(%d) = %q) = %d, %v", dom.space, id, code, back, ok)
			}
		}
		if _, err := p.Code(int64(dom.space)); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("space %d: Code(space) = %v, want ErrOutOfRange", dom.space, err)
		}
	}
}

// TestCodesOfALargeSampleNeverCollide: the first 100,000 IDs (where the
// sequence is today), the last 50,000 and 100,000 spread in between give as many
// distinct 7-character codes, each read back to its ID.
func TestCodesOfALargeSampleNeverCollide(t *testing.T) {
	p := mustPermutation(t, testKey)
	var ids []int64
	for id := range int64(100_000) {
		ids = append(ids, id)
	}
	for id := CodeSpace - 50_000; id < CodeSpace; id++ {
		ids = append(ids, id)
	}
	for id := int64(100_000); id < CodeSpace-50_000; id += CodeSpace / 100_003 {
		ids = append(ids, id)
	}
	seen := make(map[string]int64, len(ids))
	for _, id := range ids {
		code, err := p.Code(id)
		if err != nil {
			t.Fatalf("Code(%d): %v", id, err)
		}
		if len(code) != SequentialLength || strings.Trim(code, Alphabet) != "" {
			t.Fatalf("Code(%d) = %q: want 7 base62 characters", id, code)
		}
		if other, dup := seen[code]; dup {
			t.Fatalf("IDs %d and %d share the code %q", other, id, code)
		}
		seen[code] = id
		if back, ok := p.ID(code); !ok || back != id {
			t.Fatalf("ID(Code(%d) = %q) = %d, %v", id, code, back, ok)
		}
	}
	for _, id := range []int64{-1, CodeSpace, 1<<63 - 1} {
		if code, err := p.Code(id); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Code(%d) = %q, %v; want ErrOutOfRange", id, code, err)
		}
	}
	for _, code := range []string{"", "abc", "12345678", "abc-def", "abcdéf"} {
		if id, ok := p.ID(code); ok {
			t.Errorf("ID(%q) = %d, ok; want not a code", code, id)
		}
	}
}

// TestPermutationProperties checks, on random inputs, that Code and ID are
// inverse both ways: every ID of [0, 62^7) has a code that reads back to it,
// and every 7-character base62 string is the code of exactly the ID it reads
// as, which together make Code a bijection onto all 7-character codes.
func TestPermutationProperties(t *testing.T) {
	p := mustPermutation(t, testKey)
	cfg := &quick.Config{MaxCount: 20_000, Values: func(v []reflect.Value, r *rand.Rand) {
		v[0] = reflect.ValueOf(r.Int63n(CodeSpace))
	}}
	idRoundTrip := func(id int64) bool {
		code, err := p.Code(id)
		back, ok := p.ID(code)
		return err == nil && len(code) == SequentialLength && ok && back == id
	}
	if err := quick.Check(idRoundTrip, cfg); err != nil {
		t.Error(err)
	}
	codeRoundTrip := func(n int64) bool {
		var b [SequentialLength]byte
		for i := range b {
			b[i] = Alphabet[n%62]
			n /= 62
		}
		id, ok := p.ID(string(b[:]))
		code, err := p.Code(id)
		return ok && err == nil && code == string(b[:])
	}
	if err := quick.Check(codeRoundTrip, cfg); err != nil {
		t.Error(err)
	}
}

// TestPermutationIsKeyedAndDeterministic: one key gives the same codes in
// every process; another key gives other codes; consecutive IDs are not
// neighbours, and a short or missing key is refused.
func TestPermutationIsKeyedAndDeterministic(t *testing.T) {
	a, again := mustPermutation(t, testKey), mustPermutation(t, append([]byte(nil), testKey...))
	other := mustPermutation(t, []byte("another-test-key-0123456789abcdef"))
	same, adjacent := 0, 0
	prev := int64(-10)
	for id := int64(1_000_000); id < 1_010_000; id++ {
		ca, _ := a.Code(id)
		if cb, _ := again.Code(id); cb != ca {
			t.Fatalf("Code(%d): %q and %q under the same key", id, ca, cb)
		}
		if co, _ := other.Code(id); co == ca {
			same++
		}
		n, _ := Decode(ca)
		if d := n - prev; d >= -62 && d <= 62 {
			adjacent++
		}
		prev = n
	}
	if same > 0 {
		t.Errorf("%d of 10,000 IDs have the same code under two keys, want none", same)
	}
	if adjacent > 0 {
		t.Errorf("%d of 10,000 consecutive IDs have codes within 62 of the previous one, want none", adjacent)
	}
	if got, _ := a.Code(0); got == "1000000" {
		t.Error("ID 0 keeps its sequential code")
	}
	for _, key := range [][]byte{nil, []byte("short"), testKey[:MinKeyLength-1]} {
		if _, err := NewPermutation(key); err == nil {
			t.Errorf("NewPermutation(%d bytes) accepted", len(key))
		}
	}
}
