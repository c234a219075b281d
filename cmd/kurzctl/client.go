package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"kurz.dev/pkg/buildinfo"
	"kurz.dev/pkg/textcut"
)

// maxErrorBody bounds what is read of an error answer, maxAnswerBody of
// any other: a page of 1,000 links with rules and variants is a few MiB,
// and a gateway (or whatever answers in its place) sending more must not
// take the machine's memory.
const maxErrorBody = 64 << 10

var maxAnswerBody = 64 << 20 // a variable for the test

// credential is what a call authenticates with.
type credential int

const (
	// apiKeyAuth sends the tenant's API key when there is one (the
	// gateway refuses or acts as "anonymous" without).
	apiKeyAuth credential = iota
	// adminAuth sends the admin token, which must be set.
	adminAuth
)

// apiError is the gateway's error answer, an RFC 9457 problem detail.
type apiError struct {
	Status       int    `json:"-"`
	Code         string `json:"code"`
	Message      string `json:"detail"`
	RequestID    string `json:"requestId"`
	RetryAfterMS int64  `json:"retryAfterMs"`
	// Reason is the problem's own reason (the gateway's refusals, such
	// as its rate limit's, carry no ErrorInfo detail).
	Reason string `json:"reason"`
	// Details are the error's google.rpc details; kurzctl reads the
	// ErrorInfo's reason and metadata.
	Details []struct {
		Type     string            `json:"@type"`
		Reason   string            `json:"reason"`
		Metadata map[string]string `json:"metadata"`
	} `json:"details"`
}

// info returns the reason and metadata of e's ErrorInfo, or the problem's
// own reason without one ("" without either).
func (e *apiError) info() (string, map[string]string) {
	for _, d := range e.Details {
		if strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") {
			return d.Reason, d.Metadata
		}
	}
	return e.Reason, nil
}

func (e *apiError) Error() string {
	msg := e.Message
	if e.RetryAfterMS > 0 && !strings.Contains(msg, "retry after") {
		msg += fmt.Sprintf(" (retry after %s)", time.Duration(e.RetryAfterMS)*time.Millisecond)
	}
	return msg
}

// gateway calls the gateway's JSON API.
type gateway struct {
	base string
	auth string // the Authorization value; "" sends none
	http *http.Client
	// withheld is the context whose API key was not sent to base.
	withheld string
	// idempotencyKey, when set, goes out as every request's Idempotency-Key
	// (links create --idempotency-key).
	idempotencyKey string
	// ifMatch, when set, goes out as the request's If-Match: the entity
	// tag (quoted) of the state a link's change applies to.
	ifMatch string
	// accept, when set, goes out as the request's Accept.
	accept string
}

// gateway returns a client of the gateway with the credential the command
// needs; a missing admin token is a usage error.
func (c *cli) gateway(cmd string, cred credential) (*gateway, error) {
	gw := &gateway{base: c.g.url, http: &http.Client{Timeout: c.g.timeout, CheckRedirect: noRedirects}, withheld: c.g.withheldKey}
	switch cred {
	case adminAuth:
		if c.g.adminToken == "" {
			if c.g.withheldToken != "" {
				return nil, usagef(cmd, "the admin API needs the admin token: set --admin-token or %s (context %q's token is only sent to its own URL, not %s)", adminTokenEnv, c.g.withheldToken, c.g.url)
			}
			return nil, usagef(cmd, "the admin API needs the admin token: set --admin-token or %s (the gateway's variable), or a context's admin-token", adminTokenEnv)
		}
		if c.g.adminTokenAlias {
			fmt.Fprintf(c.stderr, "kurzctl: %s is deprecated: name the admin token %s, as the gateway does\n", deprecatedAdminTokenEnv, adminTokenEnv)
		}
		gw.auth = "Bearer " + c.g.adminToken
	case apiKeyAuth:
		if c.g.apiKey != "" {
			gw.auth = "Bearer " + c.g.apiKey
		}
	}
	if gw.auth != "" {
		what := "API key"
		if cred == adminAuth {
			what = "admin token"
		}
		if err := c.keepOffPlainHTTP(cmd, what); err != nil {
			return nil, err
		}
	}
	return gw, nil
}

// keepOffPlainHTTP refuses to send what (a credential, a link's password:
// any secret a request carries) to a gateway over plain http on another
// machine, unless --plain-http (KURZ_PLAIN_HTTP, the context's plain-http)
// says the network is trusted.
func (c *cli) keepOffPlainHTTP(cmd, what string) error {
	if c.g.plainHTTP || !exposes(c.g.url) {
		return nil
	}
	return usagef(cmd, "refusing to send the %s to %s over plain http, where anyone on the way reads it: use the gateway's https URL, or --plain-http (%s=true, or the context's plain-http) on a network you trust", what, c.g.url, plainHTTPEnv)
}

// noRedirects leaves a 3xx answer as it is: the API never redirects, and
// following one would send the credential and the body (a password) where
// the answer points, over plain http or to another port of the same host
// (net/http keeps Authorization when only the scheme or port changes).
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// errStalled ends a streamed answer that paused longer than --timeout.
var errStalled = errors.New("stalled")

// sendStream is send for an answer whose body may take longer than
// --timeout to arrive in full (links export streams a tenant's every
// link): --timeout bounds the wait for the answer, then every pause in its
// body, not the whole transfer, as curl's --speed-time does.
func (gw *gateway) sendStream(ctx context.Context, method, path string, query url.Values) (io.ReadCloser, error) {
	idle := gw.http.Timeout
	ctx, cancel := context.WithCancelCause(ctx)
	sr := &streamReader{ctx: ctx, cancel: cancel, idle: idle, base: gw.base}
	if idle > 0 {
		sr.timer = time.AfterFunc(idle, func() { cancel(errStalled) })
	}
	client := *gw.http
	client.Timeout = 0
	streaming := *gw
	streaming.http = &client
	resp, err := streaming.send(ctx, method, path, query, nil, "")
	if err != nil {
		sr.stop()
		if context.Cause(ctx) == errStalled {
			return nil, fmt.Errorf("the gateway at %s did not answer in time (--timeout)", gw.base)
		}
		return nil, err
	}
	sr.body = resp.Body
	return sr, nil
}

// streamReader reads a streamed answer, cancelling it once no byte has
// arrived for idle.
type streamReader struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer // nil: no bound
	idle   time.Duration
	base   string
	body   io.ReadCloser
}

func (r *streamReader) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	if n > 0 && r.timer != nil {
		r.timer.Reset(r.idle)
	}
	if err != nil && err != io.EOF && context.Cause(r.ctx) == errStalled {
		err = fmt.Errorf("the gateway at %s sent nothing for %s (--timeout)", r.base, r.idle)
	}
	return n, err
}

func (r *streamReader) Close() error {
	r.stop()
	return r.body.Close()
}

func (r *streamReader) stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
	r.cancel(nil)
}

// send makes one request and returns the response of a 2xx answer, whose
// body the caller must close; other answers become *apiError.
func (gw *gateway) send(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := gw.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if gw.auth != "" {
		req.Header.Set("Authorization", gw.auth)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("User-Agent", "kurzctl/"+buildinfo.Version)
	if gw.idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", gw.idempotencyKey)
	}
	if gw.ifMatch != "" {
		req.Header.Set("If-Match", gw.ifMatch)
	}
	if gw.accept != "" {
		req.Header.Set("Accept", gw.accept)
	}
	resp, err := gw.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var uerr *url.Error
		if errors.As(err, &uerr) && uerr.Timeout() {
			return nil, fmt.Errorf("the gateway at %s did not answer in time (--timeout)", gw.base)
		}
		return nil, fmt.Errorf("cannot reach the gateway at %s (set --url or KURZ_URL): %w", gw.base, unwrapURLError(err))
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var problem apiError
	if json.Unmarshal(raw, &problem) == nil && problem.Message != "" {
		problem.Status = resp.StatusCode
		switch {
		case resp.StatusCode != http.StatusUnauthorized || gw.auth != "":
		case gw.withheld != "":
			problem.Message += fmt.Sprintf(" (context %q's API key is only sent to its own URL, not %s: set --api-key or KURZ_API_KEY)", gw.withheld, gw.base)
		default:
			problem.Message += " (set --api-key or KURZ_API_KEY)"
		}
		return nil, &problem
	}
	text := textcut.Echo(strings.TrimSpace(string(raw)), 200)
	if text == "" {
		text = http.StatusText(resp.StatusCode)
	}
	return nil, &apiError{Status: resp.StatusCode, Code: http.StatusText(resp.StatusCode), Message: fmt.Sprintf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, text)}
}

// unwrapURLError drops net/url's "Get "http://...": " prefix, which the
// message says already.
func unwrapURLError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

// call makes one request with an optional JSON body and returns the whole
// answer's body.
func (gw *gateway) call(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	raw, _, err := gw.callStatus(ctx, method, path, query, body)
	return raw, err
}

// callStatus is call that returns the answer's status code too.
func (gw *gateway) callStatus(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, int, error) {
	var rd io.Reader
	ctype := ""
	if body != nil {
		rd, ctype = bytes.NewReader(body), "application/json"
	}
	resp, err := gw.send(ctx, method, path, query, rd, ctype)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	raw, err := readAnswer(resp, method, path)
	if err != nil {
		return nil, 0, err
	}
	return raw, resp.StatusCode, nil
}

// readAnswer reads the whole body of the answer to method path, refusing
// one larger than maxAnswerBody.
func readAnswer(resp *http.Response, method, path string) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxAnswerBody)+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if len(raw) > maxAnswerBody {
		return nil, fmt.Errorf("%s %s: the answer is larger than %d MiB; not read", method, path, maxAnswerBody>>20)
	}
	return raw, nil
}

// readInput reads the file name (- for stdin) a command was given, at
// most max bytes: a larger one is refused, not cut.
func (c *cli) readInput(cmd, name string, max int) ([]byte, error) {
	var r io.Reader = c.stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, usagef(cmd, "%v", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > max {
		return nil, usagef(cmd, "%s is over %d bytes, the most %s reads", name, max, cmd)
	}
	return b, nil
}

// callProto sends req (nil: no body) in proto JSON and decodes the answer
// into resp; it returns the answer's raw JSON too, for -o json.
func (gw *gateway) callProto(ctx context.Context, method, path string, query url.Values, req, resp proto.Message) ([]byte, error) {
	raw, _, err := gw.callProtoStatus(ctx, method, path, query, req, resp)
	return raw, err
}

// callProtoStatus is callProto that returns the answer's status code too.
func (gw *gateway) callProtoStatus(ctx context.Context, method, path string, query url.Values, req, resp proto.Message) ([]byte, int, error) {
	var body []byte
	if req != nil {
		var err error
		if body, err = protojson.Marshal(req); err != nil {
			return nil, 0, fmt.Errorf("encode request: %w", err)
		}
	}
	raw, status, err := gw.callStatus(ctx, method, path, query, body)
	if err != nil {
		return nil, 0, err
	}
	if resp != nil {
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, resp); err != nil {
			return nil, 0, fmt.Errorf("%s %s: the answer is not the expected JSON: %w", method, path, err)
		}
	}
	return raw, status, nil
}

// writeRaw writes an answer's JSON as one line.
func writeRaw(w io.Writer, raw []byte) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return fmt.Errorf("the answer is not JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// writeJSONValue writes v as one line of JSON.
func writeJSONValue(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// writeProtoJSON writes m as the gateway would: proto JSON with default
// values, on one line.
func writeProtoJSON(w io.Writer, m proto.Message) error {
	raw, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	return writeRaw(w, raw)
}

// unmarshalProto decodes an answer's proto JSON, ignoring fields this
// kurzctl does not know (a newer gateway's).
func unmarshalProto(raw []byte, m proto.Message) error {
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, m); err != nil {
		return fmt.Errorf("the answer is not the expected JSON: %w", err)
	}
	return nil
}
