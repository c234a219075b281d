package linkimport

import (
	"context"
	"encoding/csv"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// kurzExport is a file as GET /v1/links:export writes it.
const kurzExport = "code,short_url,long_url,tags,created_at,expires_at,max_visits,disabled,password_protected," +
	"ios_url,android_url,desktop_url,domain,redirect_type,rules,variants\n" +
	"plain1,http://k.test/plain1,https://example.com/1,a|b,2026-01-02T03:04:05Z,,,false,false,,,,,,,\n" +
	`full1,https://go.acme.test/full1,https://example.com/2,launch,2026-01-02T03:04:05Z,2030-01-01T00:00:00Z,5,false,false,` +
	`https://apps.apple.com/x,https://play.google.com/x,,go.acme.test,301,` +
	`"[{""name"":""de"",""conditions"":[{""languages"":[""de""]}],""url"":""https://example.com/de""}]",` +
	`"[{""name"":""a"",""url"":""https://example.com/a"",""weight"":1},{""name"":""b"",""url"":""https://example.com/b"",""weight"":3}]"` + "\n" +
	"secret1,http://k.test/secret1,https://example.com/3,,2026-01-02T03:04:05Z,,,false,true,,,,,,,\n" +
	"off1,http://k.test/off1,https://example.com/4,,2026-01-02T03:04:05Z,,,true,false,,,,,,,\n" +
	"cut1,http://k.test/cut1,https://example.com/5,,2026-01-02T03:04:05Z,,,false\n" // cut before password_protected

// kurz's own export comes back as the links it lists: expiry, visit
// limit, device targets, domain, redirect type, rules and variants; a
// password-protected or disabled link fails its row instead of coming
// back open, and so does a row cut short (its missing cells would read as
// empty: no password, no rules).
func TestKurzExportImportsItsLinks(t *testing.T) {
	format, rows, err := Parse(strings.NewReader(kurzExport))
	if err != nil || format != Kurz || len(rows) != 5 {
		t.Fatalf("Parse: %v, %q, %d rows; want kurz, 5", err, format, len(rows))
	}
	f := newFake()
	rep, err := Import(context.Background(), rows, f.create, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Created != 2 || rep.Failed != 3 || rep.AliasesKept != 2 {
		t.Errorf("report %+v, want 2 created with their codes, 3 failed", rep)
	}
	for _, r := range rep.Results {
		switch r.SourceCode {
		case "secret1":
			if r.Err == nil || !strings.Contains(r.Err.GetMessage(), "password-protected") {
				t.Errorf("a password-protected link: %v, want its row failed", r.Err)
			}
		case "off1":
			if r.Err == nil || !strings.Contains(r.Err.GetMessage(), "disabled") {
				t.Errorf("a disabled link: %v, want its row failed", r.Err)
			}
		case "cut1":
			if r.Err == nil || !strings.Contains(r.Err.GetMessage(), "has 8 fields, the header 16") {
				t.Errorf("a row cut short: %v, want its row failed", r.Err)
			}
		}
	}
	if len(f.calls) != 1 || len(f.calls[0]) != 2 {
		t.Fatalf("calls %v, want one of 2 links (the failed rows unsent)", f.calls)
	}
	want := &shortenerv1.CreateLinkRequest{
		LongUrl: "https://example.com/2", Mode: shortenerv1.CodeMode_CODE_MODE_CUSTOM, CustomAlias: "full1",
		Tags:          []string{"launch"},
		ExpireTime:    timestamppb.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
		MaxVisits:     5,
		RedirectType:  shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY,
		DeviceTargets: &shortenerv1.DeviceTargets{IosUrl: "https://apps.apple.com/x", AndroidUrl: "https://play.google.com/x"},
		Domain:        "go.acme.test",
		Rules: []*shortenerv1.RedirectRule{{Name: "de", Conditions: []*shortenerv1.RuleCondition{{Languages: []string{"de"}}},
			Url: "https://example.com/de"}},
		Variants: []*shortenerv1.Variant{{Name: "a", Url: "https://example.com/a", Weight: 1}, {Name: "b", Url: "https://example.com/b", Weight: 3}},
	}
	if got := f.calls[0][1]; !proto.Equal(got, want) {
		t.Errorf("the full link's request:\n%v\nwant\n%v", got, want)
	}
	plain := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/1", Mode: shortenerv1.CodeMode_CODE_MODE_CUSTOM,
		CustomAlias: "plain1", Tags: []string{"a", "b"}}
	if got := f.calls[0][0]; !proto.Equal(got, plain) {
		t.Errorf("the plain link's request:\n%v\nwant\n%v", got, plain)
	}
}

// A kurz export's cell that does not parse fails its row, saying which.
func TestKurzExportRowProblems(t *testing.T) {
	head := "code,short_url,long_url,tags,created_at,expires_at,max_visits,disabled,password_protected," +
		"ios_url,android_url,desktop_url,domain,redirect_type,rules,variants\n"
	// The cells from expires_at on.
	for cells, want := range map[string]string{
		"x":                              "expires_at",
		",-3":                            "max_visits",
		",,,,,,,,303":                    "redirect_type",
		",,,,,,,,," + `"[{""name"":1}]"`: "rules: item 1",
		",,,,,,,,,," + `"{}"`:            "variants: not a JSON array",
	} {
		row := "c0de,,https://example.com/,,," + cells
		row += strings.Repeat(",", 15-strings.Count(strings.ReplaceAll(row, `"[{""name"":1}]"`, ""), ","))
		_, rows, err := Parse(strings.NewReader(head + row + "\n"))
		if err != nil || len(rows) != 1 || !strings.Contains(rows[0].Problem, want) {
			t.Errorf("cells %q: %v, %+v; want a row problem naming %s", cells, err, rows, want)
		}
	}
}

// A cell a spreadsheet would run as a formula is written with a leading
// quote, and read back as it was.
func TestDefuseCell(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "abc": "abc", "=1+1": "'=1+1", "+1": "'+1", "-1": "'-1", "@SUM(A1)": "'@SUM(A1)",
		"\tx": "'\tx", "\rx": "'\rx", "a=b": "a=b", "'quoted": "'quoted",
		// A cell that starts as a defused one does (a title "'=1+1") is
		// quoted too, or it would come back without its quote.
		"'=1+1": "''=1+1", "'-5 steps": "''-5 steps", "''": "'''", "'": "'",
	} {
		if got := DefuseCell(in); got != want {
			t.Errorf("DefuseCell(%q) = %q, want %q", in, got, want)
		}
		if back := undefuse(DefuseCell(in)); back != in {
			t.Errorf("undefuse(DefuseCell(%q)) = %q", in, back)
		}
	}
}

// A kurz export of 1,000 rows whose ten variants have ~500-character URLs
// (5.4 KB a row) is more than the 4 MiB the shortener takes in one
// message: it is sent in chunks under that, and every row comes back.
func TestKurzExportOfLargeRowsImportsInChunksTheShortenerTakes(t *testing.T) {
	var vs []*shortenerv1.Variant
	for i := range 10 {
		vs = append(vs, &shortenerv1.Variant{Name: fmt.Sprintf("v%d", i), Weight: 1,
			Url: fmt.Sprintf("https://example.com/%d/%s", i, strings.Repeat("a", 500))})
	}
	var file strings.Builder
	cw := csv.NewWriter(&file)
	_ = cw.Write(strings.Split(strings.TrimSpace(kurzHeader), ","))
	for i := range MaxBatch {
		_ = cw.Write([]string{fmt.Sprintf("big%04d", i), "", "https://example.com/", "", "", "", "", "false", "false",
			"", "", "", "", "", "", JSONList(vs)})
	}
	cw.Flush()
	_, rows, err := Parse(strings.NewReader(file.String()))
	if err != nil || len(rows) != MaxBatch {
		t.Fatalf("Parse: %v, %d rows", err, len(rows))
	}
	f := newFake()
	const maxMessage = 4 << 20 // the shortener's gRPC receive limit
	create := func(ctx context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		if n := proto.Size(&shortenerv1.BatchCreateLinksRequest{Requests: reqs}); n > maxMessage {
			return nil, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, maxMessage)
		}
		return f.create(ctx, reqs)
	}
	rep, err := Import(context.Background(), rows, create, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Created != MaxBatch || rep.Failed != 0 || len(f.calls) < 2 {
		t.Errorf("created %d, failed %d in %d calls; want %d created in more than one call", rep.Created, rep.Failed, len(f.calls), MaxBatch)
	}
}

// Rows whose rules hold many short values are several times larger in
// JSON, as kurzctl sends a batch to the gateway (bodies of at most 4 MB),
// than in protobuf: the chunks are cut so that both encodings fit.
func TestChunksFitTheGatewaysJSONBodyToo(t *testing.T) {
	var conds []*shortenerv1.RuleCondition
	for range 8 {
		conds = append(conds, &shortenerv1.RuleCondition{Countries: []string{"DE", "AT", "CH", "FR", "IT", "ES", "NL", "BE", "PL", "SE",
			"NO", "DK", "FI", "IE", "PT", "GR", "CZ", "HU", "RO", "BG", "HR", "SK", "SI", "LT", "LV", "EE", "LU", "MT", "CY", "IS", "LI", "MC"}})
	}
	var rules []*shortenerv1.RedirectRule
	for i := range 20 {
		rules = append(rules, &shortenerv1.RedirectRule{Name: fmt.Sprintf("r%d", i), Conditions: conds, Url: "https://example.com/r"})
	}
	var file strings.Builder
	cw := csv.NewWriter(&file)
	_ = cw.Write(strings.Split(strings.TrimSpace(kurzHeader), ","))
	for i := range MaxBatch {
		_ = cw.Write([]string{fmt.Sprintf("wide%04d", i), "", "https://example.com/", "", "", "", "", "false", "false",
			"", "", "", "", "", JSONList(rules), ""})
	}
	cw.Flush()
	_, rows, err := Parse(strings.NewReader(file.String()))
	if err != nil || len(rows) != MaxBatch {
		t.Fatalf("Parse: %v, %d rows", err, len(rows))
	}
	const gatewayBody = 4_096_000
	f := newFake()
	create := func(ctx context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		body, err := protojson.Marshal(&shortenerv1.BatchCreateLinksRequest{Requests: reqs})
		if err != nil {
			return nil, err
		}
		if len(body) > gatewayBody {
			return nil, status.Errorf(codes.InvalidArgument, "the request body is %d bytes, larger than %d", len(body), gatewayBody)
		}
		return f.create(ctx, reqs)
	}
	rep, err := Import(context.Background(), rows, create, nil)
	if err != nil || rep.Created != MaxBatch || rep.Failed != 0 {
		t.Fatalf("import: %d created, %d failed in %d calls, %v; want %d created", rep.Created, rep.Failed, len(f.calls), err, MaxBatch)
	}
}
