package linkimport

import (
	"runtime"
	"strings"
	"testing"
)

// kurzHeader is the header row of kurz's export.
const kurzHeader = "code,short_url,long_url,tags,created_at,expires_at,max_visits,disabled,password_protected," +
	"ios_url,android_url,desktop_url,domain,redirect_type,rules,variants\n"

// allocated is how many bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Files that would each take hundreds of MB to gigabytes of heap to read
// are refused, or fail their row, having allocated a small multiple of
// their size: a rules or variants cell of a million "{}" (a message each
// before the shortener's bound of 10 refused them), a record of millions of
// fields (a string each), a header of them.
func TestParseOfOversizedFilesStaysSmall(t *testing.T) {
	// Cells under MaxCell; the record and header longer than it.
	const size = 3 * MaxCell / 4
	cell := func(n int) string { return `"[{}` + strings.Repeat(",{}", n) + `]"` }
	for name, tc := range map[string]struct {
		file, wantErr, wantProblem string
	}{
		"variants of a million items": {
			file:        kurzHeader + "c1,,https://example.com/,,,,,false,false,,,,,,," + cell(size/3) + "\n",
			wantProblem: "variants holds more than 10 elements",
		},
		"rules of a million items": {
			file:        kurzHeader + "c1,,https://example.com/,,,,,false,false,,,,,," + cell(size/3) + ",\n",
			wantProblem: "rules holds more than 20 elements",
		},
		"conditions of a million items": {
			file: kurzHeader + "c1,,https://example.com/,,,,,false,false,,,,,," +
				`"[{""name"":""a"",""url"":""https://example.com/a"",""conditions"":[{}` + strings.Repeat(",{}", size/3) + `]}]",` + "\n",
			wantProblem: "rules[0].conditions holds more than 8 elements",
		},
		"a record of millions of fields": {
			file:    "keyword,url\nabcd,https://example.com/," + strings.Repeat(",", 4*size),
			wantErr: "line 2 has more than 64 fields",
		},
		"a header of millions of fields": {
			file:    strings.Repeat(",", 4*size) + "\n",
			wantErr: "line 1 has more than 64 fields",
		},
		"a cell larger than any link's settings": {
			file:    "keyword,url\nabcd," + strings.Repeat("a", MaxCell+1) + "\n",
			wantErr: "line 2 has a field of more than",
		},
	} {
		t.Run(name, func(t *testing.T) {
			var rows []Row
			var err error
			alloc := allocated(func() { _, rows, err = Parse(strings.NewReader(tc.file)) })
			// csv.Reader grows its buffers by doubling and copies the
			// record out: a long record costs up to ~9 times its size.
			if limit := uint64(16 * len(tc.file)); alloc > limit {
				t.Errorf("Parse allocated %d MiB for a file of %d MiB, want at most %d MiB", alloc>>20, len(tc.file)>>20, limit>>20)
			}
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Parse error = %v, want one saying %q", err, tc.wantErr)
				}
			case err != nil || len(rows) != 1:
				t.Errorf("Parse: %v, %d rows; want 1 row", err, len(rows))
			case !strings.Contains(rows[0].Problem, tc.wantProblem) || rows[0].Link != nil:
				t.Errorf("row problem = %q, want one saying %q", rows[0].Problem, tc.wantProblem)
			}
		})
	}
}

// The largest valid rules are read; a list is refused at its bound plus
// one, wherever it is, with its path named.
func TestCheckLists(t *testing.T) {
	items := func(n int, item string) string {
		return "[" + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + "]"
	}
	cond := `{"cidrs":` + items(32, `"10.0.0.0/8"`) + `}`
	rule := `{"name":"r","url":"https://example.com/","conditions":` + items(8, cond) + `}`
	for _, tc := range []struct{ data, top, want string }{
		{items(20, rule), "rules", ""},
		{items(10, `{"name":"v"}`), "variants", ""},
		{items(21, rule), "rules", "rules holds more than 20 elements"},
		{items(11, `{}`), "variants", "variants holds more than 10 elements"},
		{`[{"conditions":[{},{"devices":` + items(33, `"ios"`) + `}]}]`, "rules", "rules[0].conditions[1].devices holds more than 32"},
		{`{"requests":[{},{"variants":` + items(11, `{}`) + `}]}`, "", "requests[1].variants holds more than 10"},
		{`{"requests":[{"tags":` + items(50, `"a"`) + `}]}`, "", ""},
		{`{"requests":[{"variants":[{}],"x":"variants","rules":` + items(21, `"x"`), "", "requests[0].rules holds more than 20"},
		{`[{},{},`, "variants", ""},
		{`not json`, "rules", ""},
	} {
		err := CheckLists([]byte(tc.data), tc.top)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckLists(%.60s...) = %v, want nil", tc.data, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckLists(%.60s...) = %v, want %q", tc.data, err, tc.want)
		}
	}
}
