package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkimport"
	"kurz.dev/pkg/rpcerr"
)

// defaultImportBatch is the most one POST /v1/links:batch takes; a smaller
// --batch prints progress more often and fits a small plan's burst.
const defaultImportBatch = linkimport.MaxBatch

// quotaRefusal is the gateway's 429 of a kurz quota as linkimport reads a
// quota's refusal (a gRPC status with its ErrorInfo), printed as the
// gateway worded it.
type quotaRefusal struct{ *apiError }

// GRPCStatus is the refusal as the shortener's status.
func (q quotaRefusal) GRPCStatus() *status.Status {
	st := status.New(codes.ResourceExhausted, q.Message)
	if d, err := st.WithDetails(rpcerr.Info(rpcerr.ReasonRateLimited, nil)); err == nil {
		return d
	}
	return st
}

func (q quotaRefusal) Unwrap() error { return q.apiError }

// maxImportWait and maxImportWaits bound how long one request of an
// import (a batch, or the lookup of a row's code) waits out refusals: a
// Retry-After of at most a minute, at most 30 times for one request.
const (
	maxImportWait  = time.Minute
	maxImportWaits = 30
)

// reasonBulkShareInUse is the gateway's 429 of a tenant whose bulk
// requests in progress (another import, say) hold its share of the bulk
// slots: the batch was refused before its body was read.
const reasonBulkShareInUse = "BULK_SHARE_IN_USE"

// reasonBulkSlotsBusy and reasonHashingBusy are the 503s of a batch refused
// before anything was created: every bulk slot of the gateway busy, every
// password-hashing slot of the shortener busy.
const (
	reasonBulkSlotsBusy = "BULK_SLOTS_BUSY"
	reasonHashingBusy   = "PASSWORD_HASHING_BUSY"
)

// waitOut decides whether a refused request of an import is sent again:
// when again says err guarantees nothing was done and err's Retry-After is
// at most maxImportWait, it prints one line on stderr, waits that long and
// returns true; after maxImportWaits waits of the request, or for any
// other error, it returns false at once. An interrupt while it waits is
// its error.
func (c *cli) waitOut(ctx context.Context, err error, waits int, again func(*apiError) bool) (bool, error) {
	var ae *apiError
	if !errors.As(err, &ae) || !again(ae) || ae.RetryAfterMS <= 0 ||
		ae.RetryAfterMS > maxImportWait.Milliseconds() || waits >= maxImportWaits {
		return false, nil
	}
	d := time.Duration(ae.RetryAfterMS) * time.Millisecond
	fmt.Fprintf(c.stderr, "waiting %s: %s\n", d, ae.Message)
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-time.After(d):
		return true, nil
	}
}

// batchRefusedUndone reports whether ae is a refusal of a batch create
// that guarantees nothing of it was created, so the same rows may be sent
// again: a quota's 429 (the gateway's rate limit, the link creation
// quota), a 429 of the tenant's bulk share in use, and a 503 whose reason
// says nothing was created (every bulk slot busy, passwords being hashed). Any
// other 503 (a timeout's, a service gone mid-call) may come after links
// were made: sent again, rows without an alias would be created twice.
func batchRefusedUndone(ae *apiError) bool {
	reason, _ := ae.info()
	switch ae.Status {
	case http.StatusTooManyRequests:
		return reason == rpcerr.ReasonRateLimited || reason == reasonBulkShareInUse
	case http.StatusServiceUnavailable:
		return reason == reasonBulkSlotsBusy || reason == reasonHashingBusy
	}
	return false
}

// lookupRefused reports whether ae refused a lookup of a row's code for
// now (429): a GET, safe to send again.
func lookupRefused(ae *apiError) bool { return ae.Status == http.StatusTooManyRequests }

// rateLimited reports whether ae is the gateway's rate limit refusing a
// request for now (429 RATE_LIMITED), which a read may wait out.
func rateLimited(ae *apiError) bool {
	reason, _ := ae.info()
	return ae.Status == http.StatusTooManyRequests && reason == rpcerr.ReasonRateLimited
}

func setupLinksImport(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "links import"
	batch := fs.Int("batch", defaultImportBatch, fmt.Sprintf("links per request, 1 to %d", linkimport.MaxBatch))
	return func(args []string) error {
		if *batch < 1 || *batch > linkimport.MaxBatch {
			return usagef(cmd, "--batch must be from 1 to %d", linkimport.MaxBatch)
		}
		f, err := os.Open(args[0])
		if err != nil {
			return fmt.Errorf("import: %w", err)
		}
		defer f.Close()
		format, rows, err := linkimport.Parse(f)
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		rep, err := c.importRows(gw, rows, *batch)
		rep.Format = format
		if err != nil {
			switch {
			case rep.Existing > 0:
				fmt.Fprintf(c.stderr, "stopped after %d of %d rows (%d links created, %d imported before)\n", len(rep.Results), rep.Rows, rep.Created, rep.Existing)
			case rep.Created > 0:
				fmt.Fprintf(c.stderr, "stopped after %d of %d rows (%d links created)\n", len(rep.Results), rep.Rows, rep.Created)
			}
			// A script learns the codes the rows before the stop got,
			// and why the rest got none.
			if c.json() {
				out := reportJSON(rep)
				out.Stopped = errorText(err)
				if werr := writeJSONValue(c.stdout, out); werr != nil {
					return werr
				}
			}
			return err
		}
		if c.json() {
			err = writeJSONValue(c.stdout, reportJSON(rep))
		} else {
			err = printReport(c.stdout, rep)
		}
		if err == nil && rep.Failed > 0 {
			err = &rowsFailedError{failed: rep.Failed, rows: rep.Rows}
		}
		return err
	}
}

// rowsFailedError is an import that went through its file but whose
// failed rows got no link: exit status 3, so a script tells it from a
// complete import without reading the report.
type rowsFailedError struct{ failed, rows int }

func (e *rowsFailedError) Error() string {
	return fmt.Sprintf("%d of %d rows got no link (see the report)", e.failed, e.rows)
}

// importRows imports rows in chunks of batch rows, one linkimport.Import
// each (so a chunk's refused aliases are retried before the next chunk),
// printing a progress line on stderr per chunk.
func (c *cli) importRows(gw *gateway, rows []linkimport.Row, batch int) (linkimport.Report, error) {
	create := func(ctx context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		var resp shortenerv1.BatchCreateLinksResponse
		// A refusal that says nothing was created (a quota spent by the
		// lookups, another import of the tenant holding the bulk slots)
		// waits its Retry-After and sends the same rows again; anything
		// whose outcome is unknown is not sent again.
		var err error
		for waits := 0; ; waits++ {
			_, err = gw.callProto(ctx, "POST", "/v1/links:batch", nil, &shortenerv1.BatchCreateLinksRequest{Requests: reqs}, &resp)
			again, werr := c.waitOut(ctx, err, waits, batchRefusedUndone)
			if werr != nil {
				return nil, werr
			}
			if !again {
				break
			}
		}
		if err != nil {
			// A batch larger than the tenant's quota holds at once: as
			// the shortener says it, so Import sends smaller ones.
			var ae *apiError
			if errors.As(err, &ae) {
				switch reason, meta := ae.info(); {
				case reason == "BATCH_SIZE_INVALID" && meta["max_batch"] != "":
					return nil, rpcerr.BadRequestWith("requests", reason, ae.Message, map[string]string{"max_batch": meta["max_batch"]})
				case reason == rpcerr.ReasonRateLimited:
					// So Import reports the rows an earlier run made.
					return nil, quotaRefusal{ae}
				}
			}
			return nil, err
		}
		return &resp, nil
	}
	// A code the caller already holds for the row's URL is an earlier
	// import's link: importing a file again creates nothing twice. Each
	// lookup is an API call, charged to the key's quota: one refused waits
	// the Retry-After and asks again, or a file sent again on a small plan
	// would stop at its first rows every time.
	lookup := func(ctx context.Context, domain, code string) (*shortenerv1.Link, bool, error) {
		var link shortenerv1.Link
		var q url.Values
		if domain != "" {
			q = url.Values{"domain": {domain}}
		}
		for waits := 0; ; waits++ {
			_, err := gw.callProto(ctx, "GET", "/v1/links/"+url.PathEscape(code), q, nil, &link)
			if err == nil {
				return &link, true, nil
			}
			var ae *apiError
			if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
				return nil, false, nil
			}
			again, werr := c.waitOut(ctx, err, waits, lookupRefused)
			if werr != nil {
				return nil, false, werr
			}
			if !again {
				return nil, false, err
			}
		}
	}
	total := linkimport.Report{Rows: len(rows)}
	for start := 0; start < len(rows); start += batch {
		chunk := rows[start:min(start+batch, len(rows))]
		rep, err := linkimport.ImportWith(c.ctx, chunk, create, lookup, nil)
		total.Created += rep.Created
		total.Existing += rep.Existing
		total.AliasesKept += rep.AliasesKept
		total.Failed += rep.Failed
		total.Results = append(total.Results, rep.Results...)
		if err != nil {
			return total, err
		}
		fmt.Fprintf(c.stderr, "imported %d/%d rows (%d created, %d failed)\n",
			start+len(chunk), len(rows), total.Created, total.Failed)
	}
	return total, nil
}

// importResultJSON is one row's outcome in -o json.
type importResultJSON struct {
	Row        int            `json:"row"`
	SourceCode string         `json:"sourceCode,omitempty"`
	Code       string         `json:"code,omitempty"`
	ShortURL   string         `json:"shortUrl,omitempty"`
	AliasKept  bool           `json:"aliasKept"`
	Existing   bool           `json:"existing,omitempty"`
	Error      *itemErrorJSON `json:"error,omitempty"`
}

// itemErrorJSON is why a row got no link.
type itemErrorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// importReportJSON is the import's outcome in -o json.
type importReportJSON struct {
	Format      string `json:"format"`
	Rows        int    `json:"rows"`
	Created     int    `json:"created"`
	AliasesKept int    `json:"aliasesKept"`
	Existing    int    `json:"existing,omitempty"`
	Failed      int    `json:"failed"`
	// Stopped says why the import stopped before its last row (an
	// error of the gateway's), with Results holding the rows before.
	Stopped string             `json:"stopped,omitempty"`
	Results []importResultJSON `json:"results"`
}

func reportJSON(rep linkimport.Report) importReportJSON {
	out := importReportJSON{Format: string(rep.Format), Rows: rep.Rows, Created: rep.Created,
		AliasesKept: rep.AliasesKept, Existing: rep.Existing, Failed: rep.Failed, Results: []importResultJSON{}}
	for _, r := range rep.Results {
		res := importResultJSON{Row: r.Row, SourceCode: r.SourceCode, Code: r.Code, ShortURL: r.ShortURL, AliasKept: r.AliasKept, Existing: r.Existing}
		if r.Err != nil {
			res.Error = &itemErrorJSON{Code: r.Err.GetCode(), Message: r.Err.GetMessage(), Field: r.Err.GetField()}
		}
		out.Results = append(out.Results, res)
	}
	return out
}

// printReport summarises an import, then lists the rows that failed.
func printReport(w io.Writer, rep linkimport.Report) error {
	existing := ""
	if rep.Existing > 0 {
		existing = fmt.Sprintf(", %d imported before", rep.Existing)
	}
	fmt.Fprintf(w, "imported %d rows of a %s export: %d created (%d kept their code)%s, %d failed\n",
		rep.Rows, rep.Format, rep.Created, rep.AliasesKept, existing, rep.Failed)
	if rep.Failed == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LINE\tSOURCE CODE\tERROR")
	for _, r := range rep.Results {
		if r.Err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%s: %s\n", r.Row, orDash(r.SourceCode), r.Err.GetCode(), r.Err.GetMessage())
		}
	}
	return tw.Flush()
}
