package linkrules

import (
	"math/bits"
	"net/netip"
	"strings"
)

// program is a compiled Set.
type program struct {
	rules []crule
	needs kind
	cum   []uint64 // cumulative weights of the variants
	total uint64
	vary  []string // nil, or one value
	// varyDevice is vary with User-Agent, for links whose device targets
	// answer when no rule does.
	varyDevice []string
}

type crule struct {
	name  string
	url   string
	conds []ccond
}

// Request is what conditions test. The caller fills it on the stack; fields
// a Set does not need (NeedsDevice, NeedsCountry) may stay zero.
type Request struct {
	// NowMs is the visit's time, Unix milliseconds.
	NowMs int64
	// Device is the visitor's device class (DeviceDesktop, DeviceIOS,
	// DeviceAndroid), unless Classify is set.
	Device int
	// Classify, when set, returns the device class of UserAgent; it is
	// called at most once, and only if a device condition is reached.
	Classify  func(userAgent string) int
	UserAgent string
	// AcceptLanguage is the request's Accept-Language header.
	AcceptLanguage string
	// RawQuery is the request URL's query, still encoded.
	RawQuery string
	// Addr is the client address (pkg/clientip).
	Addr netip.Addr
	// Country returns Addr's country, "" when unknown; nil: no GeoIP
	// database, and country conditions never hold. Called at most once.
	Country func(netip.Addr) string

	country     string
	countryDone bool
	deviceDone  bool
	// The query's parameters, split and decoded once (queryParams), and
	// the decoded names and values that were encoded.
	params     [maxQueryParams]param
	nParams    int
	paramsDone bool
	decoded    []byte
	// The Accept-Language tags with a quality above 0, parsed once.
	langs     [maxLanguageTags]string
	nLangs    int
	langsDone bool
}

// languages returns AcceptLanguage's tags with a quality above 0 (at most
// maxLanguageTags of the first maxLanguageItems entries), parsing the
// header on the first call only. "*" names no particular language and is
// left out; a malformed quality counts as 1.
func (req *Request) languages() []string {
	if req.langsDone {
		return req.langs[:req.nLangs]
	}
	req.langsDone = true
	h := req.AcceptLanguage
	for items := 0; items < maxLanguageItems && req.nLangs < maxLanguageTags; items++ {
		i := 0
		for i < len(h) && (h[i] == ' ' || h[i] == '\t' || h[i] == ',') {
			i++
		}
		h = h[i:]
		if h == "" {
			break
		}
		j := 0
		for j < len(h) && h[j] != ';' && h[j] != ',' && h[j] != ' ' && h[j] != '\t' {
			j++
		}
		tag := h[:j]
		h = h[j:]
		var params string
		if k := strings.IndexByte(h, ','); k < 0 {
			params, h = h, ""
		} else {
			params, h = h[:k], h[k+1:]
		}
		if tag == "*" || params != "" && zeroQuality(params) {
			continue
		}
		req.langs[req.nLangs] = tag
		req.nLangs++
	}
	return req.langs[:req.nLangs]
}

// CountryLookedUp returns the country a country condition looked up for
// req, and whether one did: a caller that needs the country too (for the
// click) can skip a second lookup.
func (req *Request) CountryLookedUp() (string, bool) { return req.country, req.countryDone }

// NeedsDevice reports whether some rule tests the device class.
func (s *Set) NeedsDevice() bool { return s.prog != nil && s.prog.needs&kindDevice != 0 }

// NeedsCountry reports whether some rule tests the country.
func (s *Set) NeedsCountry() bool { return s.prog != nil && s.prog.needs&kindCountry != 0 }

// HasRules reports whether s has rules to Match.
func (s *Set) HasRules() bool { return s != nil && s.prog != nil && len(s.prog.rules) > 0 }

// HasVariants reports whether s has variants to Pick.
func (s *Set) HasVariants() bool { return s != nil && s.prog != nil && s.prog.total > 0 }

// Vary is the Vary header of an answer s chose, as the values of an
// http.Header: the request headers its rules and variants read (nil when
// none), with User-Agent when device is set (the link has device targets,
// which answer before its variants). The slice is shared: callers must not
// modify it (appending copies it, as its capacity is its length).
func (s *Set) Vary(device bool) []string {
	switch {
	case s == nil || s.prog == nil:
		if device {
			return varyUserAgent
		}
		return nil
	case device:
		return s.prog.varyDevice
	}
	return s.prog.vary
}

var varyUserAgent = vary(kindDevice)

func vary(needs kind) []string {
	var parts []string
	if needs&kindDevice != 0 {
		parts = append(parts, "User-Agent")
	}
	if needs&kindLanguage != 0 {
		parts = append(parts, "Accept-Language")
	}
	if len(parts) == 0 {
		return nil
	}
	return []string{strings.Join(parts, ", ")}
}

// Match returns the URL and name of the first rule whose conditions all
// hold for req; ok is false when none does (or s is nil or not compiled).
func (s *Set) Match(req *Request) (target, name string, ok bool) {
	if s == nil || s.prog == nil {
		return "", "", false
	}
	for i := range s.prog.rules {
		r := &s.prog.rules[i]
		if r.matches(req) {
			return r.url, r.name, true
		}
	}
	return "", "", false
}

func (r *crule) matches(req *Request) bool {
	for i := range r.conds {
		if !r.conds[i].holds(req) {
			return false
		}
	}
	return true
}

func (c *ccond) holds(req *Request) bool {
	switch c.kind {
	case kindDevice:
		if req.Classify != nil && !req.deviceDone {
			req.deviceDone = true
			req.Device = req.Classify(req.UserAgent)
		}
		return c.devices&(1<<req.Device) != 0
	case kindLanguage:
		return acceptsLanguage(req.languages(), c.values)
	case kindQuery:
		for _, p := range req.queryParams() {
			if req.equal(p.name, c.param) && (!c.hasValue || p.value.ok && req.equal(p.value, c.value)) {
				return true
			}
		}
		return false
	case kindCIDR:
		if !req.Addr.IsValid() {
			return false
		}
		a := req.Addr.Unmap()
		for _, p := range c.prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	case kindCountry:
		if !req.countryDone {
			req.countryDone = true
			if req.Country != nil && req.Addr.IsValid() {
				req.country = req.Country(req.Addr)
			}
		}
		if req.country == "" {
			return false
		}
		for _, v := range c.values {
			if strings.EqualFold(v, req.country) {
				return true
			}
		}
		return false
	case kindTime:
		return req.NowMs >= c.from && (c.until == 0 || req.NowMs < c.until)
	}
	return false
}

// Pick returns the URL and name of the variant whose share of the weights
// holds bucket (any uniformly spread number, see Sticky); ok is false when s
// has no variants.
func (s *Set) Pick(bucket uint64) (target, name string, ok bool) {
	if !s.HasVariants() {
		return "", "", false
	}
	b, _ := bits.Mul64(bucket, s.prog.total) // bucket scaled to [0, total), no division
	for i, c := range s.prog.cum {
		if b < c {
			v := &s.Variants[i]
			return v.URL, v.Name, true
		}
	}
	return "", "", false // unreachable: b < total = cum[last]
}

// Bounds of the Accept-Language header's parsing: the entries read, and the
// tags kept.
const (
	maxLanguageItems = 32
	maxLanguageTags  = 8
)

// acceptsLanguage reports whether one of tags is in one of ranges (lower
// case).
func acceptsLanguage(tags, ranges []string) bool {
	for _, tag := range tags {
		for _, r := range ranges {
			if len(tag) >= len(r) && strings.EqualFold(tag[:len(r)], r) && (len(tag) == len(r) || tag[len(r)] == '-') {
				return true
			}
		}
	}
	return false
}

// zeroQuality reports whether an Accept-Language entry's parameters say
// q=0 (also "0.0", "0.000"). It reads them once, without splitting.
func zeroQuality(params string) bool {
	for i := 0; i < len(params); i++ {
		if params[i] != 'q' && params[i] != 'Q' || i+1 >= len(params) || params[i+1] != '=' {
			continue
		}
		// A q parameter starts the string or follows a ';' and spaces.
		k := i - 1
		for k >= 0 && (params[k] == ' ' || params[k] == '\t') {
			k--
		}
		if k >= 0 && params[k] != ';' {
			continue
		}
		v := params[i+2:]
		for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
			v = v[1:]
		}
		if v == "" || v[0] != '0' {
			return false
		}
		// "0", or "0." and zeros; anything else (0.5, 00) is not zero.
		for j := 1; j < len(v) && v[j] != ';' && v[j] != ' ' && v[j] != '\t'; j++ {
			if j == 1 && v[j] != '.' || j > 1 && v[j] != '0' {
				return false
			}
		}
		return true
	}
	return false
}

// Bounds of the query's parsing: the parameters read, and the bytes of the
// query they are read from. A link shared with a query carries a few
// parameters of tens of bytes; what lies past either bound is not read.
const (
	maxQueryParams = 100
	maxQueryBytes  = 16 << 10
)

// maxEncodedParam is the longest encoded name or value that can decode to
// one a condition holds (at most MaxParamLength bytes): an escape is three
// bytes for one, so a longer component decodes to more than that and is
// not decoded at all.
const maxEncodedParam = 3 * MaxParamLength

// param is one query parameter, decoded. A value that cannot equal any
// condition's (malformed, or too long) is not kept (value.ok false): the
// parameter is still present.
type param struct{ name, value span }

// span is a decoded name or value: a slice of RawQuery, or of the decoded
// bytes when it was encoded (at most 2*maxQueryParams*MaxParamLength).
// Six bytes rather than two strings' sixteen keep Request, which every
// ruled visit zeroes, small.
type span struct {
	off     uint16 // < 1<<16: see maxQueryBytes and span
	n       uint8  // <= MaxParamLength
	decoded bool
	ok      bool
}

// equal reports whether sp is want; it allocates nothing.
func (req *Request) equal(sp span, want string) bool {
	if int(sp.n) != len(want) {
		return false
	}
	if sp.decoded {
		return string(req.decoded[sp.off:int(sp.off)+int(sp.n)]) == want
	}
	return req.RawQuery[sp.off:int(sp.off)+int(sp.n)] == want
}

// queryParams returns RawQuery's parameters (the first maxQueryParams of
// its first maxQueryBytes), splitting and decoding them on the first call
// only, however many query conditions a link's rules test. A name that is
// malformed or too long to match any condition's is left out. Decoding
// allocates, and happens only for a name or value that is encoded.
func (req *Request) queryParams() []param {
	if req.paramsDone {
		return req.params[:req.nParams]
	}
	req.paramsDone = true
	q := req.RawQuery
	if len(q) > maxQueryBytes {
		// Only whole parameters: a cut one could equal a shorter value.
		q = q[:maxQueryBytes+1]
		if i := strings.LastIndexByte(q, '&'); i >= 0 {
			q = q[:i]
		} else {
			q = ""
		}
	}
	for pos, n := 0, 0; pos < len(q) && n < maxQueryParams; n++ {
		end := strings.IndexByte(q[pos:], '&')
		if end < 0 {
			end = len(q)
		} else {
			end += pos
		}
		eq := strings.IndexByte(q[pos:end], '=')
		if eq < 0 {
			eq = end
		} else {
			eq += pos
		}
		name := req.component(pos, eq)
		if name.ok {
			p := &req.params[req.nParams]
			p.name = name
			if eq < end {
				p.value = req.component(eq+1, end)
			} else {
				p.value = span{ok: true}
			}
			req.nParams++
		}
		pos = end + 1
	}
	return req.params[:req.nParams]
}

// component decodes RawQuery[from:to], a name or value; not ok when it is
// malformed or longer than any condition's name or value.
func (req *Request) component(from, to int) span {
	s := req.RawQuery[from:to]
	if len(s) > maxEncodedParam {
		return span{}
	}
	if !encodedComponent(s) {
		if len(s) > MaxParamLength {
			return span{}
		}
		return span{off: uint16(from), n: uint8(len(s)), ok: true}
	}
	if req.decoded == nil {
		req.decoded = make([]byte, 0, 2*maxEncodedParam)
	}
	start := len(req.decoded)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			req.decoded = append(req.decoded, ' ')
		case '%':
			if i+2 >= len(s) || !ishex(s[i+1]) || !ishex(s[i+2]) {
				req.decoded = req.decoded[:start]
				return span{}
			}
			req.decoded = append(req.decoded, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			req.decoded = append(req.decoded, c)
		}
	}
	n := len(req.decoded) - start
	if n > MaxParamLength {
		req.decoded = req.decoded[:start]
		return span{}
	}
	return span{off: uint16(start), n: uint8(n), decoded: true, ok: true}
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// encodedComponent reports whether s holds a '%' or '+' to decode.
func encodedComponent(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '%' || s[i] == '+' {
			return true
		}
	}
	return false
}

// Sticky maps a visitor of a link to a bucket for Pick: a keyed hash of the
// visitor's key (the client address, an IPv6 /64) and the link's code, so
// one visitor keeps one variant while the weights are unchanged, and
// different links split their visitors independently. The key (from a
// secret salt) keeps assignments unpredictable to outsiders; it is not a
// security boundary.
type Sticky struct{ seed uint64 }

// NewSticky returns the hasher of salt.
func NewSticky(salt []byte) Sticky {
	h := uint64(fnvOffset)
	for _, b := range []byte("kurz variant\x00") {
		h = (h ^ uint64(b)) * fnvPrime
	}
	for _, b := range salt {
		h = (h ^ uint64(b)) * fnvPrime
	}
	return Sticky{seed: mix(h)}
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// Bucket returns the visitor's bucket for code. It allocates nothing and
// reads the input eight bytes at a time.
func (s Sticky) Bucket(visitor, code string) uint64 {
	h := absorb(s.seed, visitor)
	h = absorb(h^k2, code)
	return mix(h ^ s.seed)
}

const (
	k1 = 0x9e3779b97f4a7c15
	k2 = 0xc2b2ae3d27d4eb4f
)

// absorb mixes s into h, eight bytes per round, then its tail and length.
func absorb(h uint64, s string) uint64 {
	n := uint64(len(s))
	for len(s) >= 8 {
		v := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = bits.RotateLeft64((h^v)*k1, 31) * k2
		s = s[8:]
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		v |= uint64(s[i]) << (8 * i)
	}
	return bits.RotateLeft64((h^v^n<<56)*k1, 31) * k2
}

// mix is splitmix64's finaliser: every input bit affects every output bit.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
