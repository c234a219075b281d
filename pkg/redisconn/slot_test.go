package redisconn

import (
	"math/rand/v2"
	"testing"
)

// Slots Redis 7.0's CLUSTER KEYSLOT gave for these keys.
func TestSlotMatchesClusterKeyslot(t *testing.T) {
	for key, want := range map[string]int{
		"":                     0,
		"somekey":              11058,
		"foo":                  12182,
		"{user1000}.following": 3443,
		"rl:{clicks:per-visitor:abc:0123456789abcdef}": 16036,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16 check value = %#x, want 0x31c3 (CRC-16/XMODEM)", got)
	}
}

// The table-driven CRC is the bitwise definition's, on any bytes.
func TestCRC16TableIsTheBitwiseDefinition(t *testing.T) {
	bitwise := func(s string) uint16 {
		var crc uint16
		for i := 0; i < len(s); i++ {
			crc ^= uint16(s[i]) << 8
			for range 8 {
				if crc&0x8000 != 0 {
					crc = crc<<1 ^ 0x1021
				} else {
					crc <<= 1
				}
			}
		}
		return crc
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, r.IntN(100))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		if got, want := crc16(string(b)), bitwise(string(b)); got != want {
			t.Fatalf("crc16(%q) = %#x, want %#x", b, got, want)
		}
	}
}

func BenchmarkSlot(b *testing.B) {
	key := "rl:{clicks:per-visitor:Ab3dE9x:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}"
	for b.Loop() {
		_ = Slot(key)
	}
}
