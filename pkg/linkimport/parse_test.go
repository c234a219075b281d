package linkimport

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestParseFormats(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UTC()
	}
	tests := map[string]struct {
		csv        string
		wantFormat Format
		want       []Row
	}{
		"bitly API-style columns": {
			csv: "id,link,long_url,title,created_at,tags\n" +
				"bit.ly/abc123,https://bit.ly/abc123,https://example.com/a,Page A,2021-03-04T05:06:07+0000,\"Marketing, Q3 launch\"\n",
			wantFormat: Bitly,
			want: []Row{{Line: 2, SourceCode: "abc123", LongURL: "https://example.com/a", Title: "Page A",
				Tags: []string{"marketing", "q3-launch", "import-bitly"}, CreatedAt: at("2021-03-04T05:06:07Z")}},
		},
		"bitly web export with spaced headers and a custom link": {
			csv: "\ufeffCreated At,Title,Bitlink,Custom Link,Long URL,Tags\n" +
				"2020-01-02 10:00:00,,bit.ly/3xYz,bit.ly/spring-sale,https://shop.example/spring,sale|Spring\n" +
				"2020-01-03,T,bit.ly/4aBc/,,https://shop.example/b,\n",
			wantFormat: Bitly,
			want: []Row{
				{Line: 2, SourceCode: "spring-sale", LongURL: "https://shop.example/spring", Tags: []string{"sale", "spring", "import-bitly"},
					CreatedAt: at("2020-01-02T10:00:00Z")},
				{Line: 3, SourceCode: "4aBc", LongURL: "https://shop.example/b", Title: "T", Tags: []string{"import-bitly"},
					CreatedAt: at("2020-01-03T00:00:00Z")},
			},
		},
		"yourls with header": {
			csv: "keyword,url,title,timestamp,ip,clicks\n" +
				"ozh,http://ozh.org/,Ozh,2009-10-12 21:56:38,127.0.0.1,12\n" +
				"\n" +
				"yourls,https://yourls.org/,,not a time,127.0.0.1,0\n",
			wantFormat: YOURLS,
			want: []Row{
				{Line: 2, SourceCode: "ozh", LongURL: "http://ozh.org/", Title: "Ozh", Tags: []string{"import-yourls"},
					CreatedAt: at("2009-10-12T21:56:38Z")},
				{Line: 4, SourceCode: "yourls", LongURL: "https://yourls.org/", Tags: []string{"import-yourls"}},
			},
		},
		"yourls without header": {
			csv: "ozh,http://ozh.org/,Ozh,2009-10-12 21:56:38,127.0.0.1,12\n" +
				"empty,,,,,\n",
			wantFormat: YOURLS,
			want: []Row{
				{Line: 1, SourceCode: "ozh", LongURL: "http://ozh.org/", Title: "Ozh", Tags: []string{"import-yourls"},
					CreatedAt: at("2009-10-12T21:56:38Z")},
				{Line: 2, SourceCode: "empty", Tags: []string{"import-yourls"}},
			},
		},
		"short records leave missing fields empty": {
			csv:        "long_url,link,title\nhttps://example.com/x\n",
			wantFormat: Bitly,
			want:       []Row{{Line: 2, LongURL: "https://example.com/x", Tags: []string{"import-bitly"}}},
		},
		"header only": {
			csv:        "keyword,url,title,timestamp,ip,clicks\n",
			wantFormat: YOURLS,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gotFormat, got, err := Parse(strings.NewReader(tc.csv))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if gotFormat != tc.wantFormat {
				t.Errorf("format = %q, want %q", gotFormat, tc.wantFormat)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rows:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseRefusesFile(t *testing.T) {
	tests := map[string]struct {
		csv      string
		wantText string
	}{
		"empty":          {csv: "", wantText: "the file is empty"},
		"unknown header": {csv: "name,email\nann,ann@example.com\n", wantText: `unknown CSV header "name,email": expected a Bitly export`},
		"json":           {csv: `{"links": [{"url": "https://example.com"}]}`, wantText: "the file is not valid CSV: line 1"},
		"not csv":        {csv: "long_url,link\n\"https://example.com/a,bit.ly/x\n", wantText: "the file is not valid CSV: line 2"},
		"too many rows": {
			csv:      "keyword,url\n" + strings.Repeat("k,https://example.com/\n", MaxRows+1),
			wantText: fmt.Sprintf("more than %d rows", MaxRows),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, rows, err := Parse(strings.NewReader(tc.csv))
			if err == nil {
				t.Fatalf("Parse succeeded with %d rows, want an error containing %q", len(rows), tc.wantText)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error = %q, want it to contain %q", err, tc.wantText)
			}
		})
	}
}

func TestParseTakesMaxRows(t *testing.T) {
	_, rows, err := Parse(strings.NewReader("keyword,url\n" + strings.Repeat("k,https://example.com/\n", MaxRows)))
	if err != nil {
		t.Fatalf("Parse of %d rows: %v", MaxRows, err)
	}
	if len(rows) != MaxRows {
		t.Errorf("got %d rows, want %d", len(rows), MaxRows)
	}
}

func TestParseTags(t *testing.T) {
	tests := map[string][]string{
		"":                         {"import-bitly"},
		"Marketing;  Q3 Launch!! ": {"marketing", "q3-launch", "import-bitly"},
		"a,A,a":                    {"a", "import-bitly"},
		"café,!!!,-x-":             {"caf", "x", "import-bitly"},
		strings.Repeat("long", 10): {strings.Repeat("long", 8), "import-bitly"},
		"1,2,3,4,5,6,7,8,9,10,11":  {"1", "2", "3", "4", "5", "6", "7", "8", "9", "import-bitly"},
		"v1.2_beta|x-y":            {"v1.2_beta", "x-y", "import-bitly"},
	}
	for cell, want := range tests {
		t.Run(cell, func(t *testing.T) {
			_, rows, err := Parse(strings.NewReader("long_url,link,tags\nhttps://example.com/,bit.ly/a,\"" + cell + "\"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if got := rows[0].Tags; !reflect.DeepEqual(got, want) {
				t.Errorf("tags of %q = %q, want %q", cell, got, want)
			}
			if len(rows[0].Tags) > MaxTags {
				t.Errorf("%d tags, more than %d", len(rows[0].Tags), MaxTags)
			}
		})
	}
}

// A Bitly or YOURLS title is made into one kurz takes, as its tags are:
// a title is what a link is, for people, and must not cost the row its
// link. Control characters (a line break typed into a cell, C1 bytes of a
// Windows-1252 page read as Latin-1, as scraped titles have) become
// spaces, and a title longer than kurz's 512 characters is cut, ending in
// "…". A kurz export's title is kurz's own, and comes back as it was.
func TestParseFitsForeignTitles(t *testing.T) {
	long := strings.Repeat("é", 600)
	for name, tc := range map[string]struct{ csv, want string }{
		"yourls C1":        {"keyword,url,title,timestamp,ip,clicks\na1,https://example.com/1,\"Don\u0092t miss\u0085it\",2012-05-01 10:00:00,127.0.0.1,7\n", "Don t miss it"},
		"bitly line break": {"long_url,link,title\nhttps://example.com/1,bit.ly/a1,\"Spring\r\n\tsale\"\n", "Spring sale"},
		"yourls long":      {"keyword,url,title,timestamp,ip,clicks\na1,https://example.com/1," + long + ",2012-05-01 10:00:00,127.0.0.1,7\n", strings.Repeat("é", 511) + "…"},
		"bitly 512":        {"long_url,link,title\nhttps://example.com/1,bit.ly/a1," + long[:1024] + "\n", long[:1024]},
		"kurz":             {"code,short_url,long_url,tags,password_protected,title\na1,http://k.test/a1,https://example.com/1,,false,\"a\tb\"\n", "a\tb"},
	} {
		t.Run(name, func(t *testing.T) {
			_, rows, err := Parse(strings.NewReader(tc.csv))
			if err != nil {
				t.Fatal(err)
			}
			if got := rows[0].Title; got != tc.want {
				t.Errorf("title %s, want %s", shown(got), shown(tc.want))
			}
		})
	}
}

// shown is a title for a test's message: quoted, its end cut when long,
// with its length in characters.
func shown(s string) string {
	n := utf8.RuneCountInString(s)
	if r := []rune(s); n > 20 {
		s = string(r[:10]) + "..." + string(r[n-10:])
	}
	return fmt.Sprintf("%q (%d characters)", s, n)
}
