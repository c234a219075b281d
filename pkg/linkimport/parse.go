// Package linkimport reads the link exports of other URL shorteners (Bitly,
// YOURLS) and creates their links in kurz through BatchCreateLinks, keeping
// each link's code where kurz can. The gateway's POST /v1/links:import and
// kurzctl both use it: Parse the file, then Import the rows.
package linkimport

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
)

// Tag is the tag Parse adds to every row of an export in format f
// ("import-bitly", "import-yourls"), so the links of an import can be listed
// (GET /v1/links?tag=import-bitly) and reviewed or removed together.
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
	// Title is the link's title, if the file has one. kurz links have no
	// title: Import does not use it.
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
}

// columns are the positions of a format's fields in a record; -1: absent.
type columns struct {
	code, longURL, title, created, tags int
	// codeAlt is a second short link column (Bitly's custom link), used
	// when non-empty in preference to code.
	codeAlt int
}

// Parse reads a Bitly or YOURLS CSV export, detecting which by its header
// (a YOURLS export without a header is recognised by its first record:
// keyword, then an http(s) URL). It fails for a file that is empty, is not
// CSV, has an unknown header, or has more than MaxRows rows; problems of
// single rows (an empty URL, an unreadable time) are left for the row.
func Parse(r io.Reader) (Format, []Row, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = false
	first, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return "", nil, errors.New("the file is empty: expected a Bitly or YOURLS CSV export")
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
			"optionally title, created_at, tags) or a YOURLS export (keyword,url,title,timestamp,ip,clicks)", headerSummary(first))
	}
	var rows []Row
	add := func(rec []string, line int) error {
		if len(rows) == MaxRows {
			return fmt.Errorf("the file has more than %d rows: split it into smaller files", MaxRows)
		}
		rows = append(rows, makeRow(format, cols, rec, line))
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

// csvProblem turns a CSV reader's error into one a person can act on.
func csvProblem(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
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

// normHeader folds a header cell: "Long URL" and "long-url" are "long_url".
func normHeader(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	return strings.NewReplacer(" ", "_", "-", "_").Replace(s)
}

// detect returns the format and columns of a file from its first record;
// headerless is true when that record is already data (YOURLS).
func detect(first []string) (f Format, cols columns, headerless bool) {
	idx := map[string]int{}
	for i, h := range first {
		if _, dup := idx[normHeader(h)]; !dup {
			idx[normHeader(h)] = i
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
	row := Row{Line: line, LongURL: field(cols.longURL), Title: field(cols.title)}
	switch f {
	case Bitly:
		row.SourceCode = lastSegment(field(cols.codeAlt))
		if row.SourceCode == "" {
			row.SourceCode = lastSegment(field(cols.code))
		}
	case YOURLS:
		row.SourceCode = field(cols.code)
	}
	row.CreatedAt = parseTime(field(cols.created))
	row.Tags = append(normTags(field(cols.tags)), f.Tag())
	return row
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
