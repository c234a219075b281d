package geoip_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/geoip"
	"kurz.dev/pkg/geoip/geoiptest"
	"kurz.dev/pkg/testkit/servertest"
)

func TestCountry(t *testing.T) {
	db, err := geoip.Open(geoiptest.Write(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if db.Type != "GeoLite2-Country" {
		t.Errorf("Type = %q, want GeoLite2-Country", db.Type)
	}
	for _, tc := range []struct {
		name, addr, want string
	}{
		{"country", geoiptest.IPv4DE, "DE"},
		{"registered country when no country", geoiptest.IPv4RegisteredFR, "FR"},
		{"IPv6", geoiptest.IPv6JP, "JP"},
		{"IPv4-mapped IPv6", "::ffff:" + geoiptest.IPv4DE, "DE"},
		{"not a country code", geoiptest.IPv4Bad, ""},
		{"no network", geoiptest.IPv4Unknown, ""},
		{"flat layout", geoiptest.IPv6FlatNL, "NL"},
		{"no IPv6 network", "2001:db8:3::1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := netip.MustParseAddr(tc.addr)
			// Twice: the second answer comes from the remembered record.
			for range 2 {
				if got := db.Country(a); got != tc.want {
					t.Errorf("Country(%s) = %q, want %q", tc.addr, got, tc.want)
				}
			}
		})
	}
	if got := db.Country(netip.Addr{}); got != "" {
		t.Errorf("Country(invalid) = %q, want \"\"", got)
	}
}

func TestValid(t *testing.T) {
	for in, want := range map[string]string{
		"DE": "DE", "de": "", "D": "", "DEU": "", "": "", "D1": "", "Ä": "", "\x00\x00": "",
	} {
		if got := geoip.Valid(in); got != want {
			t.Errorf("Valid(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCountryAllocatesNothingOnceSeen(t *testing.T) {
	db, err := geoip.Open(geoiptest.Write(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr(geoiptest.IPv4DE), netip.MustParseAddr(geoiptest.IPv6JP)
	db.Country(a)
	db.Country(b)
	if n := testing.AllocsPerRun(100, func() { db.Country(a); db.Country(b) }); n != 0 {
		t.Errorf("Country allocates %v times per call pair, want 0", n)
	}
}

func TestOpenRefusesWhatIsNotADatabase(t *testing.T) {
	dir := t.TempDir()
	good, err := geoiptest.Bytes("GeoLite2-Country", geoiptest.Networks)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"empty":     {},
		"text":      []byte("this is not a database\n"),
		"truncated": good[:len(good)/2],
		"damaged tree": func() []byte {
			d := append([]byte(nil), good...)
			for i := range 64 {
				d[i] = 0xff
			}
			return d
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			db, err := geoip.Open(path)
			if err == nil {
				t.Fatalf("Open(%s) = %v, want an error", name, db)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
	if _, err := geoip.Open(filepath.Join(dir, "missing.mmdb")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want ErrNotExist", err)
	}
}

// replace writes nets to a new file beside path and renames it over path,
// the atomic way to update a database.
func replace(t *testing.T, path string, nets []geoiptest.Network) {
	t.Helper()
	tmp := path + ".new"
	if err := geoiptest.WriteFile(tmp, nets); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestSourceReloadsAChangedFile(t *testing.T) {
	path := geoiptest.Write(t, nil)
	src, err := geoip.OpenSource(path)
	if err != nil {
		t.Fatal(err)
	}
	de := netip.MustParseAddr(geoiptest.IPv4DE)
	if err := src.Reload(); !errors.Is(err, geoip.ErrUnchanged) {
		t.Fatalf("Reload of an unchanged file = %v, want ErrUnchanged", err)
	}

	replace(t, path, []geoiptest.Network{{CIDR: "198.51.100.0/24", Country: "AT"}})
	if err := src.Reload(); err != nil {
		t.Fatalf("Reload after a rename: %v", err)
	}
	if got := src.Country(de); got != "AT" {
		t.Errorf("after reload Country = %q, want AT", got)
	}

	// A damaged new file keeps the loaded database, and is not opened
	// again until it changes.
	if err := os.WriteFile(path+".new", []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err == nil || errors.Is(err, geoip.ErrUnchanged) {
		t.Fatalf("Reload of a damaged file = %v, want its error", err)
	}
	if got := src.Country(de); got != "AT" {
		t.Errorf("after a failed reload Country = %q, want AT (the loaded database)", got)
	}
	if err := src.Reload(); !errors.Is(err, geoip.ErrUnchanged) {
		t.Errorf("second Reload of the same damaged file = %v, want ErrUnchanged", err)
	}

	replace(t, path, geoiptest.Networks)
	if err := src.Reload(); err != nil {
		t.Fatalf("Reload after a repair: %v", err)
	}
	if got := src.Country(de); got != "DE" {
		t.Errorf("after repair Country = %q, want DE", got)
	}
}

func TestSourceServesDuringReload(t *testing.T) {
	path := geoiptest.Write(t, nil)
	src, err := geoip.OpenSource(path)
	if err != nil {
		t.Fatal(err)
	}
	de := netip.MustParseAddr(geoiptest.IPv4DE)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if got := src.Country(de); got != "DE" && got != "AT" {
					t.Errorf("Country during reloads = %q, want DE or AT", got)
					return
				}
			}
		})
	}
	for i := range 10 {
		code := "AT"
		if i%2 == 1 {
			code = "DE"
		}
		replace(t, path, []geoiptest.Network{{CIDR: "198.51.100.0/24", Country: code}})
		if err := src.Reload(); err != nil {
			t.Errorf("Reload %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestOpenSourceFailsOnABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.mmdb")
	if err := os.WriteFile(path, []byte("nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := geoip.OpenSource(path); err == nil {
		t.Fatal("OpenSource of a bad file succeeded")
	}
}

func BenchmarkCountry(b *testing.B) {
	db, err := geoip.Open(geoiptest.Write(b, nil))
	if err != nil {
		b.Fatal(err)
	}
	a := netip.MustParseAddr(geoiptest.IPv4DE)
	b.ReportAllocs()
	for b.Loop() {
		db.Country(a)
	}
}

// Watch loads a new file within a few intervals, logs it, and returns when
// its context ends.
func TestWatchReloads(t *testing.T) {
	path := geoiptest.Write(t, nil)
	src, err := geoip.OpenSource(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { src.Watch(ctx, 10*time.Millisecond, log); close(done) }()

	replace(t, path, []geoiptest.Network{{CIDR: "198.51.100.0/24", Country: "AT"}})
	de := netip.MustParseAddr(geoiptest.IPv4DE)
	if ok, got := servertest.EventuallyState(10*time.Second, func() (bool, string) {
		c := src.Country(de)
		return c == "AT", c
	}); !ok {
		t.Fatalf("Country after the file changed = %q, want AT", got)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "geoip database reloaded") {
		t.Errorf("no reload logged: %s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
