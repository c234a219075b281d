package servertest

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeAddrNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("FreeAddr handed out %s twice", addr)
		}
		seen[addr] = true
	}
}

func TestFreePortPairsAreFreeAndOutsideTheEphemeralRange(t *testing.T) {
	const bus = 10000
	eph := ephemeralLow()
	seen := map[int]bool{}
	for range 50 {
		port, err := FreePort(bus)
		if err != nil {
			t.Fatal(err)
		}
		if port+bus >= eph {
			t.Fatalf("FreePort(%d) = %d: its pair %d is in the ephemeral range (from %d)", bus, port, port+bus, eph)
		}
		if seen[port] || seen[port+bus] {
			t.Fatalf("FreePort(%d) = %d: handed out before", bus, port)
		}
		seen[port], seen[port+bus] = true, true
		for _, p := range []int{port, port + bus} {
			lis, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("FreePort(%d) = %d, but %d cannot be bound: %v", bus, port, p, err)
			}
			_ = lis.Close()
		}
	}
}
