package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"kurz.dev/pkg/textcut"
)

// readBody reads the request body up to Options.MaxBodyBytes: larger is a
// 413; an empty one (nothing but whitespace) a 400, or nil when emptyOK.
func (a *API) readBody(c *call, emptyOK bool) ([]byte, error) {
	if emptyOK {
		return a.readBodyUpTo(c, a.opts.MaxBodyBytes, "")
	}
	return a.readBodyUpTo(c, a.opts.MaxBodyBytes, "send a JSON object")
}

// bodyTooLarge is the 413 of a body over max bytes.
func bodyTooLarge(max int64) *apiError {
	return newError(http.StatusRequestEntityTooLarge, codeBodyTooLarge,
		fmt.Sprintf("the request body is larger than %d bytes", max))
}

// readBodyUpTo reads the request body up to max bytes: larger is a 413; an
// empty one (nothing but whitespace) a 400 saying what to send (want), or
// nil when want is "".
func (a *API) readBodyUpTo(c *call, max int64, want string) ([]byte, error) {
	tooLarge := bodyTooLarge(max)
	if c.r.ContentLength > max {
		return nil, tooLarge
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, max))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, tooLarge
	case errors.Is(err, errBulkBodyTooSlow):
		return nil, bulkBodyTooSlow()
	case err != nil:
		return nil, badRequest("the request body could not be read")
	case len(bytes.TrimSpace(b)) == 0 && want != "":
		return nil, badRequest("the request body is empty: " + want)
	case len(bytes.TrimSpace(b)) == 0:
		return nil, nil
	}
	return b, nil
}

// decodeProto reads a JSON body into a proto message with the proto JSON
// names ("longUrl"); unknown fields, wrong types and malformed JSON are a
// 400 whose message names the problem and where it is.
func decodeProto(b []byte, m proto.Message) error {
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(b, m); err != nil {
		return badRequest("invalid JSON body: " + protojsonProblem(err))
	}
	return nil
}

// protojsonProblem strips the library's prefix ("proto:" and a space it
// varies on purpose) from a protojson error; the rest names the line and
// column, and the field or token.
func protojsonProblem(err error) string {
	msg := strings.TrimPrefix(err.Error(), "proto:")
	return textcut.Echo(strings.TrimLeft(msg, " \u00a0"), echoProblemBytes)
}

// Bounds on what a refusal repeats of a stranger's text: protojson names
// an unknown field or a bad token whole, and a key, a form's parameter or
// a media type may be as long as the body (64 KiB). A real field or
// parameter name (the YOURLS API's actions, its plugins' included), a
// media type, or the start of a token, is far shorter.
const (
	echoProblemBytes = 256
	echoNameBytes    = 64
)

// decodeJSON reads a JSON object body into v (a struct with json tags),
// refusing unknown fields and trailing data.
func decodeJSON(b []byte, v any) error {
	// A null decodes into a struct without an error, and leaves it as it was.
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return badRequest("invalid JSON body: the body must be a JSON object, not a JSON null")
	}
	// encoding/json keeps the last of duplicate keys and matches names
	// whatever their case; the protojson routes refuse both, and so do
	// these.
	if problem := keyProblem(b, v); problem != "" {
		return badRequest("invalid JSON body: " + problem)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("invalid JSON body: " + jsonProblem(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("invalid JSON body: unexpected data after the JSON object")
	}
	return nil
}

// keyProblem names a key of the JSON object b that appears twice, or that
// is not exactly the JSON name of a field of the struct v points to; ""
// when there is none, or when b is not an object (Decode says why).
func keyProblem(b []byte, v any) string {
	t := reflect.TypeOf(v)
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return ""
	}
	names := map[string]bool{}
	for f := range t.Elem().Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			names[name] = true
		}
	}
	return objectKeyProblem(b, func(key string) bool { return names[key] })
}

// objectKeyProblem names the first key of the JSON object b that appears
// twice, or that known (nil: any key) does not take; "" when there is
// none, or when b is not an object. Either way the key is echoed bounded:
// it may be as long as the body.
func objectKeyProblem(b []byte, known func(key string) bool) string {
	var problem string
	seen := map[string]bool{}
	eachKey(b, func(key string, dec *json.Decoder) bool {
		switch {
		case seen[key]:
			problem = fmt.Sprintf("field %q appears twice", textcut.Echo(key, echoNameBytes))
		case known != nil && !known(key):
			problem = fmt.Sprintf("unknown field %q", textcut.Echo(key, echoNameBytes))
		default:
			seen[key] = true
			return skipValue(dec)
		}
		return false
	})
	return problem
}

// eachKey walks the keys of the JSON object b in order, calling visit with
// each key and dec at its value; visit reads the value (skipValue when it
// has no use for it) and returns false to stop. A b that is not an object
// visits nothing; malformed JSON stops the walk where it is.
func eachKey(b []byte, visit func(key string, dec *json.Decoder) bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return
	}
	for dec.More() {
		t, err := dec.Token()
		key, ok := t.(string)
		if err != nil || !ok || !visit(key, dec) {
			return
		}
	}
}

// skipValue reads the next JSON value off dec, reporting whether it could.
func skipValue(dec *json.Decoder) bool {
	var v json.RawMessage
	return dec.Decode(&v) == nil
}

func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d: %s", syn.Offset, syn.Error())
	case errors.As(err, &typ) && typ.Field != "":
		return fmt.Sprintf("field %q must be %s, not a JSON %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.As(err, &typ):
		return fmt.Sprintf("the body must be a JSON object, not a JSON %s", typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "the JSON ends too early"
	}
	// "json: unknown field \"x\"" and friends.
	return strings.TrimPrefix(err.Error(), "json: ")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int32", "int64", "uint32", "uint64", "float64":
		return "a number"
	case "map", "struct":
		return "an object"
	case "slice":
		return "an array"
	}
	return goKind
}

// writeJSON sends v as compact JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, "", internalError(err))
		return
	}
	send(w, status, "application/json", append(b, '\n'))
}

// protoJSON is how messages are written: proto JSON names, enums by name,
// scalars even when zero (so "disabled": false is there), unset messages
// left out. marshalProto leaves out Link's input-only password.
var protoJSON = protojson.MarshalOptions{EmitDefaultValues: true}

// marshalProto is m in proto JSON, compacted and with a final newline:
// protojson varies its whitespace on purpose, and clients (and the
// README's examples) deserve stable bytes. Link's input-only password is
// left out.
func marshalProto(m proto.Message) ([]byte, error) {
	if pm := m.ProtoReflect(); pm.IsValid() {
		withoutPasswords(pm)
	}
	raw, err := protoJSON.Marshal(m)
	if err != nil {
		return nil, internalError(fmt.Errorf("marshal %T: %w", m, err))
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, internalError(fmt.Errorf("compact %T: %w", m, err))
	}
	return append(dropEmptyPasswords(buf.Bytes()), '\n'), nil
}

// send writes an answer. A JSON answer (a tenant's links, stats, domains,
// webhooks; an error) is the caller's own data: Cache-Control: no-store,
// so no shared proxy or browser cache keeps it for the next user of the
// machine or the cache, unless the handler chose its caching (the OpenAPI
// document, the same for everyone).
func send(w http.ResponseWriter, status int, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	if isJSON(contentType) && h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// isJSON reports a JSON content type: application/json, or a +json one
// (application/problem+json).
func isJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
