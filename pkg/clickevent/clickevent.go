// Package clickevent is the click stream contract between the redirect
// service (producer, XADD) and the analytics consumer (XREADGROUP): the stream
// keys, the shard layout over Redis Cluster slots, and the fields of one
// event.
//
// Streams: StreamKeys(n) returns n keys "clicks:{<tag>}", one per shard. Each
// tag is chosen so that the shard's slot falls in the i-th of n equal slices
// of the 16,384 cluster slots: with the even slot split that
// `redis-cli --cluster create` makes, shards land on every master instead of
// piling onto one. Producer and consumer must use the same n
// (KURZ_CLICK_STREAM_SHARDS); when n changes, drain the old keys first.
// Producers trim with XADD ... MAXLEN ~ KURZ_CLICK_STREAM_MAXLEN.
//
// An event is one stream entry with these string fields (all present, some
// possibly empty; the optional ones, added after schema version 1 shipped,
// may be absent from an older producer's entries and read as empty):
//
//	v            schema version, "1"
//	id           event ID: a UUIDv7, unique per click; use it to deduplicate
//	code         the short code
//	tenant       the link's owner
//	ts           click time, Unix milliseconds (decimal)
//	visitor      hex HMAC-SHA256 of (UTC day, client IP key, user agent) under a
//	             secret salt; the raw IP is never stored
//	ua           User-Agent, at most MaxTextLen bytes
//	ref          Referer, at most MaxTextLen bytes
//	traceparent  W3C trace context of the redirect request ("" if none)
//	country      optional: ISO 3166-1 alpha-2 code of the client's country,
//	             two uppercase ASCII letters, from the redirect's GeoIP
//	             database (pkg/geoip); "" when unknown or without one.
//	             Parse reads any other value as ""
//
// Two more optional fields are written only when set (an absent field reads
// as ""), so that plain clicks stay as they were:
//
//	rule         name of the link's redirect rule that chose the destination
//	variant      name of the link's A/B-test variant that chose it
package clickevent

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/resp"
	"kurz.dev/pkg/textcut"
)

// Version is the schema version written in field "v".
const Version = "1"

// Field names of a stream entry.
const (
	FieldVersion     = "v"
	FieldID          = "id"
	FieldCode        = "code"
	FieldTenant      = "tenant"
	FieldTimestamp   = "ts"
	FieldVisitor     = "visitor"
	FieldUserAgent   = "ua"
	FieldReferrer    = "ref"
	FieldTraceParent = "traceparent"
	FieldCountry     = "country"
	FieldRule        = "rule"
	FieldVariant     = "variant"
)

// MaxTextLen bounds the user agent and referrer kept in an event.
const MaxTextLen = 512

// MaxShards bounds KURZ_CLICK_STREAM_SHARDS.
const MaxShards = 256

// StreamConfig is the stream layout, read by producer and consumer alike.
type StreamConfig struct {
	// Shards is the number of stream keys clicks are spread over.
	Shards int `env:"CLICK_STREAM_SHARDS" default:"8"`
	// MaxLen is the approximate length each stream is trimmed to on XADD.
	MaxLen int64 `env:"CLICK_STREAM_MAXLEN" default:"1000000"`
}

// Validate reports a layout that cannot work.
func (c StreamConfig) Validate() error {
	if c.Shards < 1 || c.Shards > MaxShards {
		return fmt.Errorf("KURZ_CLICK_STREAM_SHARDS=%d: want 1 to %d", c.Shards, MaxShards)
	}
	if c.MaxLen < 1000 {
		return fmt.Errorf("KURZ_CLICK_STREAM_MAXLEN=%d: want at least 1000", c.MaxLen)
	}
	return nil
}

// StreamKeys returns the n stream keys, shard 0 first. The result depends on
// n only.
func StreamKeys(n int) []string {
	keys := make([]string, n)
	for i := range n {
		lo, hi := i*slots/n, (i+1)*slots/n
		tag := strconv.Itoa(i)
		for k := 1; ; k++ {
			if s := redisconn.Slot(tag); s >= lo && s < hi {
				break
			}
			tag = strconv.Itoa(i) + "." + strconv.Itoa(k)
		}
		keys[i] = "clicks:{" + tag + "}"
	}
	return keys
}

const slots = redisconn.SlotCount

// Event is one click.
type Event struct {
	ID          string
	Code        string
	Tenant      string
	Time        time.Time
	Visitor     string
	UserAgent   string
	Referrer    string
	TraceParent string
	// Country is the client's ISO 3166-1 alpha-2 country code, "" when
	// unknown.
	Country string
	// Rule and Variant name the link's rule or variant that chose the
	// destination; empty for a plain redirect.
	Rule    string
	Variant string
}

// Values returns the entry's field/value pairs for XADD, in a fixed order.
func (e Event) Values() []string {
	args := e.Args()
	v := make([]string, len(args))
	for i, a := range args {
		v[i] = a.(string)
	}
	return v
}

// Args is Values as XADD's arguments, ready for go-redis: a []string
// there becomes one interface value (an allocation) per element, every
// click; field names are constants and cost nothing here.
func (e Event) Args() []any {
	v := make([]any, 0, 24)
	v = append(v,
		FieldVersion, Version,
		FieldID, e.ID,
		FieldCode, e.Code,
		FieldTenant, e.Tenant,
		FieldTimestamp, strconv.FormatInt(e.Time.UnixMilli(), 10),
		FieldVisitor, e.Visitor,
		FieldUserAgent, Truncate(e.UserAgent),
		FieldReferrer, Truncate(e.Referrer),
		FieldTraceParent, e.TraceParent,
		FieldCountry, Country(e.Country),
	)
	if e.Rule != "" {
		v = append(v, FieldRule, truncateName(e.Rule))
	}
	if e.Variant != "" {
		v = append(v, FieldVariant, truncateName(e.Variant))
	}
	return v
}

// AppendXAdd appends to b the RESP encoding of the command that appends e
// to stream: XADD stream MAXLEN ~ maxLen * followed by Values. It is what
// go-redis sends for XAddArgs{Stream, MaxLen, Approx: true, ID: "*",
// Values: Args()}, without an interface value or argument slice per field.
func (e Event) AppendXAdd(b []byte, stream string, maxLen int64) []byte {
	f, n := e.fields()
	b = resp.AppendArray(b, 6+2*n)
	b = resp.AppendBulk(b, "XADD")
	b = resp.AppendBulk(b, stream)
	b = resp.AppendBulk(b, "MAXLEN")
	b = resp.AppendBulk(b, "~")
	b = resp.AppendBulkInt(b, maxLen)
	b = resp.AppendBulk(b, "*")
	for _, p := range f[:n] {
		b = resp.AppendBulk(b, p.name)
		b = resp.AppendBulk(b, p.value)
	}
	return b
}

// field is one field/value pair of an entry.
type field struct{ name, value string }

// fields returns the entry's pairs, in Args's order, and how many there
// are. (Args lists its own: boxing a name held in a variable would
// allocate, a constant's does not.)
func (e Event) fields() (f [12]field, n int) {
	f[0] = field{FieldVersion, Version}
	f[1] = field{FieldID, e.ID}
	f[2] = field{FieldCode, e.Code}
	f[3] = field{FieldTenant, e.Tenant}
	f[4] = field{FieldTimestamp, strconv.FormatInt(e.Time.UnixMilli(), 10)}
	f[5] = field{FieldVisitor, e.Visitor}
	f[6] = field{FieldUserAgent, Truncate(e.UserAgent)}
	f[7] = field{FieldReferrer, Truncate(e.Referrer)}
	f[8] = field{FieldTraceParent, e.TraceParent}
	f[9] = field{FieldCountry, Country(e.Country)}
	n = 10
	if e.Rule != "" {
		f[n] = field{FieldRule, truncateName(e.Rule)}
		n++
	}
	if e.Variant != "" {
		f[n] = field{FieldVariant, truncateName(e.Variant)}
		n++
	}
	return f, n
}

// MaxNameLen bounds a rule or variant name kept in an event.
const MaxNameLen = 64

// truncateName cuts a rule or variant name to MaxNameLen bytes, whole
// characters: a stored value, so unmarked.
func truncateName(s string) string { return textcut.Prefix(s, MaxNameLen) }

// Parse reads an entry's values (as go-redis returns them in XMessage.Values).
// A user agent or referrer over MaxTextLen bytes, which no producer of this
// package writes, is truncated as Values would.
func Parse(values map[string]any) (Event, error) {
	get := func(f string) string {
		s, _ := values[f].(string)
		return s
	}
	if v := get(FieldVersion); v != Version {
		return Event{}, fmt.Errorf("clickevent: version %q, want %q", v, Version)
	}
	ms, err := strconv.ParseInt(get(FieldTimestamp), 10, 64)
	if err != nil {
		return Event{}, fmt.Errorf("clickevent: field %s: %w", FieldTimestamp, err)
	}
	e := Event{
		ID: get(FieldID), Code: get(FieldCode), Tenant: get(FieldTenant), Time: time.UnixMilli(ms),
		Visitor: get(FieldVisitor), UserAgent: Truncate(get(FieldUserAgent)), Referrer: Truncate(get(FieldReferrer)),
		TraceParent: get(FieldTraceParent), Country: Country(get(FieldCountry)),
		Rule: truncateName(get(FieldRule)), Variant: truncateName(get(FieldVariant)),
	}
	if e.ID == "" || e.Code == "" {
		return Event{}, errors.New("clickevent: id and code are required")
	}
	return e, nil
}

// Country returns code when it is a country code (two uppercase ASCII
// letters), else "": the only values field country carries.
func Country(code string) string {
	if len(code) != 2 || code[0] < 'A' || code[0] > 'Z' || code[1] < 'A' || code[1] > 'Z' {
		return ""
	}
	return code
}

// Truncate cuts s to at most MaxTextLen bytes without splitting a UTF-8
// sequence. Invalid bytes before the cut are kept as they are. What it cuts
// is a copy, so that a click kept in a buffer holds those bytes only, not
// a stranger's whole header.
func Truncate(s string) string {
	if len(s) <= MaxTextLen {
		return s
	}
	return strings.Clone(textcut.Prefix(s, MaxTextLen))
}

// Visitor returns the visitor hash: HMAC-SHA256 over the UTC day of t, the
// client IP and the user agent, keyed by salt, as 32 hex digits. The
// redirect passes the client's limiter key (pkg/clientip) as ip, so an IPv6
// visitor rotating through one /64 stays one visitor. The day in
// the input makes hashes unlinkable from one day to the next; without the
// salt a hash cannot be brute-forced back to an IP.
func Visitor(salt []byte, t time.Time, ip, userAgent string) string {
	return NewVisitors(salt).Visitor(t, ip, userAgent)
}

// Visitors computes the visitor hashes of one salt, reusing HMAC states: a
// fresh HMAC per click (two SHA-256 states keyed anew) was ~2% of the
// redirect's CPU. Each state keeps its own input and sum buffers, so a hash
// allocates only its result.
type Visitors struct{ macs sync.Pool }

type visitorMAC struct {
	mac hash.Hash
	in  []byte
	sum []byte
}

// NewVisitors returns the hasher of salt.
func NewVisitors(salt []byte) *Visitors {
	v := &Visitors{}
	v.macs.New = func() any {
		return &visitorMAC{mac: hmac.New(sha256.New, salt), in: make([]byte, 0, 256), sum: make([]byte, 0, sha256.Size)}
	}
	return v
}

// Visitor is the package's Visitor with this hasher's salt.
func (v *Visitors) Visitor(t time.Time, ip, userAgent string) string {
	m := v.macs.Get().(*visitorMAC)
	in := t.UTC().AppendFormat(m.in[:0], time.DateOnly)
	in = append(in, 0)
	in = append(in, ip...)
	in = append(in, 0)
	in = append(in, userAgent...)
	m.mac.Reset()
	m.mac.Write(in)
	sum := m.mac.Sum(m.sum[:0])
	out := hex.EncodeToString(sum[:16])
	if cap(in) <= 4096 { // a huge user agent's buffer is not kept
		m.in = in[:0]
	}
	m.sum = sum[:0]
	v.macs.Put(m)
	return out
}

// NewID returns a UUIDv7 (RFC 9562) for t: time-ordered, 74 random bits.
func NewID(t time.Time) string {
	var u [16]byte
	_, _ = rand.Read(u[6:]) // crypto/rand.Read never fails
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // variant 10
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}
