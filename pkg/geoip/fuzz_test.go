package geoip_test

import (
	"net/netip"
	"testing"

	"kurz.dev/pkg/geoip"
	"kurz.dev/pkg/geoip/geoiptest"
)

// FuzzDatabase damages the fixture database (patch written over it at off)
// and looks up a fuzzed address. OpenBytes never panics; a database it
// accepts answers every address, without panicking, with a country code or
// "": a damaged file the redirect loads must not crash it nor put anything
// else into clicks.
func FuzzDatabase(f *testing.F) {
	good, err := geoiptest.Bytes("GeoLite2-Country", geoiptest.Networks)
	if err != nil {
		f.Fatal(err)
	}
	de := netip.MustParseAddr(geoiptest.IPv4DE).As16()
	jp := netip.MustParseAddr(geoiptest.IPv6JP).As16()
	f.Add(uint32(0), []byte{}, de[:])
	f.Add(uint32(len(good)-10), []byte{0xff, 0xff, 0xff}, jp[:])
	f.Add(uint32(len(good)/2), []byte("ZZ"), de[:])
	f.Add(uint32(100), []byte{0, 0, 0, 0, 0, 0}, de[:])
	f.Fuzz(func(t *testing.T, off uint32, patch, addr []byte) {
		data := append([]byte(nil), good...)
		if n := int(off) % len(data); len(patch) > 0 {
			copy(data[n:], patch)
		}
		db, err := geoip.OpenBytes(data, "fuzzed.mmdb")
		if err != nil {
			return
		}
		var a16 [16]byte
		copy(a16[:], addr)
		for _, a := range []netip.Addr{netip.AddrFrom16(a16), netip.AddrFrom16(a16).Unmap(), netip.AddrFrom16(de), netip.AddrFrom16(jp)} {
			if c := db.Country(a); c != geoip.Valid(c) {
				t.Fatalf("Country(%s) = %q: not a country code", a, c)
			}
		}
	})
}
