package linkimport

import (
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// FuzzParse feeds Parse arbitrary bytes. It never panics; a file it accepts
// is Bitly, YOURLS or kurz with at most MaxRows rows, whose lines increase,
// whose fields are trimmed, whose tags are valid kurz tags ending with the
// format's tag (a kurz export's: its own, trimmed, none empty), whose
// times are UTC, and whose kurz rows have settings or a problem. The seed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"long_url,link,title,created_at,tags\nhttps://example.com/,bit.ly/abc123,T,2021-03-04T05:06:07+0000,\"a, B c\"\n",
		"keyword,url,title,timestamp,ip,clicks\nozh,http://ozh.org/,Ozh,2009-10-12 21:56:38,127.0.0.1,12\n",
		"ozh,http://ozh.org/,Ozh,2009-10-12 21:56:38,127.0.0.1,12\n,,\n",
		"\ufeffLong URL,Bitlink,Custom Link\n\"https://a.example/\"\"q\"\"\",bit.ly/x/,bit.ly/%41b\n",
		"name,email\n",
		"long_url,link\n\"unterminated\n",
		"code,short_url,long_url,tags,created_at,expires_at,max_visits,disabled,password_protected,ios_url,android_url,desktop_url,domain,redirect_type,rules,variants\n" +
			"abc1,,https://example.com/,a|b,,2030-01-01T00:00:00Z,3,false,false,,,,,301,\"[{\"\"url\"\"\":\"\"https://example.com/r\"\"}]\",\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		format, rows, err := Parse(strings.NewReader(string(b)))
		if err != nil {
			if format != "" || rows != nil {
				t.Fatalf("Parse failed (%v) but returned format %q and %d rows", err, format, len(rows))
			}
			return
		}
		if format != Bitly && format != YOURLS && format != Kurz {
			t.Fatalf("format = %q", format)
		}
		if len(rows) > MaxRows {
			t.Fatalf("%d rows, more than MaxRows", len(rows))
		}
		prev := 0
		for _, r := range rows {
			if r.Line <= prev {
				t.Fatalf("line %d after line %d", r.Line, prev)
			}
			prev = r.Line
			for _, s := range []string{r.LongURL, r.Title} {
				if s != strings.TrimSpace(s) {
					t.Fatalf("line %d: field %q is not trimmed", r.Line, s)
				}
			}
			if format == Kurz {
				if (r.Problem == "") == (r.Link == nil) {
					t.Fatalf("line %d: problem %q with settings %v", r.Line, r.Problem, r.Link)
				}
				for _, tag := range r.Tags {
					if tag == "" || tag != strings.TrimSpace(tag) {
						t.Fatalf("line %d: tag %q", r.Line, tag)
					}
				}
				continue
			}
			if n := len(r.Tags); n == 0 || n > MaxTags || r.Tags[n-1] != format.Tag() {
				t.Fatalf("line %d: tags %q: want 1 to %d ending with %q", r.Line, r.Tags, MaxTags, format.Tag())
			}
			if !utf8.ValidString(r.Title) || utf8.RuneCountInString(r.Title) > MaxTitleLength || strings.IndexFunc(r.Title, unicode.IsControl) >= 0 {
				t.Fatalf("line %d: title %q is not one kurz takes", r.Line, r.Title)
			}
			seen := map[string]bool{}
			for _, tag := range r.Tags {
				if seen[tag] || len(tag) == 0 || len(tag) > maxTagLength || strings.Trim(tag, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != "" {
					t.Fatalf("line %d: tag %q is not a valid kurz tag (or repeated)", r.Line, tag)
				}
				seen[tag] = true
			}
			if !r.CreatedAt.IsZero() && r.CreatedAt.Location() != time.UTC {
				t.Fatalf("line %d: CreatedAt %v is not UTC", r.Line, r.CreatedAt)
			}
		}
	})
}
