package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// mapping serves a route that is an RPC the protos map to HTTP
// (google.api.http) through grpc-gateway's generated handler (gen/kurz/...
// *.pb.gw.go): the generated code turns path, query and body into the
// request message and calls the service; the gateway keeps what is its own
// around it: admission (route.access), the query check (route.query), the
// body bounds, the call's tenant metadata and timeout, the success status
// and the problem+json errors. The zero mapping is a plain route: a body
// (POST, PUT, PATCH) of up to Options.MaxBodyBytes, 200 with the response.
type mapping struct {
	// bulkBody, when set, makes the route a bulk one: a body of up to
	// max(bulkBody, Options.MaxBodyBytes), one larger than
	// Options.MaxBodyBytes (or of undeclared length) taking one of the bulk
	// slots (Options.MaxBulkRequests) before it is read (admitBulk), and
	// batchCallFactor call timeouts.
	bulkBody int64
	// body, when set, is the route's body bound where larger than
	// Options.MaxBodyBytes, for a body that is not bulk work (it takes no
	// bulk slot, and the call timeout is the usual one).
	body int64
	// before checks the request before the mapping reads it: the body as
	// read, and the query parameters the mapping will see, which it may
	// change (the PATCH update mask, the stats interval's short names).
	before func(c *call, body []byte, q url.Values) error
	// status is the success status (0: 200); 204 sends no body.
	status int
	// location gives the Location header of a success from the response.
	location func(resp proto.Message) string
	// noBody: the RPC's mapping takes no body (a POST action such as
	// verify); an empty body is fine, and a body is ignored.
	noBody bool
	// existed, when set, reports a response that created nothing (a create
	// that found its link): 200 instead of status.
	existed func(resp proto.Message) bool
	// idempotent: the route takes an Idempotency-Key header (idempotency.go).
	idempotent bool
	// etag gives the entity tag of a success from the response (quoted;
	// "" for none): sent as ETag, and a GET's If-Match and If-None-Match
	// are evaluated against it (conditional.go).
	etag func(resp proto.Message) string
	// conditional: the route's write takes If-Match, which its service
	// checks; on other writes If-Match is refused.
	conditional bool
}

// pathChecks refuse path parameters (by name) that cannot be valid, before
// a service sees them.
var pathChecks = map[string]func(c *call) error{
	"code": func(c *call) error { _, err := pathCode(c); return err },
	"name": func(c *call) error { _, err := pathDomain(c); return err },
	// A webhook subscription's id, and on its deliveries' routes the
	// delivery's.
	"id":        func(c *call) error { _, err := pathWebhookID(c, "id"); return err },
	"webhookId": func(c *call) error { _, err := pathWebhookID(c, "webhookId"); return err },
}

// requestChecks are checks on a decoded request body, by message: what
// the gateway refuses before a service is asked.
var requestChecks = map[protoreflect.FullName]func(proto.Message) error{
	(&shortenerv1.BatchCreateLinksRequest{}).ProtoReflect().Descriptor().FullName(): func(m proto.Message) error {
		if n := len(m.(*shortenerv1.BatchCreateLinksRequest).GetRequests()); n == 0 || n > maxBatchItems {
			return fmt.Errorf(`"requests" must hold 1 to %d links; it holds %d: split larger batches`, maxBatchItems, n)
		}
		return nil
	},
	(&analyticsv1.GetLinksClickCountsRequest{}).ProtoReflect().Descriptor().FullName(): func(m proto.Message) error {
		if n := len(m.(*analyticsv1.GetLinksClickCountsRequest).GetLinks()); n == 0 || n > maxClickCountsLinks {
			return fmt.Errorf(`"links" must name 1 to %d links; it names %d`, maxClickCountsLinks, n)
		}
		return nil
	},
}

// rpcMux is the generated handlers of every mapped RPC, over the API's
// clients, built once.
func (a *API) rpcMux() *runtime.ServeMux {
	a.muxOnce.Do(func() {
		mux := runtime.NewServeMux(
			runtime.WithMarshalerOption(runtime.MIMEWildcard, protoMarshaler{}),
			runtime.WithErrorHandler(func(ctx context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, _ http.ResponseWriter, r *http.Request, err error) {
				// The service's status, or the mapping's own refusal of the
				// path, query or body (INVALID_ARGUMENT with protoMarshaler's
				// message): toAPIError's answer either way.
				outcomeOf(r).err = toAPIError(err)
			}),
			runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, _ http.ResponseWriter, r *http.Request, code int) {
				// The route table sent the request here, so the annotations
				// must map its method and path: a mismatch is our fault.
				outcomeOf(r).err = internalError(fmt.Errorf("no google.api.http mapping for %s %s (HTTP %d)", r.Method, r.URL.Path, code))
			}),
			runtime.WithForwardResponseOption(func(ctx context.Context, _ http.ResponseWriter, m proto.Message) error {
				if o, ok := ctx.Value(outcomeKey{}).(*outcome); ok {
					o.resp = m.ProtoReflect().Interface()
				}
				return nil
			}),
			// Nothing of the client's request reaches a service as metadata,
			// nothing of a service's answer as a header: mapped calls carry
			// exactly what downstream() attaches.
			runtime.WithIncomingHeaderMatcher(func(string) (string, bool) { return "", false }),
			runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
			runtime.WithOutgoingTrailerMatcher(func(string) (string, bool) { return "", false }),
			runtime.WithDisableHTTPMethodOverride(),
		)
		ctx := context.Background()
		errs := []error{shortenerv1.RegisterShortenerServiceHandlerClient(ctx, mux, a.shortener)}
		if a.analytics != nil {
			errs = append(errs, analyticsv1.RegisterAnalyticsServiceHandlerClient(ctx, mux, a.analytics))
		}
		if a.webhooks != nil {
			errs = append(errs, shortenerv1.RegisterWebhookServiceHandlerClient(ctx, mux, a.webhooks))
		}
		if err := errors.Join(errs...); err != nil {
			panic(fmt.Sprintf("httpapi: register the mapped RPCs: %v", err)) // only with a nil mux
		}
		a.mux = mux
	})
	return a.mux
}

// outcome is what the generated handler left of one call: the error it
// met, or the response message it forwarded.
type outcome struct {
	err  error
	resp proto.Message
}

type outcomeKey struct{}

func outcomeOf(r *http.Request) *outcome {
	if o, ok := r.Context().Value(outcomeKey{}).(*outcome); ok {
		return o
	}
	return &outcome{}
}

// serveMapped returns the handler of a mapped route.
func (a *API) serveMapped(pattern string, m mapping) func(c *call) error {
	var params []string
	for name := range pathChecks {
		if strings.Contains(pattern, "{"+name+"}") {
			params = append(params, name)
		}
	}
	return func(c *call) error {
		for _, name := range params {
			if err := pathChecks[name](c); err != nil {
				return err
			}
		}
		timeout, limit := a.opts.CallTimeout, max(a.opts.MaxBodyBytes, m.body)
		if m.body > a.opts.MaxBodyBytes && m.bulkBody == 0 {
			// Paced as a bulk body is: without a slot to bound them, a
			// key's calls trickling 400,000-byte bodies for ReadTimeout
			// (30 s) each held up to 6 times the heap of the usual
			// bound's, 1.6 GB over the listener's 4,096 connections.
			c.r.Body = &pacedBody{ReadCloser: c.r.Body, rc: http.NewResponseController(c.w), start: time.Now(), most: a.opts.ReadTimeout}
		}
		if m.bulkBody > 0 {
			// A body of up to Options.MaxBodyBytes takes no slot, and is
			// read with that bound (admitBulk).
			release, bound, err := a.admitBulk(c, max(limit, m.bulkBody))
			if err != nil {
				return err
			}
			defer release()
			limit = bound
			timeout = batchCallFactor * a.opts.CallTimeout
			extendWriteDeadline(c.w, timeout)
		}
		var body []byte
		switch c.r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			if m.noBody {
				break
			}
			b, err := a.readBodyUpTo(c, limit, "send a JSON object")
			if err != nil {
				return err
			}
			body = b
		}
		if m.bulkBody > 0 {
			// A bulk body may take long to arrive: a key revoked or a
			// tenant suspended meanwhile makes nothing.
			if err := a.readmit(c); err != nil {
				return err
			}
		}
		q := c.r.URL.Query()
		if m.before != nil {
			if err := m.before(c, body, q); err != nil {
				return err
			}
		}

		ctx, cancel := a.downstreamFor(c, timeout)
		defer cancel()
		o := &outcome{}
		ctx = context.WithValue(ctx, outcomeKey{}, o)
		// The generated handler sees method, path, query and body only: no
		// header (grpc-gateway would pass Authorization and others on as
		// metadata, and honour Grpc-Timeout), no host or peer address
		// (x-forwarded-* metadata).
		r := c.r.Clone(ctx)
		r.Header, r.Host, r.RemoteAddr = http.Header{}, "", ""
		if r.Method == http.MethodHead {
			r.Method = http.MethodGet
		}
		r.URL.RawQuery = q.Encode()
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		out := &captured{header: http.Header{}}
		a.rpcMux().ServeHTTP(out, r)
		switch {
		case o.err != nil:
			return o.err
		case out.status != 0 && out.status != http.StatusOK:
			return internalError(fmt.Errorf("the mapped handler answered %d", out.status))
		}
		if m.location != nil && o.resp != nil {
			c.w.Header().Set("Location", m.location(o.resp))
		}
		if m.etag != nil && o.resp != nil {
			if tag := m.etag(o.resp); tag != "" {
				if r.Method == http.MethodGet {
					notModified, err := checkRead(c.r, tag, "the link")
					if err != nil {
						return err
					}
					if notModified {
						// The headers the 200 would have carried that
						// describe it (RFC 9110, 15.4.5).
						c.w.Header().Set("ETag", tag)
						c.w.Header().Set("Cache-Control", "no-store")
						c.w.WriteHeader(http.StatusNotModified)
						return nil
					}
				}
				c.w.Header().Set("ETag", tag)
			}
		}
		status := http.StatusOK
		if m.status != 0 {
			status = m.status
		}
		if m.existed != nil && o.resp != nil && m.existed(o.resp) {
			status = http.StatusOK
		}
		if status == http.StatusNoContent {
			c.w.WriteHeader(status)
			return nil
		}
		send(c.w, status, "application/json", out.body.Bytes())
		return nil
	}
}

// captured keeps what the generated handler writes: the body, which
// protoMarshaler made, and the status; its headers are dropped.
type captured struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *captured) Header() http.Header         { return w.header }
func (w *captured) Write(b []byte) (int, error) { return w.body.Write(b) }
func (w *captured) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

// protoMarshaler is the mapped routes' JSON: bodies read as decodeProto
// reads them (its errors, the requestChecks), answers written by
// marshalProto.
type protoMarshaler struct{}

func (protoMarshaler) ContentType(any) string { return "application/json" }

func (protoMarshaler) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a proto message", v)
	}
	return marshalProto(m)
}

// Unmarshal reads data into v, a proto message or a pointer to a message
// field (the generated code decodes a body field so). The error's text is
// what the client is told.
func (protoMarshaler) Unmarshal(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return io.EOF
	}
	m, ok := v.(proto.Message)
	if !ok {
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Pointer {
			return fmt.Errorf("unmarshal into %T: not a proto message", v)
		}
		if rv.Elem().IsNil() {
			rv.Elem().Set(reflect.New(rv.Elem().Type().Elem()))
		}
		if m, ok = rv.Elem().Interface().(proto.Message); !ok {
			return fmt.Errorf("unmarshal into %T: not a proto message", v)
		}
	}
	if err := decodeProto(data, m); err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return errors.New(ae.message)
		}
		return err
	}
	if check := requestChecks[m.ProtoReflect().Descriptor().FullName()]; check != nil {
		return check(m)
	}
	return nil
}

func (p protoMarshaler) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		b, err := io.ReadAll(r)
		if err != nil {
			return errors.New("the request body could not be read")
		}
		return p.Unmarshal(b, v)
	})
}

func (p protoMarshaler) NewEncoder(w io.Writer) runtime.Encoder {
	return runtime.EncoderFunc(func(v any) error {
		b, err := p.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	})
}
