package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode"

	"go.opentelemetry.io/otel/metric/noop"
)

// generatedSpec is the Swagger 2.0 document protoc-gen-openapiv2 writes from
// the protos' google.api.http annotations (make gen; make check-gen fails
// when it is stale).
const generatedSpec = "../../../../gen/openapi/kurz.swagger.json"

// Deliberate differences between a served schema and the proto message it
// carries, each with its reason; everything else must match.
var (
	// Fields of a message the served response schema leaves out.
	servedOmits = map[string]map[string]string{
		"Link": {"password": "input only: never returned, set through CreateLinkRequest or LinkPatch"},
	}
	// Served request schemas that accept only some of the message's fields.
	servedSubset = map[string]string{
		"LinkPatch": "PATCH writes only the fields UpdateLink's update_mask may name",
	}
)

// Every RPC the protos map to HTTP is served at its path and method, with
// the same query parameters, and its request body and response schemas
// (followed through every nested message and enum) have the fields, types
// and enum values of the proto messages: the hand-written openapi.json
// cannot drift from the protos.
func TestOpenAPIMatchesProtos(t *testing.T) {
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
	c := &schemaComparer{gen: gen, served: served, seen: map[string]bool{}}

	genPaths := obj(gen["paths"])
	if len(genPaths) == 0 {
		t.Fatal("the generated spec maps no RPC to HTTP")
	}
	for _, path := range slices.Sorted(maps.Keys(genPaths)) {
		// grpc-gateway's {link.code} (a field of the body message) is the
		// served {code}.
		servedPath := strings.ReplaceAll(path, "{link.code}", "{code}")
		for _, method := range slices.Sorted(maps.Keys(obj(genPaths[path]))) {
			g := obj(obj(genPaths[path])[method])
			where := fmt.Sprintf("%s %s (%s)", strings.ToUpper(method), servedPath, g["operationId"])
			s := obj(obj(obj(served["paths"])[servedPath])[method])
			if s == nil {
				t.Errorf("%s: mapped in the protos, not in openapi.json", where)
				continue
			}
			c.compareOperation(where, g, s)
		}
	}
	for _, e := range c.errs {
		t.Error(e)
	}
}

type schemaComparer struct {
	gen, served map[string]any
	seen        map[string]bool // generated/served pairs already compared
	errs        []string
}

func (c *schemaComparer) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func (c *schemaComparer) compareOperation(where string, g, s map[string]any) {
	var genQuery []string
	var genBody map[string]any
	for _, p := range arr(g["parameters"]) {
		p := obj(p)
		switch p["in"] {
		case "query":
			// The gateway reads the proto field names (page_size), which
			// the generator writes in JSON case (pageSize).
			genQuery = append(genQuery, snake(p["name"].(string)))
		case "body":
			genBody = obj(p["schema"])
		}
	}
	var servedQuery []string
	for _, p := range arr(s["parameters"]) {
		if p := obj(p); p["in"] == "query" {
			servedQuery = append(servedQuery, p["name"].(string))
		}
	}
	slices.Sort(genQuery)
	slices.Sort(servedQuery)
	if !slices.Equal(genQuery, servedQuery) {
		c.errorf("%s: query parameters %v, the proto request has %v", where, servedQuery, genQuery)
	}

	servedBody := obj(obj(obj(obj(s["requestBody"])["content"])["application/json"])["schema"])
	switch {
	case genBody == nil && servedBody != nil:
		c.errorf("%s: serves a request body the RPC has none of", where)
	case genBody != nil && servedBody == nil:
		c.errorf("%s: serves no JSON request body, the RPC takes one", where)
	case genBody != nil:
		c.compare(where+" request", genBody, servedBody)
	}

	genResp := c.resolve(c.gen, obj(obj(obj(g["responses"])["200"])["schema"]))
	// Several success statuses (201 Created, or 200 for a link that
	// existed) must each carry the RPC's response.
	var servedCodes []string
	for code := range obj(s["responses"]) {
		if strings.HasPrefix(code, "2") {
			servedCodes = append(servedCodes, code)
		}
	}
	if len(servedCodes) == 0 {
		c.errorf("%s: no success response", where)
		return
	}
	slices.Sort(servedCodes)
	for _, code := range servedCodes {
		servedResp := obj(obj(obj(obj(obj(s["responses"])[code])["content"])["application/json"])["schema"])
		switch {
		case len(obj(genResp["properties"])) == 0 && servedResp != nil:
			c.errorf("%s %s: serves a response body for an empty proto response", where, code)
		case len(obj(genResp["properties"])) > 0 && servedResp == nil:
			c.errorf("%s %s: serves no JSON response, the RPC returns fields", where, code)
		case servedResp != nil:
			c.compare(where+" response "+code, obj(obj(obj(g["responses"])["200"])["schema"]), servedResp)
		}
	}
}

// compare checks that the served schema s carries what the generated schema
// g does: the same properties (less the listed exceptions), types, int64 and
// date-time formats, and enum values, recursively.
func (c *schemaComparer) compare(where string, g, s map[string]any) {
	gName, sName := refName(g), refName(s)
	if gName != "" && sName != "" {
		key := gName + "=" + sName
		if c.seen[key] {
			return
		}
		c.seen[key] = true
		where = fmt.Sprintf("%s (%s as %s)", where, gName, sName)
	}
	g, s = c.resolve(c.gen, g), c.resolve(c.served, s)
	if len(arr(s["oneOf"])) > 0 { // a nullable PATCH field: {oneOf: [X, null]}
		for _, alt := range arr(s["oneOf"]) {
			if alt := obj(alt); alt["type"] != "null" {
				sName = refName(alt)
				s = c.resolve(c.served, alt)
			}
		}
	}

	if e := arr(g["enum"]); e != nil {
		if !slices.Equal(strs(e), strs(arr(s["enum"]))) {
			c.errorf("%s: enum %v, the proto has %v", where, strs(arr(s["enum"])), strs(e))
		}
		return
	}
	gType, _ := g["type"].(string)
	if gType == "" && g["properties"] != nil {
		gType = "object"
	}
	if !hasType(s, gType) {
		c.errorf("%s: type %v, the proto's is %s", where, s["type"], gType)
		return
	}
	switch gType {
	case "array":
		c.compare(where+"[]", obj(g["items"]), obj(s["items"]))
	case "object":
		gp, sp := obj(g["properties"]), obj(s["properties"])
		for name := range gp {
			if _, ok := sp[name]; ok {
				c.compare(where+"."+name, obj(gp[name]), obj(sp[name]))
			} else if servedOmits[sName][name] == "" && servedSubset[sName] == "" {
				c.errorf("%s: no property %q, the proto message has it", where, name)
			}
		}
		for name := range sp {
			if _, ok := gp[name]; !ok {
				c.errorf("%s: property %q is not a field of the proto message", where, name)
			}
		}
	default:
		if f, _ := g["format"].(string); (f == "int64" || f == "uint64" || f == "date-time") && s["format"] != f {
			c.errorf("%s: format %v, the proto's is %s", where, s["format"], f)
		}
	}
}

func (c *schemaComparer) resolve(doc map[string]any, s map[string]any) map[string]any {
	for range 10 {
		ref, _ := s["$ref"].(string)
		if ref == "" {
			return s
		}
		node := any(doc)
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			node = obj(node)[part]
		}
		if node == nil {
			c.errorf("unresolved $ref %s", ref)
			return map[string]any{}
		}
		s = obj(node)
	}
	return s
}

func refName(s map[string]any) string {
	ref, _ := s["$ref"].(string)
	return ref[strings.LastIndex(ref, "/")+1:]
}

// hasType reports whether s's type is t or, for a list of types, includes t.
func hasType(s map[string]any, t string) bool {
	switch st := s["type"].(type) {
	case string:
		return st == t
	case []any:
		return slices.Contains(strs(st), t)
	}
	return t == "object" && s["properties"] != nil
}

func snake(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsUpper(r) {
			b.WriteByte('_')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
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
	api, err := New(Options{MaxBodyBytes: 1, MaxHeaderBytes: 1, CallTimeout: 1, MaxBulkRequests: 1},
		Deps{Meter: noop.NewMeterProvider().Meter("test")})
	if err != nil {
		t.Fatal(err)
	}
	routes := api.Routes()
	slices.Sort(routes)
	slices.Sort(documented)
	if len(routes) == 0 || !slices.Equal(routes, documented) {
		t.Errorf("routes and the OpenAPI document differ:\nroutes:     %v\ndocumented: %v", routes, documented)
	}
}
