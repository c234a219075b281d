package codegen

import (
	"context"
	"errors"
	"testing"

	"kurz.dev/pkg/linkcode"
)

// testCodes is the permutation of the tests' blocks.
var testCodes = func() *linkcode.Permutation {
	p, err := linkcode.NewPermutation([]byte("codegen-test-key-0123456789abcdef"))
	if err != nil {
		panic(err)
	}
	return p
}()

// counter is a BlockSource handing out 0, 1, 2, ... and counting its calls.
type counter struct {
	next  int64
	calls int
	err   error
}

func (c *counter) source(_ context.Context, n int) ([]int64, error) {
	c.calls++
	if c.err != nil {
		return nil, c.err
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = c.next
		c.next++
	}
	return out, nil
}

// TestTakeCoversABatchWithOneFetch: a batch uses the current block's
// remainder first, fetches every further block it needs in one call, and
// leaves the last block's unused IDs for the next caller; no ID repeats.
func TestTakeCoversABatchWithOneFetch(t *testing.T) {
	src := &counter{next: 10}
	fetched := 0
	b := NewBlocks(src.source, 100, testCodes, func() { fetched++ })
	seen := map[int64]bool{}
	take := func(n int) []int64 {
		t.Helper()
		before := src.calls
		ids, err := b.Take(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != n {
			t.Fatalf("Take(%d) returned %d IDs", n, len(ids))
		}
		if src.calls-before > 1 {
			t.Errorf("Take(%d) called the source %d times, want at most once", n, src.calls-before)
		}
		for _, id := range ids {
			if seen[id] {
				t.Errorf("ID %d handed out twice", id)
			}
			seen[id] = true
		}
		return ids
	}

	if ids := take(30); ids[0] != 1000 || ids[29] != 1029 || src.calls != 1 {
		t.Errorf("first Take: %d..%d after %d calls, want 1000..1029 after 1", ids[0], ids[29], src.calls)
	}
	take(70) // exactly the rest of block 10: no fetch
	if src.calls != 1 {
		t.Errorf("the rest of the block cost a fetch (%d calls)", src.calls)
	}
	ids := take(250) // blocks 11, 12 and half of 13, in one fetch
	if src.calls != 2 || fetched != 4 || ids[0] != 1100 || ids[249] != 1349 {
		t.Errorf("Take(250): %d..%d, %d calls, %d blocks; want 1100..1349, 2 calls, 4 blocks", ids[0], ids[249], src.calls, fetched)
	}
	if id, err := b.Next(context.Background()); err != nil || id != 1350 || src.calls != 2 {
		t.Errorf("Next after the batch: %d, %v (%d calls), want 1350 from the kept remainder", id, err, src.calls)
	}
	if _, err := b.Take(context.Background(), 0); err == nil {
		t.Error("Take(0) succeeded")
	}
}

// TestTakeFailureKeepsTheCurrentBlock: a failed fetch hands out nothing and
// loses none of the IDs left in the current block.
func TestTakeFailureKeepsTheCurrentBlock(t *testing.T) {
	src := &counter{}
	b := NewBlocks(src.source, 10, testCodes, nil)
	if _, err := b.Take(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	src.err = errors.New("database down")
	if _, err := b.Take(context.Background(), 20); err == nil {
		t.Fatal("Take succeeded with a failing source")
	}
	if ids, err := b.Take(context.Background(), 6); err != nil || ids[0] != 4 || ids[5] != 9 {
		t.Errorf("after the failure: %v, %v; want 4..9", ids, err)
	}
}

// TestBlockPastTheLastCode: a block beyond the 7-character codes is refused.
func TestBlockPastTheLastCode(t *testing.T) {
	src := &counter{next: linkcode.CodeSpace / 1000}
	b := NewBlocks(src.source, 1000, testCodes, nil)
	if _, err := b.Take(context.Background(), 1); err == nil {
		t.Error("a block past the last code was used")
	}
}

// TestNextCodesSkipsReservedWords: "healthz" is the code of some ID; NextCodes
// never returns it and still returns as many codes as asked.
func TestNextCodesSkipsReservedWords(t *testing.T) {
	id, ok := testCodes.ID("healthz")
	if !ok {
		t.Fatal("healthz is not a 7-character code")
	}
	src := &counter{next: id / 100}
	b := NewBlocks(src.source, 100, testCodes, nil)
	codes, err := b.NextCodes(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(codes) != 100 {
		t.Fatalf("%d codes, want 100", len(codes))
	}
	// The block's 100 IDs but healthz's, then the first of the next block.
	start := id / 100 * 100
	var want []int64
	for n := start; n <= start+100; n++ {
		if n != id {
			want = append(want, n)
		}
	}
	for i, c := range codes {
		if linkcode.Reserved(c) {
			t.Errorf("reserved code %q handed out", c)
		}
		if got, _ := testCodes.ID(c); got != want[i] {
			t.Errorf("code %d is of ID %d, want %d", i, got, want[i])
		}
	}
}

// TestBlockCodesArePermutedIDs: a block's IDs come out as their permuted
// codes, one per ID, in ID order, and no code is the old sequential one.
func TestBlockCodesArePermutedIDs(t *testing.T) {
	src := &counter{next: 7}
	b := NewBlocks(src.source, 1000, testCodes, nil)
	codes, err := b.NextCodes(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range codes {
		id := 7000 + int64(i)
		want, _ := testCodes.Code(id)
		if linkcode.Reserved(want) {
			t.Skipf("ID %d has a reserved code under the test key", id)
		}
		if c != want {
			t.Fatalf("code %d = %q, want %q (ID %d permuted)", i, c, want, id)
		}
		if seq, _ := linkcode.Sequential(id); c == seq {
			t.Errorf("ID %d kept its sequential code %q", id, c)
		}
	}
	if src.calls != 1 {
		t.Errorf("%d block fetches for one block's codes, want 1", src.calls)
	}
}
