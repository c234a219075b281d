package httpapi

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkimport"
)

// maxBatchItems is the most links one POST /v1/links:batch creates: the
// limit of the shortener's BatchCreateLinks.
const maxBatchItems = linkimport.MaxBatch

// batchBodyBytes bounds the body of POST /v1/links:batch (when larger than
// Options.MaxBodyBytes): maxBatchItems items of up to 4 KiB of JSON (a long
// URL of about 2 KiB, tags, device targets).
const batchBodyBytes = maxBatchItems * 4 << 10

// importBodyBytes bounds the CSV of POST /v1/links:import (when larger than
// Options.MaxBodyBytes): linkimport.MaxRows rows of up to 2 KiB.
const importBodyBytes = linkimport.MaxRows * 2 << 10

// checkBatchItems refuses a batch of more than maxBatchItems items, or with
// an item holding more rules, variants, conditions or values than a link
// carries (linkimport.CheckLists), before protojson reads it: protojson
// builds a message per item first, and a 4 MB body of "{}" items is 1.3
// million messages (~370 MB of heap, seconds of CPU) to refuse. Counting
// stops at the first item over the bound; a body that is not a JSON object
// is left for protojson to describe.
func checkBatchItems(_ *call, body []byte, _ url.Values) error {
	if n := countItems(body, "requests", maxBatchItems); n > maxBatchItems {
		return badRequest(fmt.Sprintf(`"requests" must hold 1 to %d links; it holds more than %d: split larger batches`, maxBatchItems, maxBatchItems))
	}
	// The same holds for the lists inside an item: a 4 MB batch of one
	// item with 1.3 million "{}" variants took ~190 MB to decode here, and
	// its gRPC message 128 MiB in the shortener, before the shortener's
	// bound of 10 refused it.
	if err := linkimport.CheckLists(body, ""); err != nil {
		return badRequest(err.Error())
	}
	return nil
}

// countItems counts the elements of the arrays under field in the JSON
// object body (every occurrence of the key), up to max+1. It returns what
// it counted so far on malformed JSON.
func countItems(body []byte, field string, max int) int {
	n := 0
	eachKey(body, func(key string, dec *json.Decoder) bool {
		if key != field {
			return skipValue(dec)
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return false // not an array: protojson says so
		}
		for dec.More() {
			if n++; n > max || !skipValue(dec) {
				return false
			}
		}
		_, err := dec.Token() // ']'
		return err == nil
	})
	return n
}

// batchCallFactor is how many call timeouts one BatchCreateLinks call may
// take: a batch of 1,000 links does the work of many single creates
// (password hashing, a multi-row insert, a Redis pipeline).
const batchCallFactor = 4

// reasonBulkShareInUse is the reason of the 429 of a tenant's bulk request
// while its bulk requests in progress hold its share of the slots: not a
// quota (RATE_LIMITED), a wait for its own requests to finish.
const reasonBulkShareInUse = "BULK_SHARE_IN_USE"

// reasonBulkSlotsBusy is the 503 of a bulk request refused because every
// bulk slot of the gateway is busy: nothing was created, send it again.
const reasonBulkSlotsBusy = "BULK_SLOTS_BUSY"

// bulkRetryAfter is the Retry-After of a bulk request refused because every
// bulk slot is busy: the requests holding them take seconds.
const bulkRetryAfter = 2 * time.Second

// exportPageSize is how many links the export reads per ListLinks page.
const exportPageSize = 1000

// exportColumns is the header row of GET /v1/links:export.
var exportColumns = []string{
	"code", "short_url", "long_url", "tags", "created_at", "expires_at", "max_visits", "disabled",
	"password_protected", "ios_url", "android_url", "desktop_url", "domain",
	"redirect_type", "rules", "variants", "title",
}

// admitBulk admits a request whose body may hold up to limit bytes, before
// the body is read, and returns the bound to read the body with. A
// declared length over limit is a 413 without taking anything.
//
// A declared length of at most Options.MaxBodyBytes takes nothing either:
// every other route reads a body that large without a slot, so its memory
// is bounded as theirs is, and its body is read with that bound (unpaced,
// as theirs). The slots are for the large bodies, and tenants sending
// large bodies at the pacing rate or faster can hold every slot for up to
// the listener's ReadTimeout: a one-item batch or a small import must not
// wait for them.
//
// A larger or undeclared (chunked) body takes one of the process's bulk
// slots (Options.MaxBulkRequests), and with every slot busy the answer is
// 503 with a Retry-After at once, so that concurrent bulk requests cannot
// hold more memory than the slots'. A tenant already holding its share of
// the slots is answered 429: its bodies cannot keep the other tenants out
// on their own. Its body is paced (pacedBody).
func (a *API) admitBulk(c *call, limit int64) (release func(), bound int64, err error) {
	if c.r.ContentLength > limit {
		return nil, 0, bodyTooLarge(limit)
	}
	if small := min(limit, a.opts.MaxBodyBytes); c.r.ContentLength >= 0 && c.r.ContentLength <= small {
		return func() {}, small, nil
	}
	tenant := c.tenant()
	a.bulkMu.Lock()
	if a.bulkHeld[tenant] >= a.bulkShare {
		a.bulkMu.Unlock()
		e := newError(http.StatusTooManyRequests, codeName(codes.ResourceExhausted),
			fmt.Sprintf("this tenant's large bulk requests (batches and imports whose body is over %d bytes, or of undeclared length) in progress already hold its share of the gateway's bulk slots (%d); nothing was created: retry when one is done, or send smaller requests (a declared Content-Length within that bound), which need no slot", a.opts.MaxBodyBytes, a.bulkShare))
		e.retryAfter, e.reason = bulkRetryAfter, reasonBulkShareInUse
		return nil, 0, e
	}
	a.bulkHeld[tenant]++
	a.bulkMu.Unlock()
	unhold := func() {
		a.bulkMu.Lock()
		if a.bulkHeld[tenant]--; a.bulkHeld[tenant] == 0 {
			delete(a.bulkHeld, tenant)
		}
		a.bulkMu.Unlock()
	}
	// No wait (the gate's is 0): Acquire only fails with ErrBusy.
	freeSlot, err := a.bulk.Acquire(context.Background())
	if err != nil {
		unhold()
		e := newError(http.StatusServiceUnavailable, codeName(codes.Unavailable),
			fmt.Sprintf("the gateway is serving as many large bulk requests (batches and imports whose body is over %d bytes, or of undeclared length) as it can hold; nothing was created: retry shortly, or send smaller requests (a declared Content-Length within that bound), which need no slot", a.opts.MaxBodyBytes))
		e.retryAfter, e.reason = bulkRetryAfter, reasonBulkSlotsBusy
		return nil, 0, e
	}
	c.r.Body = &pacedBody{ReadCloser: c.r.Body, rc: http.NewResponseController(c.w), start: time.Now(), most: a.opts.ReadTimeout}
	return func() { freeSlot(); unhold() }, limit, nil
}

// A bulk request's body must arrive at bulkBodyMinRate or faster, after a
// bulkBodyGrace for the first bytes: its request holds one of the few bulk
// slots meanwhile, and two tenants trickling a byte every 2 s held them
// all, every other tenant answered 503 BULK_SLOTS_BUSY for as long as the
// listener's ReadTimeout (30 s), again and again. A 4 MB batch at the rate
// takes a minute (ReadTimeout cuts it first); a client that slow is far
// below any network a bulk upload runs on.
const bulkBodyMinRate = 64 << 10 // bytes a second

// bulkBodyGrace is a variable for the tests.
var bulkBodyGrace = 5 * time.Second

// errBulkBodyTooSlow is a bulk body's read error once it fell behind
// bulkBodyMinRate; bulkBodyTooSlow is the answer, a 400 (the request as
// sent cannot be served; a 408 would invite the same again), the slot given
// back.
var errBulkBodyTooSlow = errors.New("bulk body too slow")

func bulkBodyTooSlow() *apiError {
	return badRequest(fmt.Sprintf("the request body arrived too slowly: a large body (a batch, an import, the links of click counts) must be sent at %d KiB/s or faster after its first %s; nothing was done: send it again", bulkBodyMinRate>>10, bulkBodyGrace))
}

// pacedBody is a bulk request's body, read with a deadline that moves on
// with the bytes received (bulkBodyMinRate), never past the listener's
// ReadTimeout (most, from admission; 0: no such bound): a body that falls
// behind fails with errBulkBodyTooSlow.
type pacedBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	most  time.Duration
	got   int64
}

func (b *pacedBody) Read(p []byte) (int, error) {
	wait := bulkBodyGrace + time.Duration(b.got)*time.Second/bulkBodyMinRate
	if b.most > 0 {
		wait = min(wait, b.most)
	}
	// A writer without deadlines (a test's recorder) reads unpaced.
	_ = b.rc.SetReadDeadline(b.start.Add(wait))
	n, err := b.ReadCloser.Read(p)
	b.got += int64(n)
	if errors.Is(err, os.ErrDeadlineExceeded) && (b.most <= 0 || wait < b.most) {
		return n, errBulkBodyTooSlow
	}
	return n, err
}

// batchCreate calls BatchCreateLinks with the batch timeout, pushing the
// response's write deadline past it.
func (a *API) batchCreate(c *call, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
	timeout := batchCallFactor * a.opts.CallTimeout
	extendWriteDeadline(c.w, timeout)
	ctx, cancel := a.downstreamFor(c, timeout)
	defer cancel()
	return a.shortener.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: reqs})
}

// extendWriteDeadline gives the response d more (and 10 s of slack) to be
// written, where the server's write timeout would cut a long bulk call.
func extendWriteDeadline(w http.ResponseWriter, d time.Duration) {
	// Not every ResponseWriter can (a test recorder): then the server's
	// own timeout stands.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + 10*time.Second))
}

// exportRoute and importRoute are the patterns of the CSV export and
// import: what their later pages and batches are charged as.
const (
	exportRoute = "GET /v1/links:export"
	importRoute = "POST /v1/links:import"
)

// exportPageWait is the longest an export waits for its key's rules to
// allow its next page (see chargeExportPage): the write deadline is pushed
// past it.
const exportPageWait = maxQueueWait

// exportLinks streams the caller's links (optionally those with ?tag=) as
// CSV, one ListLinks page at a time. The first page is read before anything
// is written, so that a refusal is a proper error answer; a failure after
// that aborts the response, so the client sees a broken transfer rather
// than a short file. The key is checked again before every later page (see
// keyRevoked): an export read slowly runs for as long as its reader likes,
// and a revoked key must not keep reading the tenant's links meanwhile.
// Every later page is charged to the edge quota as the admission charged
// the first (chargeExportPage): an export is exportRoute once per page of
// up to exportPageSize links, as reading them through GET /v1/links is, and
// one whose next page the quota refuses is aborted the same way.
func (a *API) exportLinks(c *call) error {
	req := &shortenerv1.ListLinksRequest{PageSize: exportPageSize, Tag: c.r.URL.Query().Get("tag")}
	page, err := a.listPage(c, req)
	if err != nil {
		return err
	}
	h := c.w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="kurz-links.csv"`)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	c.w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(c.w)
	_ = cw.Write(exportColumns)
	for {
		for _, l := range page.GetLinks() {
			_ = cw.Write(exportRecord(l))
		}
		cw.Flush()
		if err := cw.Error(); err != nil {
			return nil // the client went away
		}
		if page.GetNextPageToken() == "" {
			return nil
		}
		if a.keyRevoked(c) {
			a.log.InfoContext(c.r.Context(), "export aborted: its API key was revoked", "route", c.st.route,
				"request_id", c.st.id, "tenant", c.tenant(), "key_id", c.keyID)
			panic(http.ErrAbortHandler)
		}
		if err := a.chargeExportPage(c); err != nil {
			// The 200 and the pages before are sent: the refusal
			// (its Retry-After) can no longer be told, only that the
			// file is not whole.
			a.log.InfoContext(c.r.Context(), "export aborted: its next page was refused", "route", c.st.route,
				"request_id", c.st.id, "tenant", c.tenant(), "key_id", c.keyID, "err", err)
			panic(http.ErrAbortHandler)
		}
		req.PageToken = page.GetNextPageToken()
		if page, err = a.listPage(c, req); err != nil {
			a.log.WarnContext(c.r.Context(), "export aborted", "route", c.st.route, "request_id", c.st.id, "err", err)
			// net/http's documented way to end a response as failed: the
			// client must not take a partial export for a whole one.
			panic(http.ErrAbortHandler)
		}
	}
}

// chargeExportPage charges an export's next page to the edge quota, as
// exportRoute once, before it is read: charged once, an export read every
// link of the tenant (a ListLinks call per 1,000) for one unit of its key's
// quota, where GET /v1/links, or the Shlink list, pays one per 1,000.
//
// The pages are read far faster than a rule refills (a free key's 1 a
// second), so a key's burst would end every large export at the same page,
// however often it is asked again: a refusal that says to come back within
// exportPageWait is waited out, once, and the page asked for again, so the
// export goes on at the rate the key's rules allow. Any other refusal (a
// longer wait, a second refusal, the client gone) is returned, and the
// export aborted.
func (a *API) chargeExportPage(c *call) error {
	// A queue's turn (maxQueueWait) on each ask, and the wait between.
	extendWriteDeadline(c.w, exportPageWait+2*maxQueueWait)
	err := a.edgeQuotaCost(c, exportRoute, 1)
	var e *apiError
	if !errors.As(err, &e) || e.status != http.StatusTooManyRequests || e.retryAfter > exportPageWait {
		return err
	}
	t := time.NewTimer(e.retryAfter)
	defer t.Stop()
	select {
	case <-c.r.Context().Done():
		return c.r.Context().Err()
	case <-t.C:
	}
	return a.edgeQuotaCost(c, exportRoute, 1)
}

// listPage reads one page of ListLinks, giving the response time to be
// written.
func (a *API) listPage(c *call, req *shortenerv1.ListLinksRequest) (*shortenerv1.ListLinksResponse, error) {
	extendWriteDeadline(c.w, a.opts.CallTimeout)
	ctx, cancel := a.downstream(c)
	defer cancel()
	return a.shortener.ListLinks(ctx, req)
}

// exportRecord is one CSV row of a link: tags joined with '|', times in
// RFC 3339 UTC with their fractions (an expiry comes back exact), no visit
// limit as an empty cell; every cell made safe from spreadsheet formula
// injection.
func exportRecord(l *shortenerv1.Link) []string {
	ts := func(t interface {
		IsValid() bool
		AsTime() time.Time
	}, set bool) string {
		if !set || !t.IsValid() {
			return ""
		}
		return t.AsTime().UTC().Format(time.RFC3339Nano)
	}
	maxVisits := ""
	if l.GetMaxVisits() > 0 {
		maxVisits = strconv.FormatInt(l.GetMaxVisits(), 10)
	}
	dt := l.GetDeviceTargets()
	rec := []string{
		l.GetCode(), l.GetShortUrl(), l.GetLongUrl(), strings.Join(l.GetTags(), "|"),
		ts(l.GetCreateTime(), l.GetCreateTime() != nil), ts(l.GetExpireTime(), l.GetExpireTime() != nil),
		maxVisits, strconv.FormatBool(l.GetDisabled()), strconv.FormatBool(l.GetPasswordProtected()),
		dt.GetIosUrl(), dt.GetAndroidUrl(), dt.GetDesktopUrl(), l.GetDomain(),
		linkimport.RedirectTypeCell(l.GetRedirectType()), linkimport.JSONList(l.GetRules()), linkimport.JSONList(l.GetVariants()),
		l.GetTitle(),
	}
	for i, v := range rec {
		rec[i] = linkimport.DefuseCell(v)
	}
	return rec
}

// importRowsPerCharge is how many rows an import sends to the shortener
// (each a create, and a look-up where its code is taken) for one charge of
// importRoute: as many as a GET /v1/links call reads, and a batch call
// takes.
const importRowsPerCharge = linkimport.MaxBatch

// importResponse is the answer of POST /v1/links:import.
type importResponse struct {
	Format      linkimport.Format `json:"format"`
	Rows        int               `json:"rows"`
	Created     int               `json:"created"`
	AliasesKept int               `json:"aliasesKept"`
	Existing    int               `json:"existing,omitempty"`
	Failed      int               `json:"failed"`
	// Unknown counts the rows of a call that failed without saying
	// whether it made their links (a timeout).
	Unknown int            `json:"unknown,omitempty"`
	Results []importResult `json:"results"`
}

// importResult is one row's outcome.
type importResult struct {
	Row        int        `json:"row"`
	SourceCode string     `json:"sourceCode"`
	Code       string     `json:"code,omitempty"`
	ShortURL   string     `json:"shortUrl,omitempty"`
	AliasKept  bool       `json:"aliasKept"`
	Existing   bool       `json:"existing,omitempty"`
	Unknown    bool       `json:"unknown,omitempty"`
	Error      *itemError `json:"error,omitempty"`
}

// itemError is a row's error, as BatchItemError reads in proto JSON.
type itemError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// importLinks creates the links of a Bitly, YOURLS or kurz CSV export (the
// request body) through BatchCreateLinks, keeping the export's codes where
// they are free kurz aliases (see linkimport.Import). Rows fail on their
// own. When a batch call fails (quota, an outage) after some links were
// created, the answer is still 200: the rows not reached carry that error,
// so the client knows exactly which to send again; when nothing was
// created it is the error itself. A call that timed out may have made its
// links: the answer is 200 with its rows unknown (to be looked up, not sent
// again).
func (a *API) importLinks(c *call) error {
	if ct := c.r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && strings.HasPrefix(mt, "multipart/") {
			return badRequest("send the CSV file itself as the request body (Content-Type: text/csv), not a form")
		}
	}
	release, limit, err := a.admitBulk(c, max(a.opts.MaxBodyBytes, importBodyBytes))
	if err != nil {
		return err
	}
	defer release()
	format, rows, err := linkimport.Parse(http.MaxBytesReader(c.w, c.r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return bodyTooLarge(limit)
	case errors.Is(err, errBulkBodyTooSlow):
		return bulkBodyTooSlow()
	case errors.Is(err, linkimport.ErrRead):
		return badRequest("the request body could not be read")
	case err != nil:
		return badRequest(err.Error())
	case len(rows) == 0:
		return badRequest("the CSV file has a header but no rows: nothing to import")
	}

	var callErr error // the batch call's own error, unwrapped
	// The rows sent to the shortener, and the charges of importRoute paid
	// for them: the admission paid the first.
	sent, paid := 0, 1
	create := func(_ context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		// The body may have taken minutes to arrive, and the batches
		// take a while more: a key revoked or a tenant suspended
		// meanwhile makes nothing more.
		if err := a.readmit(c); err != nil {
			callErr = err
			return nil, err
		}
		// Charged once per importRowsPerCharge rows sent, before they
		// are: each row is a create and, where its code is taken, a
		// look-up (lookup, below), which nothing else charges. Charged
		// once, a file of 10,000 taken codes was 10,000 look-ups (and
		// 20 batch calls) for one unit of the key's quota.
		if owed := (sent + len(reqs) + importRowsPerCharge - 1) / importRowsPerCharge; owed > paid {
			if err := a.edgeQuotaCost(c, importRoute, uint32(owed-paid)); err != nil {
				callErr = err
				return nil, err
			}
			paid = owed
		}
		sent += len(reqs)
		resp, err := a.batchCreate(c, reqs)
		callErr = err
		return resp, err
	}
	// A code the caller already holds for the row's URL is an earlier
	// import's link: an import sent again creates nothing twice.
	lookup := func(_ context.Context, domain, code string) (*shortenerv1.Link, bool, error) {
		ctx, cancel := a.downstream(c)
		defer cancel()
		resp, err := a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code, Domain: domain})
		if status.Code(err) == codes.NotFound {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		return resp.GetLink(), true, nil
	}
	rep, err := linkimport.ImportWith(c.r.Context(), rows, create, lookup, nil)
	var be *linkimport.BatchError
	if err != nil && !errors.As(err, &be) {
		return internalError(err)
	}
	// The rows of a call that timed out (or answered what cannot be read)
	// may have been made: they are reported unknown, not "send again",
	// which would make them twice.
	var unknown map[int]bool
	if be != nil && (callErr == nil || outcomeUnknown(callErr)) {
		unknown = make(map[int]bool, len(be.Lines))
		for _, line := range be.Lines {
			unknown[line] = true
		}
	}
	// A stop that made nothing is the call's error; once rows are in (or
	// were found in from an earlier run, or may be in), the report says
	// which, and the rows not reached carry the error.
	if be != nil && unknown == nil && rep.Created+rep.Existing == 0 {
		return callErr
	}
	out := importResponse{Format: format, Rows: rep.Rows, Created: rep.Created, AliasesKept: rep.AliasesKept,
		Existing: rep.Existing, Failed: rep.Failed, Results: make([]importResult, 0, len(rows))}
	done := make(map[int]linkimport.Result, len(rep.Results))
	for _, r := range rep.Results {
		done[r.Row] = r
	}
	var notReached, inDoubt *itemError
	if be != nil {
		e := toAPIError(callErr)
		if callErr == nil {
			e = newError(http.StatusBadGateway, codeName(codes.Internal), be.Error())
		}
		notReached = &itemError{Code: e.code, Message: "not imported: " + e.message}
		inDoubt = &itemError{Code: e.code, Message: "unknown: " + e.message +
			"; the link may have been made: look it up (its code, or the file's tag) before sending the row again"}
	}
	for _, row := range rows {
		r, ok := done[row.Line]
		switch {
		case !ok && unknown[row.Line]:
			out.Results = append(out.Results, importResult{Row: row.Line, SourceCode: row.SourceCode, Unknown: true, Error: inDoubt})
			out.Unknown++
			continue
		case !ok:
			out.Results = append(out.Results, importResult{Row: row.Line, SourceCode: row.SourceCode, Error: notReached})
			out.Failed++
			continue
		}
		res := importResult{Row: r.Row, SourceCode: r.SourceCode, Code: r.Code, ShortURL: r.ShortURL, AliasKept: r.AliasKept, Existing: r.Existing}
		if r.Err != nil {
			res.Error = &itemError{Code: r.Err.GetCode(), Message: r.Err.GetMessage(), Field: r.Err.GetField()}
		}
		out.Results = append(out.Results, res)
	}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// outcomeUnknown reports whether a failed BatchCreateLinks call may have
// made links: it ran out of time, or broke, after it was sent. A refusal
// (a quota, an invalid batch, a shortener that could not be reached) made
// none, and so did the gateway's own refusal (readmit), never sent.
func outcomeUnknown(err error) bool {
	var ae *apiError
	if errors.As(err, &ae) {
		return false
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal, codes.Aborted, codes.DataLoss:
		return true
	}
	return false
}

// emptyPassword is Link.password as protoJSON writes it once cleared.
var emptyPassword = []byte(`,"password":""`)

var linkName = (&shortenerv1.Link{}).ProtoReflect().Descriptor().FullName()

// withoutPasswords clears the input-only Link.password wherever m holds a
// Link, so that no answer can carry one whatever a service sends.
func withoutPasswords(m protoreflect.Message) {
	if m.Descriptor().FullName() == linkName {
		m.Clear(m.Descriptor().Fields().ByName("password"))
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			for i := range v.List().Len() {
				withoutPasswords(v.List().Get(i).Message())
			}
		default:
			withoutPasswords(v.Message())
		}
		return true
	})
}

// dropEmptyPasswords removes the member "password":"" that protoJSON's
// EmitDefaultValues writes for every (cleared) Link: the field is input
// only. In compact JSON this byte sequence can only be that member: inside
// a string every quote is escaped, and no message of the API has a key
// ending in `\"password`.
func dropEmptyPasswords(b []byte) []byte {
	return bytes.ReplaceAll(b, emptyPassword, nil)
}
