package redisconn

import "strings"

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// Slot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of the hash tag
// (the text between the first '{' and the next '}', when not empty), or of
// the whole key, modulo 16384. It lets callers place keys on slots without
// asking the cluster.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % SlotCount)
}

// crc16 is CRC16-XMODEM (polynomial 0x1021, initial value 0), a byte at a
// time from crcTable: the limiter hashes every decision's key to find its
// node, and bit by bit a long key's slot cost 12% of the limiter's CPU
// under a click consumer's flood checks (when it hashed each key twice).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
