package linkimport

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/urlnorm"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// MaxBatch is the most links Import sends in one Creator call: the limit of
// BatchCreateLinks.
const MaxBatch = 1000

// MaxBatchBytes is the most bytes of encoded requests Import sends in one
// Creator call, whatever their number (in protobuf or JSON, the larger:
// batchSize): the shortener takes messages of up to 4 MiB and the
// gateway's batch route bodies of up to 4 MB, and 1,000 rows of a kurz
// export with ten long variant URLs each are more.
const MaxBatchBytes = 3 << 20

// Creator creates a batch of at most MaxBatch links, as BatchCreateLinks
// does: one result per request, in request order. An error fails the whole
// batch (nothing of it is taken as created).
type Creator func(ctx context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error)

// Lookup returns the caller's own link of code on domain ("" for the
// default domain; found false when it has none, or the code is another
// tenant's): how Import tells an alias the caller already imported from
// one taken by someone else.
type Lookup func(ctx context.Context, domain, code string) (link *shortenerv1.Link, found bool, err error)

// Report is the outcome of an Import.
type Report struct {
	// Format is the file's format. Import does not know it: the caller sets
	// it from Parse.
	Format Format
	// Rows is how many rows were given to Import.
	Rows int
	// Created is how many links were created.
	Created int
	// AliasesKept is how many of them got their source code as their kurz
	// code.
	AliasesKept int
	// Existing is how many rows the caller had imported already: their
	// source code is already the caller's link to the same URL, which is
	// their link (not created again).
	Existing int
	// Failed is how many rows got no link.
	Failed int
	// Results has one entry per row, in row order; when Import returned an
	// error, only the rows whose outcome is final.
	Results []Result
}

// Result is the outcome of one row.
type Result struct {
	// Row is the row's Line in the file.
	Row int
	// SourceCode is the row's code at the other shortener.
	SourceCode string
	// Code and ShortURL are the created link's; empty when Err is set.
	Code     string
	ShortURL string
	// AliasKept says the link's code is SourceCode.
	AliasKept bool
	// Existing says the link was there already (an earlier import of the
	// row): nothing was created.
	Existing bool
	// Err says why the row got no link; nil when it got one.
	Err *shortenerv1.BatchItemError
}

// Import creates a link per row through create, in chunks of at most
// MaxBatch rows and MaxBatchBytes of requests, in row order; a chunk refused as larger than the tenant's quota
// ever holds (BATCH_SIZE_INVALID with metadata max_batch) is sent again,
// and every later one, in chunks of that size. A row whose SourceCode is a valid kurz alias
// (linkcode.AliasProblem) asks for it (CODE_MODE_CUSTOM); the others, and
// those whose alias was refused (taken, reserved, or otherwise invalid for
// the shortener: an error on field "custom_alias" with code ALREADY_EXISTS
// or INVALID_ARGUMENT), get a sequential code: the refused ones in further
// chunks after the first pass. Rows without a URL fail on their own without
// a call. Each row's Tags and Title are carried; CreatedAt is not (kurz
// sets its own create time).
//
// progress, when not nil, is called after each chunk with the number of rows
// whose outcome is final and len(rows). When create fails, Import stops
// and returns the report of the rows finished so far with a *BatchError.
// A lookup that fails fails its row only (it is taken, and may be the
// caller's own link).
func Import(ctx context.Context, rows []Row, create Creator, progress func(done, total int)) (Report, error) {
	return ImportWith(ctx, rows, create, nil, progress)
}

// ImportWith is Import that, given lookup, makes an import run again
// create nothing twice: a row whose source code is taken by the caller's
// own link to the same URL (sameURL) gets that link, Existing, instead of
// a copy under a new code. (A shortener that answers such a row with the
// link, not created, makes it Existing without lookup; the lookup is for
// one that answers ALREADY_EXISTS, and for a chunk the quota refused.)
func ImportWith(ctx context.Context, rows []Row, create Creator, lookup Lookup, progress func(done, total int)) (Report, error) {
	rep := Report{Rows: len(rows)}
	results := make([]Result, len(rows))
	final := make([]bool, len(rows))
	done := 0
	var pending []int // rows to send, by index
	for i, row := range rows {
		results[i] = Result{Row: row.Line, SourceCode: row.SourceCode}
		if row.LongURL == "" || row.Problem != "" {
			results[i].Err = &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT", Field: "long_url",
				Message: fmt.Sprintf("line %d has no URL", row.Line)}
			if row.Problem != "" {
				results[i].Err = &shortenerv1.BatchItemError{Code: "FAILED_PRECONDITION",
					Message: fmt.Sprintf("line %d: %s", row.Line, row.Problem)}
			}
			final[i] = true
			done++
			continue
		}
		pending = append(pending, i)
	}
	finish := func(err error) (Report, error) {
		for i, r := range results {
			if !final[i] {
				continue // never sent, or sent again when create failed
			}
			rep.Results = append(rep.Results, r)
			switch {
			case r.Err != nil:
				rep.Failed++
			case r.Existing:
				rep.Existing++
			case r.AliasKept:
				rep.Created++
				rep.AliasesKept++
			default:
				rep.Created++
			}
		}
		return rep, err
	}

	// existing marks row i as the caller's own link under its source code
	// when lookup finds it there with the same URL, and redirecting: one
	// disabled or expired answers 410, and is no import of the row (dead
	// says so, and the row is not marked). A link whose visits are spent
	// looks alive here (a Link does not carry its visits): the shortener's
	// batch, which reads them, refuses its alias itself.
	existing := func(i int) (found bool, dead string, err error) {
		l, found, err := lookup(ctx, rows[i].Link.GetDomain(), rows[i].SourceCode)
		if err != nil {
			return false, "", fmt.Errorf("look up line %d's code %q: %w", rows[i].Line, rows[i].SourceCode, err)
		}
		if !found || !sameURL(l.GetLongUrl(), rows[i].LongURL) {
			return false, "", nil
		}
		switch {
		case l.GetDisabled():
			return false, "disabled", nil
		case l.GetExpireTime() != nil && !l.GetExpireTime().AsTime().After(time.Now()):
			return false, "expired", nil
		}
		results[i].Code, results[i].ShortURL = l.GetCode(), l.GetShortUrl()
		results[i].AliasKept, results[i].Existing = true, true
		final[i] = true
		done++
		return true, "", nil
	}

	var retry []int
	size := MaxBatch
	send := func(idx []int, alias bool) error {
		for len(idx) > 0 {
			var reqs []*shortenerv1.CreateLinkRequest
			var withAlias []bool
			encoded := 0
			for _, i := range idx[:min(size, len(idx))] {
				a := alias && linkcode.AliasProblem(rows[i].SourceCode) == ""
				req := request(rows[i], a)
				n := batchSize(req)
				if len(reqs) > 0 && encoded+n > MaxBatchBytes {
					break
				}
				reqs, withAlias, encoded = append(reqs, req), append(withAlias, a), encoded+n
			}
			chunk := idx[:len(reqs)]
			resp, err := create(ctx, reqs)
			if n := maxBatch(err); n > 0 && n < len(chunk) {
				// The tenant's quota never holds this many at once (its
				// plan's burst): the same rows again, in chunks it holds.
				size = n
				continue
			}
			if err != nil {
				if lookup != nil && rateLimited(err) {
					// A file sent again after a stop: the rows of the
					// earlier run are reported though the new ones do
					// not fit the quota now (the rest are not reached).
					for k, i := range chunk {
						if !withAlias[k] {
							continue
						}
						if _, _, lerr := existing(i); lerr != nil {
							break // the stop's error is the one to report
						}
					}
				}
				return batchError(rows, chunk, err)
			}
			idx = idx[len(chunk):]
			got := resp.GetResults()
			if len(got) != len(chunk) {
				return batchError(rows, chunk, fmt.Errorf("%d links answered %d results", len(chunk), len(got)))
			}
			for k, res := range got {
				if int(res.GetIndex()) != k {
					return batchError(rows, chunk, fmt.Errorf("result %d answered with index %d", k, res.GetIndex()))
				}
			}
			for k, res := range got {
				i := chunk[k]
				if e := res.GetError(); e != nil {
					if withAlias[k] && e.GetCode() == "ALREADY_EXISTS" && lookup != nil {
						found, dead, err := existing(i)
						if err != nil {
							// The row alone is in doubt: the others of
							// the chunk are made, and are reported.
							results[i].Err = &shortenerv1.BatchItemError{Code: "UNAVAILABLE", Field: "custom_alias",
								Message: fmt.Sprintf("the code %q is taken and whether it is your earlier import of this row could not be checked (%v): look it up before sending the row again", rows[i].SourceCode, err)}
							final[i] = true
							done++
							continue
						}
						if found {
							continue
						}
						if dead != "" {
							results[i].Err = deadAlias(rows[i].SourceCode, dead)
							final[i] = true
							done++
							continue
						}
					}
					if withAlias[k] && aliasRefused(e) {
						retry = append(retry, i)
						continue
					}
					results[i].Err = e
				} else {
					link := res.GetLink()
					results[i].Code = link.GetCode()
					results[i].ShortURL = link.GetShortUrl()
					results[i].AliasKept = withAlias[k] && link.GetCode() == rows[i].SourceCode
					// A link not created is the caller's own already: the
					// shortener answers an alias that is the caller's link to
					// the same URL with that link.
					results[i].Existing = !res.GetCreated()
				}
				final[i] = true
				done++
			}
			if progress != nil {
				progress(done, len(rows))
			}
		}
		return nil
	}
	if err := send(pending, true); err != nil {
		return finish(err)
	}
	if err := send(retry, false); err != nil {
		return finish(err)
	}
	return finish(nil)
}

// deadAlias is the error of a row whose source code is the caller's link
// to the row's URL that no longer redirects (why: disabled, expired): the
// row is not there as a working link, and importing it under another code
// would leave the dead one in its short URL's place. The shortener's batch
// answers such an alias with the same code (FAILED_PRECONDITION).
func deadAlias(code, why string) *shortenerv1.BatchItemError {
	fix := map[string]string{"disabled": "enable it", "expired": "give it a later expiry"}[why]
	return &shortenerv1.BatchItemError{Code: "FAILED_PRECONDITION", Field: "custom_alias",
		Message: fmt.Sprintf("the alias %q is taken by your link to this URL, which no longer redirects (%s): %s, or use another alias", code, why, fix)}
}

// BatchError is Import's error when a create call failed or answered what
// cannot be read: Lines are the rows (their Row.Line) that call carried,
// none of them in the report. Whether any of their links were made depends
// on Err: a refusal (a quota, an invalid batch) made none; a call that
// timed out, or whose answer was inconsistent, may have made them all.
type BatchError struct {
	Lines []int
	Err   error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("batch create of lines %d to %d: %v", e.Lines[0], e.Lines[len(e.Lines)-1], e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

func batchError(rows []Row, chunk []int, err error) *BatchError {
	lines := make([]int, len(chunk))
	for k, i := range chunk {
		lines[k] = rows[i].Line
	}
	return &BatchError{Lines: lines, Err: err}
}

// sameURL reports whether a link's stored URL is the row's: equal once
// both are in the shortener's normal form (scheme in lower case, the host
// in lowercase punycode without a trailing dot, a default port dropped, the
// query escaped as it escapes it: urlnorm). A URL the shortener rewrote
// further (an IPv4 address written in hex, say) does not compare equal:
// the row is then imported under a new code, as any taken alias is.
func sameURL(stored, row string) bool {
	if stored == row {
		return true
	}
	a, err1 := url.Parse(stored)
	b, err2 := url.Parse(strings.TrimSpace(row))
	if err1 != nil || err2 != nil {
		return false
	}
	norm := func(u *url.URL) string {
		c := *u
		c.Scheme = strings.ToLower(c.Scheme)
		host, port := strings.TrimSuffix(strings.ToLower(c.Hostname()), "."), c.Port()
		if ascii, err := urlnorm.Host(host); err == nil && !strings.Contains(host, ":") {
			host = ascii
		}
		c.RawQuery = urlnorm.EscapeQuery(c.RawQuery)
		if (c.Scheme == "http" && port == "80") || (c.Scheme == "https" && port == "443") {
			port = ""
		}
		c.Host = host
		if port != "" {
			c.Host = net.JoinHostPort(host, port)
		}
		if c.Path == "" {
			c.Path = "/"
		}
		return c.String()
	}
	return norm(a) == norm(b)
}

// rateLimited reports whether err is a quota's refusal (RATE_LIMITED).
func rateLimited(err error) bool {
	info, _, _ := rpcerr.Details(err)
	return info.GetReason() == rpcerr.ReasonRateLimited
}

// maxBatch is the largest batch err says the shortener takes (a
// BATCH_SIZE_INVALID of the link creation quota), or 0.
func maxBatch(err error) int {
	info, _, _ := rpcerr.Details(err)
	if info.GetReason() != "BATCH_SIZE_INVALID" {
		return 0
	}
	n, err := strconv.Atoi(info.GetMetadata()["max_batch"])
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// request is the CreateLinkRequest of a row.
func request(row Row, alias bool) *shortenerv1.CreateLinkRequest {
	req := &shortenerv1.CreateLinkRequest{}
	if row.Link != nil {
		req = proto.CloneOf(row.Link)
		req.Rules, req.Variants = row.RulesAndVariants()
	}
	req.LongUrl, req.Mode, req.Tags, req.Title = row.LongURL, shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL, row.Tags, row.Title
	if alias {
		req.Mode = shortenerv1.CodeMode_CODE_MODE_CUSTOM
		req.CustomAlias = row.SourceCode
	}
	return req
}

// aliasRefused reports whether an item failed for its alias alone, so that
// it may succeed with a code of kurz's choosing.
func aliasRefused(e *shortenerv1.BatchItemError) bool {
	return e.GetField() == "custom_alias" && (e.GetCode() == "ALREADY_EXISTS" || e.GetCode() == "INVALID_ARGUMENT")
}

// batchSize is what req adds to a batch in the larger of its two
// encodings: the gateway sends the batch to the shortener in protobuf (its
// field tag and length, then the request), kurzctl sends it to the
// gateway in JSON (the request and a comma), which is several times larger
// for rules of many short values.
func batchSize(req *shortenerv1.CreateLinkRequest) int {
	n := 1 + protowire.SizeBytes(proto.Size(req))
	if j, err := protojson.Marshal(req); err == nil {
		n = max(n, len(j)+1)
	}
	return n
}
