package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/buildinfo"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/textcut"
)

// The YOURLS-compatible API (POST /yourls-api.php, and /yourls-api): the
// actions shorturl, expand, url-stats and version of YOURLS's
// yourls-api.php, with its parameters and its answers, so that the tools
// people point at a YOURLS install (ShareX, browser extensions, WordPress
// plugins, scripts) keep working against kurz with another base URL. The
// signature is a kurz API key. Deviations from YOURLS, each for a reason
// (docs/api.md, YOURLS-compatible API): POST only, with the parameters in
// the body, since a key in a URL is kept by proxies and access logs; no
// username/password and no time-limited md5 signatures, since kurz keeps
// its keys hashed and cannot compute one; formats json and simple only.

// yourlsBodyBytes bounds a YOURLS API request's body: a form of a URL, a
// keyword, a title and a key is far smaller.
const yourlsBodyBytes = 16 << 10

// yourlsRoute is the route both paths of the API are charged as when a
// call mirrors no kurz route (version, a refused action): one counter for
// a rule on the route, whichever path a client calls.
const yourlsRoute = "POST /yourls-api.php"

// yourlsDate is YOURLS's date format (MySQL's DATETIME), in UTC.
const yourlsDate = "2006-01-02 15:04:05"

// yourlsParams are the parameters the API reads; others are ignored, as
// YOURLS ignores them (tools send their own).
var yourlsParams = []string{"action", "format", "signature", "url", "keyword", "title", "shorturl",
	"username", "password", "timestamp", "hash"}

// yourlsPath reports whether path is the YOURLS API's.
func yourlsPath(path string) bool { return path == "/yourls-api.php" || path == "/yourls-api" }

// yourlsError is a refusal in YOURLS's shape: its code ("error:keyword"),
// over the kurz error whose status and message it carries.
type yourlsError struct {
	code string
	err  error
}

func (e *yourlsError) Error() string { return e.code + ": " + e.err.Error() }
func (e *yourlsError) Unwrap() error { return e.err }

// yourlsAPI serves one YOURLS API call. Every answer, refusals included,
// is in YOURLS's shape and format, with the HTTP status YOURLS's
// statusCode or errorCode says.
func (a *API) yourlsAPI(c *call) error {
	format := "json"
	if err := a.yourlsCall(c, &format); err != nil {
		a.yourlsFail(c, format, err)
	}
	return nil
}

func (a *API) yourlsCall(c *call, format *string) error {
	if c.r.URL.RawQuery != "" {
		q, _ := url.ParseQuery(c.r.URL.RawQuery)
		if q.Has("signature") {
			return badRequest("the signature (your API key) is in the URL, where proxies and access logs keep it: send every parameter in the POST body (application/x-www-form-urlencoded), and consider this key exposed (revoke it and issue another)")
		}
		return badRequest("send the parameters in the POST body (application/x-www-form-urlencoded), not in the URL")
	}
	p, err := a.yourlsForm(c)
	if err != nil {
		return err
	}
	switch f := p.Get("format"); f {
	case "", "json":
	case "simple":
		*format = f
	case "xml", "jsonp":
		return badRequest(fmt.Sprintf("format %q is not served: ask format=json (the default) or format=simple", f))
	default:
		return badRequest("format must be json (the default) or simple")
	}
	switch {
	case p.Has("username") || p.Has("password"):
		return unauthenticated("username and password are not taken: send a kurz API key as signature", "")
	case p.Has("timestamp") || p.Has("hash"):
		return unauthenticated("time-limited signatures (md5 of timestamp and token) are not taken: kurz keeps API keys hashed and cannot compute one; send the API key itself as signature", "")
	case p.Get("signature") == "":
		return unauthenticated("a signature is required: send a kurz API key as signature in the POST body", "")
	}
	sig := p.Get("signature")
	if err := a.authenticateKey(c, sig, !strings.ContainsAny(sig, " \t"), "the signature must be one kurz API key"); err != nil {
		return err
	}
	action := p.Get("action")
	switch action {
	case "shorturl":
		return a.yourlsShorten(c, *format, p)
	case "expand":
		return a.yourlsExpand(c, *format, p)
	case "url-stats":
		return a.yourlsURLStats(c, *format, p)
	}
	// version, and an action refused after its key was checked, are
	// charged as the API's own route (one for both its paths, yourlsRoute):
	// a valid key must not get unmetered requests (each a key look-up and
	// an answer) by naming no action.
	if err := a.edgeQuota(c, c.charge); err != nil {
		return err
	}
	switch action {
	case "version":
		v := buildinfo.Get().Version
		a.yourlsWrite(c, *format, http.StatusOK, map[string]any{"version": v, "message": "success", "statusCode": 200}, v)
		return nil
	case "":
		return badRequest("action is required: shorturl, expand, url-stats or version")
	}
	// The name is echoed only when it could be one: the rest of a
	// stranger's 16 KiB body is not sent back.
	if len(action) > echoNameBytes {
		return badRequest(fmt.Sprintf("action is not served (a name of %d bytes): kurz answers shorturl, expand, url-stats and version", len(action)))
	}
	return badRequest(fmt.Sprintf("action %q is not served: kurz answers shorturl, expand, url-stats and version", action))
}

// yourlsForm reads the body's parameters: a form, URL-encoded or
// multipart (without files), each parameter at most once and text.
func (a *API) yourlsForm(c *call) (url.Values, error) {
	b, err := a.readBodyUpTo(c, yourlsBodyBytes, "send the parameters as a form: action=shorturl&url=…&signature=<API key>")
	if err != nil {
		return nil, err
	}
	var p url.Values
	ct := c.r.Header.Get("Content-Type")
	mt, params, _ := mime.ParseMediaType(ct)
	if ct != "" && mt == "" {
		// Not taken for a form: its sender meant something by it.
		return nil, badRequest("the Content-Type cannot be read: send the parameters as application/x-www-form-urlencoded (or multipart/form-data)")
	}
	switch mt {
	case "", "application/x-www-form-urlencoded":
		if p, err = url.ParseQuery(string(bytes.TrimSpace(b))); err != nil {
			return nil, badRequest("the form is malformed: " + strings.TrimPrefix(err.Error(), "invalid URL escape "))
		}
	case "multipart/form-data":
		form, err := multipart.NewReader(bytes.NewReader(b), params["boundary"]).ReadForm(yourlsBodyBytes)
		if err != nil {
			return nil, badRequest("the multipart form is malformed")
		}
		defer func() { _ = form.RemoveAll() }()
		if len(form.File) > 0 {
			return nil, badRequest("the form holds a file: send the parameters as plain form fields")
		}
		p = form.Value
	default:
		return nil, badRequest(fmt.Sprintf("Content-Type %q: send the parameters as application/x-www-form-urlencoded (or multipart/form-data)", textcut.Echo(mt, echoNameBytes)))
	}
	for _, name := range yourlsParams {
		switch {
		case len(p[name]) > 1:
			return nil, badParameter(name, fmt.Sprintf("parameter %q is given %d times", name, len(p[name])))
		case len(p[name]) == 1 && !isText(p[name][0]):
			return nil, badParameter(name, fmt.Sprintf("parameter %q must be UTF-8 text without control characters", name))
		}
	}
	return p, nil
}

// yourlsShorten is action shorturl: POST /v1/links's creation, charged as
// that route. Without a keyword the code is derived from the URL
// (CODE_MODE_FROM_URL), so that shortening a URL again finds its link, as
// YOURLS with unique URLs does, and answers as YOURLS does then: status
// fail, code error:url, the existing short URL, statusCode 200 (the
// request's title is not applied then, as in YOURLS). title is the link's
// title; without one the answers show the long URL, as YOURLS does when it
// cannot read the page's title.
func (a *API) yourlsShorten(c *call, format string, p url.Values) error {
	if err := a.edgeQuota(c, "POST /v1/links"); err != nil {
		return err
	}
	long := p.Get("url")
	if strings.TrimSpace(long) == "" {
		return &yourlsError{"error:nourl", badParameter("url", "Missing or malformed URL: url is required")}
	}
	req := &shortenerv1.CreateLinkRequest{LongUrl: yourlsURL(long), Mode: shortenerv1.CodeMode_CODE_MODE_FROM_URL, Title: p.Get("title")}
	if kw := p.Get("keyword"); kw != "" {
		req.Mode, req.CustomAlias = shortenerv1.CodeMode_CODE_MODE_CUSTOM, kw
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.CreateLink(ctx, req)
	switch {
	case err == nil:
	case invalidURL(err):
		return &yourlsError{"error:nourl", err}
	case aliasRefused(err):
		return &yourlsError{"error:keyword", err}
	default:
		return err
	}
	l := resp.GetLink()
	ip := c.st.ip
	out := map[string]any{
		"status": "success", "message": l.GetLongUrl() + " added to database", "title": yourlsTitle(l),
		"shorturl": l.GetShortUrl(), "statusCode": 200,
	}
	if !resp.GetCreated() {
		// The creator's address of an existing link is not kept.
		ip = ""
		out["status"], out["code"], out["message"] = "fail", "error:url", l.GetLongUrl()+" already exists in database"
	}
	out["url"] = map[string]string{"keyword": l.GetCode(), "url": l.GetLongUrl(), "title": yourlsTitle(l),
		"date": l.GetCreateTime().AsTime().UTC().Format(yourlsDate), "ip": ip}
	a.yourlsWrite(c, format, http.StatusOK, out, l.GetShortUrl())
	return nil
}

// yourlsURL is the url of a shorturl as YOURLS reads it: without a scheme
// (example.com/page, as a person pastes it) it is an http URL, which
// YOURLS makes it (yourls_esc_url). The shortener then checks it as any
// other; one with a scheme, even an unknown one, is left as it is.
func yourlsURL(raw string) string {
	s := strings.TrimSpace(raw)
	if u, err := url.Parse(s); err == nil && u.Scheme == "" && !strings.HasPrefix(s, "/") {
		return "http://" + s
	}
	return raw
}

// yourlsTitle is l's title as YOURLS answers it: the long URL when it has
// none.
func yourlsTitle(l *shortenerv1.Link) string {
	if t := l.GetTitle(); t != "" {
		return t
	}
	return l.GetLongUrl()
}

// aliasRefused reports whether the shortener refused the custom alias
// (taken, reserved, invalid): YOURLS's error:keyword.
func aliasRefused(err error) bool {
	e := toAPIError(err)
	return e.status < 500 && (strings.HasPrefix(e.reason, "ALIAS_") || e.status == http.StatusConflict)
}

// yourlsLink finds the caller's link a shorturl parameter names: a short
// URL (on the default domain or one of the tenant's) or a bare keyword.
// Other tenants' links are not found.
func (a *API) yourlsLink(c *call, p url.Values) (*shortenerv1.Link, string, error) {
	s := strings.TrimSpace(p.Get("shorturl"))
	if s == "" {
		return nil, "", badParameter("shorturl", "shorturl is required: a short URL or its keyword")
	}
	code, host := s, ""
	if strings.Contains(s, "/") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return nil, s, yourlsNotFound()
		}
		code, host = strings.TrimPrefix(u.Path, "/"), u.Host
	}
	if !linkcode.Plausible(code) {
		return nil, s, yourlsNotFound()
	}
	l, err := a.linkOnHost(c, code, host)
	if err == nil {
		return l, code, nil
	}
	if st, ok := status.FromError(err); ok && (st.Code() == codes.NotFound || st.Code() == codes.InvalidArgument) {
		return nil, code, yourlsNotFound()
	}
	return nil, code, err
}

// linkOnHost finds the caller's link code on host, a short URL's host: the
// default domain's link when its short URL is on host (or host is ""),
// else the link on the custom domain host. A link of another tenant, or
// on another host, is NOT_FOUND; a host that cannot be a domain may be
// INVALID_ARGUMENT.
func (a *API) linkOnHost(c *call, code, host string) (*shortenerv1.Link, error) {
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err == nil && (host == "" || sameHost(resp.GetLink().GetShortUrl(), host)) {
		return resp.GetLink(), nil
	}
	if host != "" && (err == nil || status.Code(err) == codes.NotFound) {
		resp, err = a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code, Domain: host})
	}
	if err != nil {
		return nil, err
	}
	return resp.GetLink(), nil
}

// sameHost reports whether the short URL s is on host.
func sameHost(s, host string) bool {
	u, err := url.Parse(s)
	return err == nil && strings.EqualFold(u.Host, host)
}

func yourlsNotFound() error {
	return &yourlsError{"error:notfound", notFound("Error: short URL not found")}
}

// yourlsExpand is action expand, charged as GET /v1/links/{code}.
func (a *API) yourlsExpand(c *call, format string, p url.Values) error {
	if err := a.edgeQuota(c, "GET /v1/links/{code}"); err != nil {
		return err
	}
	l, _, err := a.yourlsLink(c, p)
	if err != nil {
		return err
	}
	a.yourlsWrite(c, format, http.StatusOK, map[string]any{
		"keyword": l.GetCode(), "shorturl": l.GetShortUrl(), "longurl": l.GetLongUrl(), "title": yourlsTitle(l),
		"simple": l.GetLongUrl(), "message": "success", "statusCode": 200,
	}, l.GetLongUrl())
	return nil
}

// yourlsURLStats is action url-stats, charged as GET
// /v1/links/{code}/stats: the link's lifetimeCounts, every click counted
// as YOURLS counts them.
func (a *API) yourlsURLStats(c *call, format string, p url.Values) error {
	if err := a.edgeQuota(c, statsRoute); err != nil {
		return err
	}
	l, _, err := a.yourlsLink(c, p)
	if err != nil {
		return err
	}
	counts, err := a.lifetimeCounts(c, l)
	if err != nil {
		return err
	}
	clicks := strconv.FormatInt(counts.GetTotal(), 10)
	a.yourlsWrite(c, format, http.StatusOK, map[string]any{
		"statusCode": 200, "message": "success",
		"link": map[string]string{"shorturl": l.GetShortUrl(), "url": l.GetLongUrl(), "title": yourlsTitle(l),
			"timestamp": l.GetCreateTime().AsTime().UTC().Format(yourlsDate), "ip": "", "clicks": clicks},
	}, clicks)
	return nil
}

// yourlsWrite sends an answer: body as JSON, or simple as text.
func (a *API) yourlsWrite(c *call, format string, code int, body map[string]any, simple string) {
	c.w.Header().Set("Cache-Control", "no-store")
	if format == "simple" {
		send(c.w, code, "text/plain; charset=utf-8", []byte(simple))
		return
	}
	b, err := json.Marshal(body)
	if err != nil {
		a.yourlsFail(c, format, internalError(err))
		return
	}
	send(c.w, code, "application/json", append(b, '\n'))
}

// yourlsFail sends err as YOURLS sends a failure: status fail, a code
// (YOURLS's own where one fits, else error: and kurz's code in lower case),
// the message, errorCode and statusCode the HTTP status; with kurz's
// headers (Retry-After, WWW-Authenticate, the RateLimit fields) and the
// request ID to quote.
func (a *API) yourlsFail(c *call, format string, err error) {
	code := ""
	var ye *yourlsError
	if errors.As(err, &ye) {
		// The kurz error itself: grpc's status.FromError would take a
		// wrapped status's message to be the wrapper's whole text.
		code, err = ye.code, ye.err
	}
	e := a.failure(c, err)
	if code == "" {
		code = "error:" + strings.ToLower(e.code)
	} else if code == "error:keyword" || code == "error:nourl" {
		// YOURLS answers its own refusals 400 (a taken keyword too,
		// which kurz answers 409): tools read its status.
		copied := *e
		copied.status, e = http.StatusBadRequest, &copied
	}
	errorHeaders(c.w.Header(), e)
	body := map[string]any{"status": "fail", "code": code, "message": e.message,
		"errorCode": e.status, "statusCode": e.status, "requestId": c.st.id}
	if e.reason != "" {
		body["reason"] = e.reason
	}
	a.yourlsWrite(c, format, e.status, body, e.message)
}
