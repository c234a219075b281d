package geoip

import (
	"fmt"
	"net/netip"
	"testing"

	"kurz.dev/pkg/geoip/geoiptest"
)

// A database of more distinct records than maxCached (a City database has
// millions) remembers at most maxCached of them, and answers the others
// all the same, decoding each time.
func TestCountryCacheIsBounded(t *testing.T) {
	letters := "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	n := maxCached + 500
	nets := make([]geoiptest.Network, n)
	want := make([]string, n)
	for i := range n {
		// Distinct records: every (country, registered country) pair differs.
		c := string([]byte{letters[i/26%26], letters[i%26]})
		r := string([]byte{letters[i/676%26], letters[i/26%26]})
		nets[i] = geoiptest.Network{CIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), Country: c, Registered: r}
		want[i] = c
	}
	db, err := Open(geoiptest.Write(t, nets))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for i := range n {
			a := netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 1})
			if got := db.Country(a); got != want[i] {
				t.Fatalf("Country(%s) = %q, want %q", a, got, want[i])
			}
		}
	}
	entries := 0
	db.codes.Range(func(any, any) bool { entries++; return true })
	if entries != maxCached || db.cached.Load() != maxCached {
		t.Errorf("%d records remembered (counter %d) after %d distinct ones, want %d", entries, db.cached.Load(), n, maxCached)
	}
}
