package main

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestMarshalGetRateLimits(t *testing.T) {
	got := marshalGetRateLimits(gubernatorReq{name: "n", key: "k", hits: 1, limit: 100, durationMs: 60_000})
	// GetRateLimitsReq.requests (1, 14 bytes): name (1) "n", unique_key (2)
	// "k", hits (3) 1, limit (4) 100, duration (5) 60000; algorithm (6)
	// TOKEN_BUCKET is 0, not sent.
	want := []byte{0x0a, 14, 0x0a, 1, 'n', 0x12, 1, 'k', 0x18, 1, 0x20, 100, 0x28, 0xe0, 0xd4, 0x03}
	if !bytes.Equal(got, want) {
		t.Errorf("got % x\nwant % x", got, want)
	}
}

func TestUnmarshalGetRateLimits(t *testing.T) {
	var over, under, failed []byte
	// OVER_LIMIT, limit 100, remaining 0, reset_time, metadata (6) and an
	// unknown fixed64 field, both skipped.
	over = protowire.AppendTag(over, 1, protowire.VarintType)
	over = protowire.AppendVarint(over, 1)
	over = protowire.AppendTag(over, 2, protowire.VarintType)
	over = protowire.AppendVarint(over, 100)
	over = protowire.AppendTag(over, 4, protowire.VarintType)
	over = protowire.AppendVarint(over, 1_700_000_000_000)
	over = protowire.AppendTag(over, 6, protowire.BytesType)
	over = protowire.AppendBytes(over, []byte{0x0a, 1, 'a', 0x12, 1, 'b'})
	over = protowire.AppendTag(over, 99, protowire.Fixed64Type)
	over = protowire.AppendFixed64(over, 7)
	// UNDER_LIMIT (0, not sent), remaining 41.
	under = protowire.AppendTag(under, 3, protowire.VarintType)
	under = protowire.AppendVarint(under, 41)
	failed = protowire.AppendTag(failed, 5, protowire.BytesType)
	failed = protowire.AppendString(failed, "boom")
	var msg []byte
	for _, r := range [][]byte{over, under, failed} {
		msg = protowire.AppendTag(msg, 1, protowire.BytesType)
		msg = protowire.AppendBytes(msg, r)
	}

	got, err := unmarshalGetRateLimits(msg)
	if err != nil {
		t.Fatal(err)
	}
	want := []gubernatorResp{{overLimit: true, limit: 100}, {remaining: 41}, {err: "boom"}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("response %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := unmarshalGetRateLimits(msg[:len(msg)-2]); err == nil {
		t.Error("truncated response: no error")
	}
}

func TestRawCodec(t *testing.T) {
	in := []byte{1, 2, 3}
	b, err := rawCodec{}.Marshal(&in)
	if err != nil || !bytes.Equal(b, in) {
		t.Fatalf("Marshal = % x, %v", b, err)
	}
	var out []byte
	if err := (rawCodec{}).Unmarshal(b, &out); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("Unmarshal = % x, %v", out, err)
	}
	b[0] = 9 // gRPC reuses its buffers: out must be a copy
	if out[0] != 1 {
		t.Error("Unmarshal kept gRPC's buffer")
	}
	if _, err := (rawCodec{}).Marshal("x"); err == nil {
		t.Error("Marshal of a string: no error")
	}
}
