package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// generatedSpec is the Swagger 2.0 document protoc-gen-openapiv2 writes from
// the protos' google.api.http annotations (make gen; make check-gen fails
// when it or the served openapi.json made from it is stale).
const generatedSpec = "../../../../gen/openapi/kurz.swagger.json"

// The RPCs the protos map to HTTP are exactly the route table's mapped
// routes, at the same method and path; the served document gives each the
// status the gateway answers with, the query parameters it takes, and a
// request body where the RPC takes one.
func TestOpenAPIMapsTheAnnotatedRPCs(t *testing.T) {
	raw, err := os.ReadFile(generatedSpec)
	if err != nil {
		t.Fatal(err)
	}
	var gen, served map[string]any
	if err := json.Unmarshal(raw, &gen); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(OpenAPI, &served); err != nil {
		t.Fatal(err)
	}
	genOps := map[string]map[string]any{} // "PATCH /v1/links/{code}" -> generated operation
	for path, item := range obj(gen["paths"]) {
		// grpc-gateway's {link.code} (a field of the body message) is the
		// served {code}.
		path = strings.ReplaceAll(path, "{link.code}", "{code}")
		for method, op := range obj(item) {
			genOps[strings.ToUpper(method)+" "+path] = obj(op)
		}
	}
	if len(genOps) == 0 {
		t.Fatal("the generated spec maps no RPC to HTTP")
	}
	a := newTestAPI(t)
	for _, rt := range a.table() {
		g, annotated := genOps[rt.pattern]
		delete(genOps, rt.pattern)
		switch {
		case rt.rpc == nil && annotated:
			t.Errorf("%s: the protos map %s here, the route table serves it by hand", rt.pattern, g["operationId"])
			continue
		case rt.rpc == nil:
			continue
		case !annotated:
			t.Errorf("%s: a mapped route, but no RPC's google.api.http maps it", rt.pattern)
			continue
		}
		method, path, _ := strings.Cut(rt.pattern, " ")
		op := obj(obj(obj(served["paths"])[path])[strings.ToLower(method)])
		if op == nil {
			t.Errorf("%s: not in openapi.json", rt.pattern)
			continue
		}
		want := http.StatusOK
		if rt.rpc.status != 0 {
			want = rt.rpc.status
		}
		answers := []string{strconv.Itoa(want)}
		if rt.rpc.existed != nil {
			answers = append(answers, strconv.Itoa(http.StatusOK))
		}
		slices.Sort(answers)
		var success []string
		for code := range obj(op["responses"]) {
			if strings.HasPrefix(code, "2") {
				success = append(success, code)
			}
		}
		slices.Sort(success)
		if !slices.Equal(success, answers) {
			t.Errorf("%s: documented success %v, the gateway answers %v", rt.pattern, success, answers)
		}
		var query []string
		for _, p := range arr(op["parameters"]) {
			if p := obj(p); p["in"] == "query" {
				query = append(query, p["name"].(string))
			}
		}
		slices.Sort(query)
		takes := slices.Sorted(slices.Values(rt.query))
		if !slices.Equal(query, takes) {
			t.Errorf("%s: documented query parameters %v, the route takes %v", rt.pattern, query, takes)
		}
		genBody := slices.ContainsFunc(arr(g["parameters"]), func(p any) bool { return obj(p)["in"] == "body" })
		if (op["requestBody"] != nil) != genBody {
			t.Errorf("%s: documented request body %v, the RPC takes one: %v", rt.pattern, op["requestBody"] != nil, genBody)
		}
		if post := method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch; post && rt.rpc.noBody == genBody {
			t.Errorf("%s: the route reads a body: %v, the RPC takes one: %v", rt.pattern, !rt.rpc.noBody, genBody)
		}
	}
	for pattern, g := range genOps {
		t.Errorf("%s: the protos map %s here, the route table has no such route", pattern, g["operationId"])
	}
}

// Every schema of openapi.json named as a kurz proto message or enum has
// exactly the message's fields, by their JSON names, with matching types,
// or the enum's values: the served document cannot drift from the protos.
func TestOpenAPIMatchesProtos(t *testing.T) {
	var served map[string]any
	if err := json.Unmarshal(OpenAPI, &served); err != nil {
		t.Fatal(err)
	}
	schemas := obj(obj(served["components"])["schemas"])
	compared := 0
	for _, name := range slices.Sorted(maps.Keys(schemas)) {
		s := schemas[name]
		d := protoDescriptor(name)
		if d == nil {
			continue
		}
		compared++
		for _, e := range compareSchema(name, obj(s), d) {
			t.Error(e)
		}
	}
	if compared < 10 {
		t.Errorf("only %d schemas of openapi.json are proto messages; the generated ones are missing", compared)
	}
}

// protoPackages are the packages whose messages the API carries.
var protoPackages = []protoreflect.FullName{"kurz.shortener.v1", "kurz.analytics.v1"}

// protoDescriptor finds the message or enum name in protoPackages.
func protoDescriptor(name string) protoreflect.Descriptor {
	var found protoreflect.Descriptor
	for _, pkg := range protoPackages {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(pkg.Append(protoreflect.Name(name)))
		if err == nil && found != nil {
			return nil // ambiguous: not one message
		}
		if err == nil {
			found = d
		}
	}
	return found
}

func compareSchema(name string, s map[string]any, d protoreflect.Descriptor) []string {
	var errs []string
	switch d := d.(type) {
	case protoreflect.EnumDescriptor:
		var want []string
		for i := range d.Values().Len() {
			want = append(want, string(d.Values().Get(i).Name()))
		}
		if got := strs(arr(s["enum"])); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			errs = append(errs, fmt.Sprintf("%s: enum %v, the proto has %v", name, got, want))
		}
	case protoreflect.MessageDescriptor:
		props := obj(s["properties"])
		fields := d.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			p, ok := props[fd.JSONName()]
			if !ok {
				errs = append(errs, fmt.Sprintf("%s: no property %q, the proto message has it", name, fd.JSONName()))
				continue
			}
			if want, got := jsonType(fd), schemaType(obj(p)); want != got {
				errs = append(errs, fmt.Sprintf("%s.%s: %s, the proto field is %s", name, fd.JSONName(), got, want))
			}
		}
		for key := range props {
			if fields.ByJSONName(key) == nil {
				errs = append(errs, fmt.Sprintf("%s: property %q is not a field of the proto message", name, key))
			}
		}
	}
	return errs
}

// jsonType is how proto JSON writes a field: "string", "int64 string",
// "integer", "boolean", "date-time string", "ref <Message>", and arrays of
// those.
func jsonType(fd protoreflect.FieldDescriptor) string {
	var t string
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind:
		t = "string"
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		t = "int64 string"
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		t = "uint64 string"
	case protoreflect.BoolKind:
		t = "boolean"
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		t = "number"
	case protoreflect.EnumKind:
		t = "ref " + string(fd.Enum().Name())
	case protoreflect.MessageKind:
		switch fd.Message().FullName() {
		case "google.protobuf.Timestamp":
			t = "date-time string"
		case "google.protobuf.FieldMask", "google.protobuf.Duration":
			t = "string"
		default:
			t = "ref " + string(fd.Message().Name())
		}
	default:
		t = "integer"
	}
	if fd.IsList() {
		return "array of " + t
	}
	return t
}

// schemaType is jsonType's reading of a schema.
func schemaType(s map[string]any) string {
	if ref, _ := s["$ref"].(string); ref != "" {
		return "ref " + ref[strings.LastIndex(ref, "/")+1:]
	}
	switch t, f := s["type"], s["format"]; {
	case t == "array":
		return "array of " + schemaType(obj(s["items"]))
	case t == "string" && (f == "int64" || f == "uint64" || f == "date-time"):
		return fmt.Sprintf("%s string", f)
	case t == "number", t == "boolean", t == "string", t == "integer":
		return t.(string)
	}
	return fmt.Sprint(s["type"])
}

func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }
func arr(v any) []any          { l, _ := v.([]any); return l }

func strs(l []any) []string {
	out := make([]string, 0, len(l))
	for _, v := range l {
		out = append(out, fmt.Sprint(v))
	}
	slices.Sort(out)
	return out
}

func newTestAPI(t *testing.T) *API {
	t.Helper()
	api, err := New(Options{MaxBodyBytes: 1, MaxHeaderBytes: 1, CallTimeout: 1, MaxBulkRequests: 1},
		Deps{Meter: noop.NewMeterProvider().Meter("test")})
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// The served openapi.json documents exactly the routes the API registers on
// its mux ("POST /v1/links", ...), no more and no fewer. (The integration
// test TestOpenAPIMatchesRoutes asks a running gateway the same of each
// path's Allow list.)
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	methods := []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
	var documented []string
	for path, item := range doc.Paths {
		for key := range item {
			if slices.Contains(methods, key) {
				documented = append(documented, strings.ToUpper(key)+" "+path)
			}
		}
	}
	routes := newTestAPI(t).Routes()
	slices.Sort(routes)
	slices.Sort(documented)
	if len(routes) == 0 || !slices.Equal(routes, documented) {
		t.Errorf("routes and the OpenAPI document differ:\nroutes:     %v\ndocumented: %v", routes, documented)
	}
}

// PATCH /v1/links/{code} takes exactly the Link fields its documented body
// does not mark read-only ("Output only." in the proto comment), plus
// "domain", which names the link, and "etag", the state the change applies
// to: a new Link field is either documented as output only or changeable
// by PATCH.
func TestPatchTakesTheWritableFields(t *testing.T) {
	var served map[string]any
	if err := json.Unmarshal(OpenAPI, &served); err != nil {
		t.Fatal(err)
	}
	body := obj(obj(obj(obj(obj(obj(obj(served["paths"])["/v1/links/{code}"])["patch"])["requestBody"])["content"])["application/json"])["schema"])
	var writable []string
	for name, p := range obj(body["properties"]) {
		if obj(p)["readOnly"] != true {
			writable = append(writable, name)
		}
	}
	slices.Sort(writable)
	fields := (&shortenerv1.Link{}).ProtoReflect().Descriptor().Fields()
	var takes []string
	for _, name := range mutableLinkFields {
		takes = append(takes, fields.ByName(name).JSONName())
	}
	// "domain" names the link (its custom domain), and is not changed;
	// "etag" is a precondition.
	takes = append(takes, fields.ByName("domain").JSONName(), fields.ByName("etag").JSONName())
	slices.Sort(takes)
	if len(writable) == 0 || !slices.Equal(writable, takes) {
		t.Errorf("the PATCH body documents %v as writable, PATCH takes %v", writable, takes)
	}
}

// The gateway README's route table names every field PATCH takes, so that
// a field added to PATCH is added to the table too.
func TestREADMENamesWhatPatchTakes(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "| ") && strings.Contains(line, "`PATCH`") && strings.Contains(line, "/v1/links/{code}`") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("the gateway README has no route table row for PATCH /v1/links/{code}")
	}
	fields := (&shortenerv1.Link{}).ProtoReflect().Descriptor().Fields()
	for _, name := range mutableLinkFields {
		if field := "`" + fields.ByName(name).JSONName() + "`"; !strings.Contains(row, field) {
			t.Errorf("the README's PATCH row does not name %s, which PATCH takes: %s", field, row)
		}
	}
}
