package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/services/gateway/internal/keystore"
)

// fuzzMaxBody is the body bound of the fuzz targets: small, so that the
// fuzzer reaches it.
const fuzzMaxBody = 512

// fakeShortener records what reaches the shortener.
type fakeShortener struct {
	shortenerv1.ShortenerServiceClient
	create *shortenerv1.CreateLinkRequest
	update *shortenerv1.UpdateLinkRequest
}

func (s *fakeShortener) CreateLink(_ context.Context, in *shortenerv1.CreateLinkRequest, _ ...grpc.CallOption) (*shortenerv1.CreateLinkResponse, error) {
	s.create = proto.Clone(in).(*shortenerv1.CreateLinkRequest)
	return &shortenerv1.CreateLinkResponse{Link: &shortenerv1.Link{Code: "10000g8", ShortUrl: "https://kurz.example/10000g8"}}, nil
}

func (s *fakeShortener) UpdateLink(_ context.Context, in *shortenerv1.UpdateLinkRequest, _ ...grpc.CallOption) (*shortenerv1.UpdateLinkResponse, error) {
	s.update = proto.Clone(in).(*shortenerv1.UpdateLinkRequest)
	return &shortenerv1.UpdateLinkResponse{Link: in.GetLink()}, nil
}

// fakeKeys records what reaches the key store.
type fakeKeys struct {
	KeyStore
	called bool
	tenant keystore.Tenant
	plan   string
	name   string
}

func (k *fakeKeys) CreateTenant(_ context.Context, t keystore.Tenant) (keystore.Tenant, error) {
	k.called, k.tenant = true, t
	return t, nil
}

func (k *fakeKeys) SetPlan(_ context.Context, id, plan string) (keystore.Tenant, error) {
	k.called, k.plan = true, plan
	return keystore.Tenant{ID: id, Plan: plan}, nil
}

func (k *fakeKeys) IssueKey(_ context.Context, tenant, name string) (keystore.Key, string, error) {
	k.called, k.name = true, name
	return keystore.Key{ID: "k1", Tenant: tenant, Name: name}, "kurz_k1_secret", nil
}

// fuzzCall runs handle on a POST of body, as the route table would after
// admission: declared with its length, or chunked (length unknown).
func fuzzCall(t *testing.T, a *API, handle func(*call) error, body []byte, chunked bool) (*httptest.ResponseRecorder, error) {
	t.Helper()
	return fuzzCallAt(t, a, handle, http.MethodPost, "/", body, chunked)
}

// fuzzCallAt is fuzzCall on method and target, for the mapped routes (whose
// generated handlers route by both).
func fuzzCallAt(t *testing.T, a *API, handle func(*call) error, method, target string, body []byte, chunked bool) (*httptest.ResponseRecorder, error) {
	t.Helper()
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	if chunked {
		r.ContentLength = -1
	}
	r.SetPathValue("tenant", "acme")
	r.SetPathValue("code", "10000g8")
	w := httptest.NewRecorder()
	return w, handle(&call{w: w, r: r, st: &reqState{id: "fuzz", ip: "203.0.113.9", tenant: "acme"}})
}

// checkRefusal fails t unless err refuses body as a client error: 413 for
// a body over the bound, else a 400 with a message.
func checkRefusal(t *testing.T, err error, body []byte) {
	t.Helper()
	var ae *apiError
	if !errors.As(err, &ae) {
		t.Fatalf("body %q: error %v is not an *apiError", body, err)
	}
	switch {
	case len(body) > fuzzMaxBody:
		if ae.status != http.StatusRequestEntityTooLarge || ae.code != codeBodyTooLarge {
			t.Fatalf("body of %d bytes (bound %d): %d %s, want 413", len(body), fuzzMaxBody, ae.status, ae.code)
		}
	case ae.status != http.StatusBadRequest || ae.message == "":
		t.Fatalf("body %q: %d %s %q, want a 400 with a message", body, ae.status, ae.code, ae.message)
	}
}

// checkObject fails t unless body, which reached a service, is a single
// JSON object, no more than the bound, whose keys all name one of fields
// (encoding/json matches names regardless of case).
func checkObject(t *testing.T, body []byte, fields ...string) {
	t.Helper()
	if len(body) > fuzzMaxBody {
		t.Fatalf("a body of %d bytes (bound %d) was accepted", len(body), fuzzMaxBody)
	}
	if !json.Valid(body) {
		t.Fatalf("body %q is not valid JSON (trailing data?) but was accepted", body)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		t.Fatalf("body %q is not a JSON object but was accepted: %v", body, err)
	}
	for key := range obj {
		if !slices.ContainsFunc(fields, func(f string) bool { return strings.EqualFold(f, key) }) {
			t.Fatalf("body %q: unknown field %q accepted", body, key)
		}
	}
}

// FuzzDecodeJSON sends arbitrary bodies to the handlers that decode plain
// JSON (the prototype's POST /links and the admin API), with a fake
// shortener and key store. No handler panics; a body over the bound is a
// 413, any other refusal a 400 that names the problem; whatever reaches a
// service came from a single JSON object of known fields within the bound,
// with no trailing data, and passed the handler's validation (mode, tenant
// id, names, plan). A body of only whitespace counts as no body. The seed
// corpus is in testdata/fuzz/FuzzDecodeJSON.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"longUrl":"https://example.com/a","mode":"random"}`,
		`{"longUrl":"https://example.com/a"}`,
		`{"LONGURL":"x","Mode":"sequential"}`,
		`{"longUrl":"x","mode":"magic"}`,
		`{"longUrl":"x","extra":1}`,
		`{"longUrl":"x"} {"longUrl":"y"}`,
		`{"longUrl":"x"} trailing`,
		`{"longUrl":"x"}` + "\n\t ",
		`{"longUrl":1}`,
		`{"longUrl":"\ud800"}`,
		"{\"longUrl\":\"\xff\"}",
		`{"id":"acme","name":"Acme Corp","plan":"free"}`,
		`{"id":"anonymous","name":"x","plan":"free"}`,
		`{"id":"Acme","name":"a\u0000b","plan":""}`,
		`{"plan":"pro"}`,
		`{"name":"ci key"}`,
		`{"name":null,"plan":null}`,
		`null`, `[]`, `"str"`, `123`, `true`, `{`, `}`, ``, " \n", `{"a":`, `{"longUrl":"x",}`,
		strings.Repeat(" ", fuzzMaxBody) + `{}`,
		`{"name":"` + strings.Repeat("x", fuzzMaxBody) + `"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chunked bool) {
		sh, keys := &fakeShortener{}, &fakeKeys{}
		a := &API{opts: Options{MaxBodyBytes: fuzzMaxBody}, shortener: sh, keys: keys, log: slog.New(slog.DiscardHandler)}

		w, err := fuzzCall(t, a, a.createLinkCompat, body, chunked)
		if sh.create != nil {
			checkObject(t, body, "longUrl", "mode")
			var want compatRequest
			_ = json.Unmarshal(body, &want)
			mode := map[string]shortenerv1.CodeMode{"": shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL, "sequential": shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL, "random": shortenerv1.CodeMode_CODE_MODE_RANDOM}
			if m, ok := mode[want.Mode]; !ok || sh.create.GetMode() != m || sh.create.GetLongUrl() != want.LongURL {
				t.Fatalf("POST /links %q reached the shortener as %v", body, sh.create)
			}
			if err != nil || w.Code != http.StatusCreated {
				t.Fatalf("POST /links %q: %d, %v after the shortener accepted", body, w.Code, err)
			}
		} else {
			checkRefusal(t, err, body)
		}

		if _, err := fuzzCall(t, a, a.createTenant, body, chunked); keys.called {
			checkObject(t, body, "id", "name", "plan")
			if p := keystore.TenantIDProblem(keys.tenant.ID); p != "" || keystore.NameProblem(keys.tenant.Name) != "" || keys.tenant.Plan == "" {
				t.Fatalf("POST /v1/admin/tenants %q reached the key store as %+v", body, keys.tenant)
			}
		} else {
			checkRefusal(t, err, body)
		}

		keys.called = false
		if _, err := fuzzCall(t, a, a.updateTenant, body, chunked); keys.called {
			checkObject(t, body, "plan")
			if keys.plan == "" {
				t.Fatalf("PATCH /v1/admin/tenants/acme %q set an empty plan", body)
			}
		} else {
			checkRefusal(t, err, body)
		}

		keys.called = false
		if _, err := fuzzCall(t, a, a.issueKey, body, chunked); keys.called {
			if len(bytes.TrimSpace(body)) > 0 {
				checkObject(t, body, "name")
			}
			if keystore.NameProblem(keys.name) != "" {
				t.Fatalf("POST /v1/admin/tenants/acme/keys %q issued a key named %q", body, keys.name)
			}
		} else {
			if len(body) <= fuzzMaxBody && len(bytes.TrimSpace(body)) == 0 {
				t.Fatalf("POST /v1/admin/tenants/acme/keys with the empty body %q refused: %v", body, err)
			}
			checkRefusal(t, err, body)
		}
	})
}

// FuzzDecodeProto sends arbitrary bodies to the handlers that decode proto
// JSON (POST /v1/links, PATCH /v1/links/{code}), with a fake shortener. No
// handler panics; a body over the bound is a 413, any other refusal a 400;
// what reaches the shortener came from valid JSON within the bound and is
// exactly the message protojson reads from it (no unknown fields kept), which
// survives protojson's round trip; an update names the path's code and a
// non-empty, sorted field mask of only the mutable fields, one per field the
// body holds. The seed corpus is in testdata/fuzz/FuzzDecodeProto.
func FuzzDecodeProto(f *testing.F) {
	for _, s := range []string{
		`{"longUrl":"https://example.com/a","mode":"CODE_MODE_RANDOM"}`,
		`{"long_url":"https://example.com/a","alias":"my-launch","redirectType":"REDIRECT_TYPE_PERMANENT"}`,
		`{"longUrl":"x","expireTime":"2030-01-02T03:04:05Z"}`,
		`{"longUrl":"x","mode":7}`,
		`{"longUrl":"x","longUrl":"y"}`,
		`{"longUrl":"x","long_url":"y"}`,
		`{"longUrl":"x","unknown":true}`,
		`{"longUrl":"x"}{}`,
		`{"expireTime":null}`,
		`{"disabled":true,"redirectType":"REDIRECT_TYPE_TEMPORARY"}`,
		`{"code":"other"}`,
		`{"expireTime":"2030-13-45T99:00:00Z"}`,
		`{"longUrl":"\ud800"}`,
		"{\"longUrl\":\"\xff\"}",
		`null`, `[]`, `{}`, ``, `{"longUrl":`,
		`{"longUrl":"` + strings.Repeat("a", fuzzMaxBody) + `"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	mutable := []string{"disabled", "expire_time", "long_url", "redirect_type"}
	f.Fuzz(func(t *testing.T, body []byte, chunked bool) {
		sh := &fakeShortener{}
		a := &API{opts: Options{MaxBodyBytes: fuzzMaxBody}, shortener: sh, log: slog.New(slog.DiscardHandler)}

		_, err := fuzzCallAt(t, a, a.routeHandler("POST /v1/links"), "POST", "/v1/links", body, chunked)
		if sh.create != nil {
			checkProto(t, body, sh.create, &shortenerv1.CreateLinkRequest{})
		} else {
			checkRefusal(t, err, body)
		}

		_, err = fuzzCallAt(t, a, a.routeHandler("PATCH /v1/links/{code}"), "PATCH", "/v1/links/10000g8", body, chunked)
		if sh.update == nil {
			checkRefusal(t, err, body)
			return
		}
		link := proto.Clone(sh.update.GetLink()).(*shortenerv1.Link)
		if link.GetCode() != "10000g8" {
			t.Fatalf("PATCH /v1/links/10000g8 %q updates code %q", body, link.GetCode())
		}
		link.Code = ""
		checkProto(t, body, link, &shortenerv1.Link{})
		var obj map[string]json.RawMessage
		_ = json.Unmarshal(body, &obj)
		paths := sh.update.GetUpdateMask().GetPaths()
		if len(paths) == 0 || len(paths) != len(obj) || !slices.IsSorted(paths) || len(slices.Compact(slices.Clone(paths))) != len(paths) {
			t.Fatalf("PATCH %q: mask %q, want one path per field of the body, sorted", body, paths)
		}
		for _, p := range paths {
			if !slices.Contains(mutable, p) {
				t.Fatalf("PATCH %q: mask %q holds immutable %q", body, paths, p)
			}
		}
	})
}

// checkProto fails t unless got, which reached the shortener from body, is
// what protojson reads from body and survives protojson's round trip.
func checkProto(t *testing.T, body []byte, got, fresh proto.Message) {
	t.Helper()
	if len(body) > fuzzMaxBody || !json.Valid(body) {
		t.Fatalf("body %q (%d bytes) is no valid JSON within the bound but was accepted", body, len(body))
	}
	if len(got.ProtoReflect().GetUnknown()) > 0 {
		t.Fatalf("body %q: unknown fields kept", body)
	}
	want := proto.Clone(fresh)
	if err := protojson.Unmarshal(body, want); err != nil || !proto.Equal(got, want) {
		t.Fatalf("body %q reached the shortener as %v; protojson reads %v, %v", body, got, want, err)
	}
	out, err := protojson.Marshal(got)
	if err != nil {
		t.Fatalf("protojson.Marshal of the accepted %v: %v", got, err)
	}
	back := proto.Clone(fresh)
	if err := protojson.Unmarshal(out, back); err != nil || !proto.Equal(back, got) {
		t.Fatalf("protojson round trip of %v: %s -> %v, %v", got, out, back, err)
	}
}
