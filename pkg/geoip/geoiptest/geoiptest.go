// Package geoiptest writes small MaxMind-format (mmdb) country databases
// for tests, laid out as GeoLite2-Country's records are (country and
// registered_country maps with iso_code, geoname_id and names), so no test
// needs a downloaded database.
package geoiptest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
)

// Network is one network of a fixture and the country fields of its
// record; an empty field is left out of the record.
type Network struct {
	CIDR string
	// Country is country.iso_code.
	Country string
	// Registered is registered_country.iso_code.
	Registered string
	// Flat is a top-level country_code, with "country" a name (a string),
	// as ipinfo's databases lay records out.
	Flat string
}

// Addresses of Networks, one per case a test may want.
const (
	// IPv4DE is in a network whose country is DE.
	IPv4DE = "198.51.100.7"
	// IPv4RegisteredFR is in a network with only a registered country, FR.
	IPv4RegisteredFR = "203.0.113.9"
	// IPv6JP is in an IPv6 network whose country is JP.
	IPv6JP = "2001:db8:1::42"
	// IPv4Bad is in a network whose iso_code is not a country code.
	IPv4Bad = "192.0.2.200"
	// IPv4Unknown is in no network of the fixture.
	IPv4Unknown = "192.0.2.1"
	// IPv6FlatNL is in a network laid out flat: country_code NL.
	IPv6FlatNL = "2001:db8:2::7"
)

// Networks is the default fixture: documentation ranges (RFC 5737, RFC
// 3849), which no real database maps, so a test cannot confuse the
// fixture's answers with a real one's.
var Networks = []Network{
	{CIDR: "198.51.100.0/24", Country: "DE", Registered: "DE"},
	{CIDR: "203.0.113.0/24", Registered: "FR"},
	{CIDR: "2001:db8:1::/48", Country: "JP", Registered: "JP"},
	{CIDR: "192.0.2.128/25", Country: "germany", Registered: "de"},
	{CIDR: "2001:db8:2::/48", Flat: "NL"},
}

// Bytes returns a database of nets, typed dbType ("GeoLite2-Country").
func Bytes(dbType string, nets []Network) ([]byte, error) {
	tree, err := mmdbwriter.New(mmdbwriter.Options{
		DatabaseType: dbType, RecordSize: 24, IPVersion: 6,
		// The fixture maps documentation ranges, which the writer
		// otherwise keeps out.
		IncludeReservedNetworks: true,
		Description:             map[string]string{"en": "kurz test fixture"},
		Languages:               []string{"en"},
	})
	if err != nil {
		return nil, fmt.Errorf("geoiptest: %w", err)
	}
	for _, n := range nets {
		_, network, err := net.ParseCIDR(n.CIDR)
		if err != nil {
			return nil, fmt.Errorf("geoiptest: %w", err)
		}
		rec := mmdbtype.Map{"continent": mmdbtype.Map{"code": mmdbtype.String("EU")}}
		if n.Country != "" {
			rec["country"] = country(n.Country)
		}
		if n.Registered != "" {
			rec["registered_country"] = country(n.Registered)
		}
		if n.Flat != "" {
			rec = mmdbtype.Map{"country": mmdbtype.String("Country " + n.Flat), "country_code": mmdbtype.String(n.Flat)}
		}
		if err := tree.Insert(network, rec); err != nil {
			return nil, fmt.Errorf("geoiptest: insert %s: %w", n.CIDR, err)
		}
	}
	var buf bytes.Buffer
	if _, err := tree.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("geoiptest: %w", err)
	}
	return buf.Bytes(), nil
}

func country(code string) mmdbtype.Map {
	return mmdbtype.Map{
		"geoname_id": mmdbtype.Uint32(1),
		"iso_code":   mmdbtype.String(code),
		"names":      mmdbtype.Map{"en": mmdbtype.String("Country " + code), "de": mmdbtype.String("Land " + code)},
	}
}

// WriteFile writes a database of nets to path.
func WriteFile(path string, nets []Network) error {
	data, err := Bytes("GeoLite2-Country", nets)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// Write writes the database of nets (Networks when nil) into a new
// t.TempDir() and returns its path.
func Write(t testing.TB, nets []Network) string {
	t.Helper()
	if nets == nil {
		nets = Networks
	}
	path := filepath.Join(t.TempDir(), "country.mmdb")
	if err := WriteFile(path, nets); err != nil {
		t.Fatal(err)
	}
	return path
}
