// Package geoip finds the country of a client address in a MaxMind-format
// (mmdb) country database: MaxMind's GeoLite2-Country or GeoIP2-Country (or
// City, which holds the same fields), or DB-IP's country databases. kurz
// ships no database; the operator provides one (KURZ_GEOIP_DB).
//
// A record's country is its "country.iso_code", or "registered_country.
// iso_code" when it has none (anycast and satellite networks), or a
// top-level "country_code" (the flat layout of ipinfo's and other country
// databases). Whatever
// the file holds, Country returns either an ISO 3166-1 alpha-2 code (two
// uppercase ASCII letters) or "": a bigger or stranger value never reaches
// a click event.
//
// The file is read into memory, not mapped: a database replaced in place
// (cp over it) must not change, or truncate, what a running reader sees.
// Source reloads it when it changes (a new file, size or modification
// time), checked every Config.ReloadInterval; replace it by renaming a
// complete file over it (on the same filesystem) so a reload never sees half a
// file. A file that fails to open keeps the previous one in service.
package geoip

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oschwald/maxminddb-golang/v2"
)

// Config is the GeoIP database a service reads.
type Config struct {
	// DB is the path of a MaxMind-format (mmdb) country database
	// (GeoLite2-Country, GeoIP2-Country or City, DB-IP country); clicks
	// then carry their country. Empty: no countries. A file that cannot be
	// read as a database fails the start.
	DB string `env:"GEOIP_DB" default:""`
	// ReloadInterval is how often the file is checked for a new version
	// (another file, size or modification time), which replaces the loaded
	// one; 0 never reloads, else at least 1s. A new version that fails to
	// open is logged and the loaded one kept.
	ReloadInterval time.Duration `env:"GEOIP_RELOAD_INTERVAL" default:"1m"`
}

// MaxFileSize bounds the database read into memory. Country databases
// are under 10 MiB, City ones a few hundred.
const MaxFileSize = 1 << 30

// maxCached bounds the records whose country a DB remembers. A country
// database has a few hundred distinct records; a City database has
// millions, whose lookups past the bound decode each time.
const maxCached = 8192

// DB is one opened database. It is safe for concurrent use.
type DB struct {
	reader *maxminddb.Reader
	// Type and Built are the database's metadata: its database_type
	// ("GeoLite2-Country", "DBIP-Country-Lite") and build time.
	Type  string
	Built time.Time
	// codes remembers the country of each record (uintptr data offset ->
	// string) already decoded, so a lookup allocates nothing and takes no
	// lock once its record was seen; cached counts its entries.
	codes  sync.Map
	cached atomic.Int32
}

// Open reads the database at path and checks all of it (the search tree
// and every record's encoding): a truncated or foreign file fails here,
// not on some later lookup.
func Open(path string) (*DB, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("geoip: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("geoip: read %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("geoip: %s is larger than %d MiB: not a country database", path, MaxFileSize>>20)
	}
	return OpenBytes(data, path)
}

// OpenBytes opens a database held in data (which must not change
// afterwards); name is used in errors.
func OpenBytes(data []byte, name string) (*DB, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("geoip: %s is empty: not an mmdb database", name)
	}
	r, err := maxminddb.OpenBytes(data)
	if err != nil {
		return nil, fmt.Errorf("geoip: %s is not an mmdb database: %w", name, err)
	}
	if err := r.Verify(); err != nil {
		return nil, fmt.Errorf("geoip: %s is a damaged mmdb database: %w", name, err)
	}
	return &DB{reader: r, Type: r.Metadata.DatabaseType, Built: r.Metadata.BuildTime().UTC()}, nil
}

// codePaths are where a record may hold its country code, in the order
// tried: MaxMind's and DB-IP's layouts (country, else the registered
// country for anycast and satellite networks), then the flat layout of
// other country databases (ipinfo's, ip-location-db's).
var codePaths = [][]any{{"country", "iso_code"}, {"registered_country", "iso_code"}, {"country_code"}}

// Country returns the ISO 3166-1 alpha-2 code of a's country, "" when the
// database has none for it (or a is not a valid address). An IPv4-mapped
// IPv6 address is looked up as the IPv4 address.
func (d *DB) Country(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	res := d.reader.Lookup(a.Unmap())
	if !res.Found() {
		return ""
	}
	off := res.Offset()
	if code, ok := d.codes.Load(off); ok {
		return code.(string)
	}
	var code string
	for _, path := range codePaths {
		// A path another layout uses differently (a "country" that is a
		// name, not a map) fails to decode: try the next one.
		var s string
		if err := res.DecodePath(&s, path...); err == nil {
			if code = Valid(s); code != "" {
				break
			}
		}
	}
	// Past the bound the counter stops moving (it must not wrap around).
	if d.cached.Load() < maxCached && d.cached.Add(1) <= maxCached {
		d.codes.Store(off, code)
	}
	return code
}

// Valid returns code when it is two uppercase ASCII letters, else "".
func Valid(code string) string {
	if len(code) != 2 || !upper(code[0]) || !upper(code[1]) {
		return ""
	}
	return code
}

func upper(c byte) bool { return 'A' <= c && c <= 'Z' }
