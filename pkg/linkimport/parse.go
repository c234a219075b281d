// Package linkimport reads the link exports of other URL shorteners (Bitly,
// YOURLS) and kurz's own, and creates their links in kurz through BatchCreateLinks, keeping
// each link's code where kurz can. The gateway's POST /v1/links:import and
// kurzctl both use it: Parse the file, then Import the rows.
package linkimport

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// Format is the shortener a CSV file was exported from.
type Format string

// The formats Parse recognises by the file's header.
const (
	// Bitly is Bitly's link export: a long URL column ("long_url",
	// "Long URL", "destination") and a short link column ("link",
	// "bitlink", "short_url", "id", "custom_link"; a value such as
	// "bit.ly/abc123" whose last path segment is the code), with optional
	// "title", "created_at" (or "created", "date") and "tags".
	Bitly Format = "bitly"
	// YOURLS is YOURLS' export of its url table: keyword, url, title,
	// timestamp, ip, clicks, with the header row or without it.
	YOURLS Format = "yourls"
	// Kurz is kurz's own export (GET /v1/links:export): its links come
	// back with their expiry, visit limit, redirect type, device targets,
	// rules, variants and domain. A link the file cannot make again fails
	// its row: a password-protected one (the export holds no password) and
	// a disabled one.
	Kurz Format = "kurz"
)

// Tag is the tag Parse adds to every row of another shortener's export
// ("import-bitly", "import-yourls"), so the links of an import can be listed
// (GET /v1/links?tag=import-bitly) and reviewed or removed together. A
// kurz export's rows keep their own tags only.
func (f Format) Tag() string { return "import-" + string(f) }

// MaxRows is the most data rows Parse accepts in one file.
const MaxRows = 10_000

// MaxTags is the most tags a kurz link carries (see Link.tags); a row keeps
// its first MaxTags-1 tags and the import tag.
const MaxTags = 10

// maxTagLength is the longest kurz tag, in characters.
const maxTagLength = 32

// Row is one link of the export.
type Row struct {
	// Line is where the row starts in the file (1 is the header, if any).
	Line int
	// SourceCode is the link's code at the other shortener ("abc123" of
	// "bit.ly/abc123", a YOURLS keyword); empty when the file has none.
	SourceCode string
	// LongURL is where the link leads, as the file has it (trimmed). Empty
	// is a problem of this row only: Import reports it as the row's error.
	LongURL string
	// Title is the link's title, if the file has one; Import carries it.
	// A Bitly or YOURLS title is made into one kurz takes (fitTitle), as
	// the tags are; a kurz export's comes back as it was (a title the
	// shortener refuses, edited in by hand, fails its row, naming the
	// field).
	Title string
	// Tags are the row's tags made into valid kurz tags (lower case;
	// letters, digits, '-', '_', '.'; at most 32 characters; tags that
	// leave nothing are dropped, duplicates removed), at most MaxTags-1 of
	// them, followed by Format.Tag().
	Tags []string
	// CreatedAt is when the link was created at the other shortener, UTC;
	// zero when the file has no time or one Parse cannot read. kurz sets
	// its own create time: Import does not use it.
	CreatedAt time.Time
	// Link holds what a kurz export says of the link beyond its URL and
	// tags (expiry, visit limit, redirect type, device targets, domain);
	// nil for other formats. Its rules and variants are read when the row
	// is sent (RulesAndVariants): decoded, a 20 MB file of them held
	// 155 MB of messages at once.
	Link *shortenerv1.CreateLinkRequest
	// rules and variants are a kurz row's cells of them (JSON arrays in
	// the API's form, checked by Parse), "" for none.
	rules, variants string
	// Problem is why the row cannot be imported, found in the file (a kurz
	// export's password-protected link, a cell that does not parse); ""
	// when none. Import fails such a row without sending it.
	Problem string
}

// columns are the positions of a format's fields in a record; -1: absent.
type columns struct {
	code, longURL, title, created, tags int
	// codeAlt is a second short link column (Bitly's custom link), used
	// when non-empty in preference to code.
	codeAlt int
	// kurz's own export's further columns.
	expires, maxVisits, disabled, password, ios, android, desktop, domain, redirect, rules, variants int
}

// Parse reads a Bitly, YOURLS or kurz CSV export, detecting which by its header
// (a YOURLS export without a header is recognised by its first record:
// keyword, then an http(s) URL). It fails for a file that is empty, is not
// CSV, has an unknown header, or has more than MaxRows rows; problems of
// single rows (an empty URL, an unreadable time) are left for the row.
func Parse(r io.Reader) (Format, []Row, error) {
	cr := csv.NewReader(&boundedCSV{r: r, line: 1})
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = false
	first, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return "", nil, errors.New("the file is empty: expected a Bitly, YOURLS or kurz CSV export")
	}
	if err != nil {
		return "", nil, csvProblem(err)
	}
	if len(first) > 0 {
		first[0] = strings.TrimPrefix(first[0], "\ufeff")
	}
	format, cols, headerless := detect(first)
	if format == "" {
		return "", nil, fmt.Errorf("unknown CSV header %q: expected a Bitly export (columns long_url and link or bitlink, "+
			"optionally title, created_at, tags), a YOURLS export (keyword,url,title,timestamp,ip,clicks) "+
			"or a kurz export (code,short_url,long_url,...,password_protected,...)", headerSummary(first))
	}
	var rows []Row
	add := func(rec []string, line int) error {
		if len(rows) == MaxRows {
			return fmt.Errorf("the file has more than %d rows: split it into files of at most %d rows, each starting with the header row", MaxRows, MaxRows)
		}
		row := makeRow(format, cols, rec, line)
		if format == Kurz && !headerless && len(rec) < len(first) {
			// A cut row (a partial download, a hand edit) reads its
			// missing cells as empty: a password-protected link would
			// come back without its password, rules without them.
			row.Link, row.Problem = nil, fmt.Sprintf("line %d has %d fields, the header %d: a row cut short would lose the link's settings", line, len(rec), len(first))
		}
		rows = append(rows, row)
		return nil
	}
	if headerless {
		if err := add(first, 1); err != nil {
			return "", nil, err
		}
	}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", nil, csvProblem(err)
		}
		line, _ := cr.FieldPos(0)
		if blank(rec) {
			continue
		}
		if err := add(rec, line); err != nil {
			return "", nil, err
		}
	}
	return format, rows, nil
}

// ErrRead is wrapped by Parse's error when reading r failed (rather than
// the file being wrong); the reader's own error is wrapped too.
var ErrRead = errors.New("linkimport: reading the file failed")

// MaxFields is the most fields of a record Parse reads: the widest export
// it knows (kurz's) has 16, Bitly's about 20.
const MaxFields = 64

// MaxCell is the most bytes of a cell Parse reads. A kurz export's rules
// cell is the largest a valid file holds: 20 rules whose conditions carry
// the most values a link may (160 query conditions of 128-byte names and
// values of '"', escaped by JSON and then by CSV) measure 174 KB with
// rule URLs of the shortener's default 2,048 bytes, and 1.44 MB with the
// most it can be configured to take (65,536).
const MaxCell = 2 << 20

// boundedCSV passes a CSV file through, failing once a record has more
// than MaxFields fields or a cell more than MaxCell bytes: csv.Reader
// makes a whole record before it can be looked at, and a 20 MB record of
// commas is 20 million strings (a gigabyte of heap).
type boundedCSV struct {
	r       io.Reader
	quoted  bool // inside a quoted field
	fields  int  // of the record being read, after the first
	cell    int  // bytes of the field being read
	line    int
	tooWide error
}

// tooWideError is boundedCSV's refusal.
type tooWideError struct{ msg string }

func (e *tooWideError) Error() string { return e.msg }

func (b *boundedCSV) Read(p []byte) (int, error) {
	if b.tooWide != nil {
		return 0, b.tooWide
	}
	n, err := b.r.Read(p)
	for i, c := range p[:n] {
		// A doubled quote in a quoted field turns quoted off and on again:
		// toggling on every quote follows a valid file exactly, and in one
		// that is not valid csv.Reader stops at the same record.
		switch {
		case c == '\n' && !b.quoted:
			b.line++
			b.fields, b.cell = 0, 0
		case c == ',' && !b.quoted:
			b.fields, b.cell = b.fields+1, 0
		default:
			if c == '\n' {
				b.line++
			}
			if c == '"' {
				b.quoted = !b.quoted
			}
			b.cell++
		}
		switch {
		case b.fields >= MaxFields:
			b.tooWide = &tooWideError{fmt.Sprintf("line %d has more than %d fields: no export this reads has as many; check that the file's separator is a comma", b.line, MaxFields)}
		case b.cell > MaxCell:
			b.tooWide = &tooWideError{fmt.Sprintf("line %d has a field of more than %d bytes: no link's settings are that large", b.line, MaxCell)}
		default:
			continue
		}
		return i, b.tooWide
	}
	return n, err
}

// csvProblem turns a CSV reader's error into one a person can act on.
func csvProblem(err error) error {
	var pe *csv.ParseError
	var te *tooWideError
	switch {
	case errors.As(err, &te):
		return te
	case errors.As(err, &pe):
		return fmt.Errorf("the file is not valid CSV: line %d, column %d: %v", pe.Line, pe.Column, pe.Err)
	}
	return fmt.Errorf("%w: %w", ErrRead, err)
}

// headerSummary is the first record as shown in an error: at most 8 fields
// of at most 40 characters, valid UTF-8.
func headerSummary(rec []string) string {
	var parts []string
	for i, f := range rec {
		if i == 8 {
			parts = append(parts, "...")
			break
		}
		f = strings.ToValidUTF8(f, "?")
		if utf8.RuneCountInString(f) > 40 {
			f = string([]rune(f)[:40]) + "..."
		}
		parts = append(parts, f)
	}
	return strings.Join(parts, ",")
}

func blank(rec []string) bool {
	for _, f := range rec {
		if strings.TrimSpace(f) != "" {
			return false
		}
	}
	return true
}

// headerFold makes spaces and dashes of a header cell underscores.
var headerFold = strings.NewReplacer(" ", "_", "-", "_")

// maxHeaderName is the longest header cell detect reads as a column name;
// the names it knows are far shorter, and a longer cell (a YOURLS file's
// first URL, a header of garbage) is not folded for nothing.
const maxHeaderName = 64

// normHeader folds a header cell: "Long URL" and "long-url" are "long_url".
func normHeader(s string) string {
	return headerFold.Replace(strings.ToLower(strings.TrimSpace(s)))
}

// detect returns the format and columns of a file from its first record;
// headerless is true when that record is already data (YOURLS).
func detect(first []string) (f Format, cols columns, headerless bool) {
	idx := map[string]int{}
	for i, h := range first {
		if len(h) > maxHeaderName {
			continue
		}
		if name := normHeader(h); !has(idx, name) {
			idx[name] = i
		}
	}
	col := func(names ...string) int {
		for _, n := range names {
			if i, ok := idx[n]; ok {
				return i
			}
		}
		return -1
	}
	// kurz's own export, by columns no other format has.
	if c, u, p := col("code"), col("long_url"), col("password_protected"); c >= 0 && u >= 0 && p >= 0 {
		return Kurz, columns{code: c, longURL: u, title: col("title"), created: col("created_at"), tags: col("tags"), codeAlt: -1,
			expires: col("expires_at"), maxVisits: col("max_visits"), disabled: col("disabled"), password: p,
			ios: col("ios_url"), android: col("android_url"), desktop: col("desktop_url"), domain: col("domain"),
			redirect: col("redirect_type"), rules: col("rules"), variants: col("variants")}, false
	}
	if k, u := col("keyword"), col("url", "long_url"); k >= 0 && u >= 0 {
		return YOURLS, columns{code: k, longURL: u, title: col("title"), created: col("timestamp", "date", "created"),
			tags: col("tags"), codeAlt: -1}, false
	}
	long := col("long_url", "longurl", "destination", "destination_url", "original_url")
	short := col("link", "bitlink", "short_url", "short_link", "shorturl", "id", "bitlink_id")
	if long >= 0 && short >= 0 {
		return Bitly, columns{code: short, longURL: long, title: col("title"),
			created: col("created_at", "created", "date_created", "creation_date", "date"),
			tags:    col("tags", "tag"), codeAlt: col("custom_link", "custom_bitlink", "custom_bitlinks")}, false
	}
	// A YOURLS export without its header: keyword, url[, title, timestamp,
	// ip, clicks].
	if len(first) >= 2 && len(first) <= 6 && looksLikeURL(first[1]) && !strings.Contains(first[0], "://") {
		return YOURLS, columns{code: 0, longURL: 1, title: at(len(first), 2), created: at(len(first), 3),
			tags: -1, codeAlt: -1}, true
	}
	return "", columns{}, false
}

func has(m map[string]int, k string) bool {
	_, ok := m[k]
	return ok
}

func at(n, i int) int {
	if i < n {
		return i
	}
	return -1
}

func looksLikeURL(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}

func makeRow(f Format, cols columns, rec []string, line int) Row {
	field := func(i int) string {
		if i < 0 || i >= len(rec) {
			return ""
		}
		return strings.TrimSpace(rec[i])
	}
	row := Row{Line: line, LongURL: field(cols.longURL), Title: fitTitle(field(cols.title))}
	switch f {
	case Bitly:
		row.SourceCode = lastSegment(field(cols.codeAlt))
		if row.SourceCode == "" {
			row.SourceCode = lastSegment(field(cols.code))
		}
	case YOURLS:
		row.SourceCode = field(cols.code)
	case Kurz:
		for i := range rec {
			rec[i] = undefuse(rec[i])
		}
		row.LongURL = field(cols.longURL)
		row.SourceCode = field(cols.code)
		cell := func(i int) string {
			if i < 0 || i >= len(rec) {
				return ""
			}
			return rec[i] // JSON and URLs as exported, untrimmed
		}
		row.Title = cell(cols.title)
		row.Link, row.Problem = kurzLink(cell, cols)
		if row.Link != nil {
			row.rules, row.variants = strings.TrimSpace(cell(cols.rules)), strings.TrimSpace(cell(cols.variants))
		}
	}
	row.CreatedAt = parseTime(field(cols.created))
	if f == Kurz {
		// kurz tags already, joined with '|': as they were, and no import
		// tag (a link with ten has no room for it; the link comes back as
		// it was).
		for _, t := range strings.Split(field(cols.tags), "|") {
			if t = strings.TrimSpace(t); t != "" {
				row.Tags = append(row.Tags, t)
			}
		}
		return row
	}
	row.Tags = append(normTags(field(cols.tags)), f.Tag())
	return row
}

// kurzLink reads a kurz export row's settings beyond URL, code and tags,
// or says why the row cannot make its link again.
func kurzLink(field func(int) string, cols columns) (*shortenerv1.CreateLinkRequest, string) {
	get := func(i int) string { return strings.TrimSpace(field(i)) }
	if b, _ := strconv.ParseBool(get(cols.password)); b {
		return nil, "a password-protected link: the export holds no password (create it with one)"
	}
	if b, _ := strconv.ParseBool(get(cols.disabled)); b {
		return nil, "a disabled link: import it enabled only by creating it anew"
	}
	req := &shortenerv1.CreateLinkRequest{Domain: get(cols.domain)}
	if v := get(cols.expires); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return nil, fmt.Sprintf("expires_at %q is not an RFC 3339 time", v)
		}
		req.ExpireTime = timestamppb.New(t)
	}
	if v := get(cols.maxVisits); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Sprintf("max_visits %q is not a positive whole number", v)
		}
		req.MaxVisits = n
	}
	if ios, android, desktop := get(cols.ios), get(cols.android), get(cols.desktop); ios+android+desktop != "" {
		req.DeviceTargets = &shortenerv1.DeviceTargets{IosUrl: ios, AndroidUrl: android, DesktopUrl: desktop}
	}
	if v := get(cols.redirect); v != "" {
		rt, ok := RedirectTypeOf(v)
		if !ok {
			return nil, fmt.Sprintf("redirect_type %q is not 301, 302, 307 or 308", v)
		}
		req.RedirectType = rt
	}
	// Bounded before decoding: a cell of a million "{}" would be a million
	// messages first (gigabytes of heap for a 20 MB file).
	if err := CheckLists([]byte(get(cols.rules)), "rules"); err != nil {
		return nil, err.Error()
	}
	if err := CheckLists([]byte(get(cols.variants)), "variants"); err != nil {
		return nil, err.Error()
	}
	// Read here to fail the row, then dropped: the row keeps the cells
	// (Row.rules), read again when it is sent.
	if _, err := rulesOf(get(cols.rules)); err != nil {
		return nil, fmt.Sprintf("rules: %v", err)
	}
	if _, err := variantsOf(get(cols.variants)); err != nil {
		return nil, fmt.Sprintf("variants: %v", err)
	}
	return req, ""
}

// RulesAndVariants are a kurz row's rules and variants (see Row.Link), read
// from its cells anew on each call; nil for other formats.
func (r Row) RulesAndVariants() ([]*shortenerv1.RedirectRule, []*shortenerv1.Variant) {
	// Parse read the cells already: they cannot fail here.
	rules, _ := rulesOf(r.rules)
	variants, _ := variantsOf(r.variants)
	return rules, variants
}

// rulesOf reads a rules cell; nil for an empty one.
func rulesOf(cell string) ([]*shortenerv1.RedirectRule, error) {
	if cell == "" {
		return nil, nil
	}
	return jsonList(cell, func() *shortenerv1.RedirectRule { return &shortenerv1.RedirectRule{} })
}

// variantsOf reads a variants cell; nil for an empty one.
func variantsOf(cell string) ([]*shortenerv1.Variant, error) {
	if cell == "" {
		return nil, nil
	}
	return jsonList(cell, func() *shortenerv1.Variant { return &shortenerv1.Variant{} })
}

// formulaStarts are the first characters that make a spreadsheet run a
// cell as a formula (OWASP's CSV injection advice).
const formulaStarts = "=+-@\t\r"

// DefuseCell is how an export writes a cell a spreadsheet would run as a
// formula: with a leading single quote. Parse undoes it in kurz's export.
// A cell that already reads as a defused one (a title "'=1+1") gets its
// quote too, or Parse would take its own quote away.
func DefuseCell(v string) string {
	if (v != "" && strings.IndexByte(formulaStarts, v[0]) >= 0) || defused(v) {
		return "'" + v
	}
	return v
}

// defused reports whether v is a cell DefuseCell quoted: a quote, then a
// formula's first character or another quote.
func defused(v string) bool {
	return len(v) > 1 && v[0] == '\'' && (v[1] == '\'' || strings.IndexByte(formulaStarts, v[1]) >= 0)
}

// undefuse is DefuseCell's inverse.
func undefuse(v string) string {
	if defused(v) {
		return v[1:]
	}
	return v
}

// RedirectTypeOf is the redirect type of a status code as written ("301",
// "302", "307", "308": an export's redirect_type cell, kurzctl's
// --redirect).
func RedirectTypeOf(status string) (shortenerv1.RedirectType, bool) {
	switch status {
	case "301":
		return shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY, true
	case "302":
		return shortenerv1.RedirectType_REDIRECT_TYPE_FOUND, true
	case "307":
		return shortenerv1.RedirectType_REDIRECT_TYPE_TEMPORARY_REDIRECT, true
	case "308":
		return shortenerv1.RedirectType_REDIRECT_TYPE_PERMANENT_REDIRECT, true
	}
	return shortenerv1.RedirectType_REDIRECT_TYPE_UNSPECIFIED, false
}

// RedirectTypeCell is RedirectTypeOf's inverse: a redirect type's status
// code, "" for the default.
func RedirectTypeCell(rt shortenerv1.RedirectType) string {
	switch rt {
	case shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY:
		return "301"
	case shortenerv1.RedirectType_REDIRECT_TYPE_FOUND:
		return "302"
	case shortenerv1.RedirectType_REDIRECT_TYPE_TEMPORARY_REDIRECT:
		return "307"
	case shortenerv1.RedirectType_REDIRECT_TYPE_PERMANENT_REDIRECT:
		return "308"
	}
	return ""
}

// jsonList reads a JSON array of messages in the API's JSON form.
func jsonList[M proto.Message](cell string, fresh func() M) ([]M, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal([]byte(cell), &raws); err != nil {
		return nil, fmt.Errorf("not a JSON array: %v", err)
	}
	out := make([]M, len(raws))
	for i, raw := range raws {
		out[i] = fresh()
		if err := protojson.Unmarshal(raw, out[i]); err != nil {
			return nil, fmt.Errorf("item %d: %v", i+1, err)
		}
	}
	return out, nil
}

// JSONList writes messages as a JSON array in the API's JSON form: an
// export's rules and variants cells ("" for none).
func JSONList[M proto.Message](ms []M) string {
	if len(ms) == 0 {
		return ""
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		// protojson spaces its output at random, on purpose; an export
		// is compared and diffed, so it is compacted.
		raw, _ := protojson.Marshal(m)
		_ = json.Compact(&b, raw)
	}
	b.WriteByte(']')
	return b.String()
}

// lastSegment is the code of a short link: "abc123" of "bit.ly/abc123",
// "https://bit.ly/abc123/" or "abc123". A list of custom links ("a, b")
// gives its first.
func lastSegment(s string) string {
	if i := strings.IndexAny(s, ",| "); i >= 0 {
		s = s[:i]
	}
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimRight(s, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		s = s[i+1:]
	}
	if u, err := url.PathUnescape(s); err == nil {
		s = u
	}
	return s
}

// MaxTitleLength is the longest title kurz keeps, in characters (the
// shortener's bound, Shlink's too).
const MaxTitleLength = 512

// fitTitle makes a Bitly or YOURLS title one kurz takes: each run of
// control characters (a line break typed into a cell; C1 bytes of a
// Windows-1252 page read as Latin-1, as scraped titles have) becomes one
// space, and a title longer than MaxTitleLength is cut, ending in "…". A
// title is what a link is, for people: refused, it would cost its row the
// link, which imported before links had titles.
func fitTitle(t string) string {
	var b strings.Builder
	ctl := false
	for _, r := range t {
		if unicode.IsControl(r) {
			ctl = true
			continue
		}
		if ctl {
			b.WriteByte(' ')
			ctl = false
		}
		b.WriteRune(r)
	}
	t = strings.TrimSpace(b.String())
	if utf8.RuneCountInString(t) > MaxTitleLength {
		t = string([]rune(t)[:MaxTitleLength-1]) + "…"
	}
	return t
}

// normTags splits a tags cell (tags separated by ',', ';' or '|') into valid
// kurz tags, keeping at most MaxTags-1.
func normTags(cell string) []string {
	var out []string
	for _, t := range strings.FieldsFunc(cell, func(r rune) bool { return r == ',' || r == ';' || r == '|' }) {
		t = normTag(t)
		if t == "" || contains(out, t) {
			continue
		}
		if len(out) == MaxTags-1 {
			break
		}
		out = append(out, t)
	}
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// normTag makes t a kurz tag: lower case; runs of anything but letters,
// digits, '-', '_' and '.' become one '-'; no '-' at either end; at most 32
// characters. "" when nothing is left.
func normTag(t string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(strings.TrimSpace(t)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
			dash = r == '-'
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	s := b.String()
	if len(s) > maxTagLength {
		s = s[:maxTagLength]
	}
	return strings.Trim(s, "-")
}

// timeLayouts are the creation times seen in exports: RFC 3339, Bitly's API
// form (+0000 offsets), MySQL datetimes (YOURLS, taken as UTC), dates.
var timeLayouts = []string{
	time.RFC3339Nano, "2006-01-02T15:04:05-0700", "2006-01-02T15:04:05.000-0700", "2006-01-02 15:04:05-07:00",
	"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02",
}

// parseTime reads a creation time; zero when s is empty or unreadable.
func parseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC()
		}
	}
	// Unix seconds, as some API-based exports write them.
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 && n < 1<<40 {
		return time.Unix(n, 0).UTC()
	}
	return time.Time{}
}
