package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	"kurz.dev/pkg/envoydir"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/textcut"
)

// The limiter's rules as a file, for administrators: GET /v1/admin/rules
// exports the rules in force, PUT /v1/admin/rules applies a file. The
// limiter does the work (its RulesAdminService: only its compiler judges a
// rule); the gateway signs the calls (KURZ_SERVICE_AUTH_KEY) and speaks
// HTTP: an ETag, If-Match, the body bound.

// maxRulesBytes bounds a rules file: the limiter's own bound
// (rulestore.MaxApplyBytes), here so that a larger body is refused before
// it is read.
const maxRulesBytes = 1 << 20

// formPartAllowance is what a form may spend per part besides the file's
// bytes: its boundary and headers (~150 bytes as curl -F writes them).
// The files' own bytes keep maxRulesBytes together, as in a directory the
// limiter reads, so a directory it reads applies as a form too.
const formPartAllowance = 256

// rulesChunk is the size of the messages a file is streamed to the limiter
// in: under its small receive bound (rulesadmin.MaxChunk).
const rulesChunk = 32 << 10

// Reasons of the limiter's refusals that answer 409: the request is well
// formed, what it would do conflicts with the rules' state.
var rulesConflicts = map[string]bool{"PLAN_IN_USE": true, "TENANT_PLANS": true, "RULES_FROM_FILE": true, "RULE_ROWS_UNREADABLE": true}

// getRules answers the rules file (YAML; JSON for an Accept of JSON) with
// its ETag, and evaluates a read's preconditions against it (checkRead).
func (a *API) getRules(c *call) error {
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.rulesAdmin.GetRules(ctx, &limiterv1.GetRulesRequest{})
	if err != nil {
		return rulesError(err)
	}
	h := c.w.Header()
	h.Set("ETag", `"`+resp.GetEtag()+`"`)
	h.Set("X-Kurz-Rules-Source", resp.GetSource())
	h.Set("Cache-Control", "no-store") // an administrator's: no shared cache keeps them
	// If-Match and If-None-Match hold or not against the rules' ETag, as
	// on a link's GET: a client polling for a change gets 304, not the
	// whole file each time (RFC 9110, 13.1.1 and 13.1.2).
	notModified, err := checkRead(c.r, h.Get("ETag"), "the rules")
	if err != nil {
		return err
	}
	if notModified {
		c.w.WriteHeader(http.StatusNotModified)
		return nil
	}
	if wantsJSON(c.r) {
		var v any
		if err := yaml.Unmarshal([]byte(resp.GetYaml()), &v); err != nil {
			return internalError(err)
		}
		writeJSON(c.w, http.StatusOK, v)
		return nil
	}
	h.Set("Content-Type", "application/yaml; charset=utf-8")
	c.w.WriteHeader(http.StatusOK)
	_, _ = c.w.Write([]byte(resp.GetYaml()))
	return nil
}

// wantsJSON says whether r's Accept prefers JSON to YAML (a client that
// names only JSON).
func wantsJSON(r *http.Request) bool {
	accept := strings.ToLower(strings.Join(r.Header.Values("Accept"), ","))
	return strings.Contains(accept, "json") && !strings.Contains(accept, "yaml")
}

// rulesChangeJSON is one change of an apply.
type rulesChangeJSON struct {
	Kind   string   `json:"kind"`
	Name   string   `json:"name"`
	Change string   `json:"change"`
	Fields []string `json:"fields,omitempty"`
}

// applyRules applies the body, a rules file (YAML or JSON, or an
// envoyproxy/ratelimit file, which the limiter tells and translates), or
// a form of several envoyproxy/ratelimit files (a directory of them,
// formFiles), with the query's dry_run, prune and merge_domains, and If-Match against
// the rules' ETag.
func (a *API) applyRules(c *call) error {
	dryRun, err := boolParameter(c.r, "dry_run")
	if err != nil {
		return err
	}
	prune, err := boolParameter(c.r, "prune")
	if err != nil {
		return err
	}
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG, for a form's files.
	mergeDomains, err := boolParameter(c.r, "merge_domains")
	if err != nil {
		return err
	}
	boundary, form := formBoundary(c.r)
	limit := int64(maxRulesBytes)
	if form {
		limit += envoydir.MaxFiles * formPartAllowance
	}
	body, err := a.readBodyUpTo(c, limit, "send a rules file (YAML or JSON): GET /v1/admin/rules gives the rules in force")
	if err != nil {
		return err
	}
	var files []envoydir.File
	if form {
		files, err = formFiles(boundary, body)
	}
	if err != nil {
		return err
	}
	// A file of thousands of rules is parsed, compiled twice, diffed and
	// written in one transaction: up to a few seconds for 1 MiB, so the
	// bulk calls' bound, not a single call's.
	timeout := batchCallFactor * a.opts.CallTimeout
	extendWriteDeadline(c.w, timeout)
	ctx, cancel := a.downstreamFor(c, timeout)
	defer cancel()
	stream, err := a.rulesAdmin.ApplyRules(ctx)
	if err != nil {
		return rulesError(err)
	}
	first := &limiterv1.ApplyRulesRequest{DryRun: dryRun, Prune: prune, IfMatch: c.ifMatch, MergeDomains: mergeDomains}
	if files == nil {
		files = []envoydir.File{{Data: body}}
	}
	// Each file from a message naming it (none for a single file), its
	// content in chunks. A failed send ends the stream: CloseAndRecv
	// says why.
sending:
	for _, f := range files {
		msg := &limiterv1.ApplyRulesRequest{FileName: f.Name}
		if first != nil {
			first.FileName, msg, first = f.Name, first, nil
		}
		for rest := f.Data; ; {
			n := min(len(rest), rulesChunk)
			msg.Chunk, rest = rest[:n], rest[n:]
			if stream.Send(msg) != nil {
				break sending
			}
			if len(rest) == 0 {
				break
			}
			msg = &limiterv1.ApplyRulesRequest{}
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return rulesError(err)
	}
	out := struct {
		DryRun bool   `json:"dryRun"`
		ETag   string `json:"etag"`
		// Format is what the limiter read the file as: kurz, or envoy.
		Format  string            `json:"format"`
		Changes []rulesChangeJSON `json:"changes"`
	}{DryRun: resp.GetDryRun(), ETag: resp.GetEtag(), Format: resp.GetFormat(), Changes: []rulesChangeJSON{}}
	for _, ch := range resp.GetChanges() {
		out.Changes = append(out.Changes, rulesChangeJSON{Kind: ch.GetKind(), Name: ch.GetName(), Change: ch.GetChange(), Fields: ch.GetFields()})
	}
	if !dryRun {
		c.w.Header().Set("ETag", `"`+resp.GetEtag()+`"`)
	}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// formFiles reads a multipart/form-data body of boundary (curl -F
// f=@edge.yaml ...): the files of a directory of envoyproxy/ratelimit
// files, one part each, its filename its name in the directory, applied
// together (the limiter reads them as its file source reads such a
// directory). The body is already bounded (1 MiB of
// files and formPartAllowance a part); the files' bytes together are bounded
// here, the parts too, and their names, which the limiter's errors repeat.
func formFiles(boundary string, body []byte) ([]envoydir.File, error) {
	if boundary == "" {
		return nil, badRequest("a multipart/form-data body without a boundary parameter in its Content-Type")
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	files, total := []envoydir.File{}, 0
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, formUnparsed(err)
		}
		// FileName is the filename parameter's last path element; a
		// field without one is not a file.
		name := part.FileName()
		if name == "" {
			return nil, badRequest(fmt.Sprintf("part %d of the form has no filename: send each rules file as a file (curl -F 'f=@edge.yaml')", len(files)+1))
		}
		if err := envoydir.CheckName(name); err != nil {
			return nil, badRequest(fmt.Sprintf("part %d of the form: %v", len(files)+1, err))
		}
		if len(files) == envoydir.MaxFiles {
			return nil, badRequest(fmt.Sprintf("over %d files in the form: a directory of envoyproxy/ratelimit files may hold at most %d", envoydir.MaxFiles, envoydir.MaxFiles))
		}
		data, err := io.ReadAll(part)
		if err != nil {
			return nil, formUnparsed(err)
		}
		if total += len(data); total > maxRulesBytes {
			return nil, newError(http.StatusRequestEntityTooLarge, codeBodyTooLarge,
				fmt.Sprintf("the form's files are larger than %d bytes together (1 MiB, a ConfigMap's bound): split the domains over several applies", maxRulesBytes))
		}
		files = append(files, envoydir.File{Name: name, Data: data})
	}
	if len(files) == 0 {
		return nil, badRequest("a multipart/form-data body without files: send one part per rules file")
	}
	return files, nil
}

// formUnparsed is the refusal of a form multipart cannot read. Its error
// may quote a malformed part header whole (up to the body's bound): the
// answer says what went wrong in at most maxFormProblem bytes of it.
func formUnparsed(err error) error {
	return badRequest("the multipart/form-data body does not parse: " + textcut.Echo(err.Error(), maxFormProblem))
}

// maxFormProblem bounds what formUnparsed repeats of multipart's error.
const maxFormProblem = 200

// formBoundary reports whether the body is multipart/form-data (a
// directory's files, one part each), and its boundary.
func formBoundary(r *http.Request) (boundary string, form bool) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return "", false
	}
	return params["boundary"], true
}

// boolParameter reads an optional query parameter true or false.
func boolParameter(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badParameter(name, name+" must be true or false")
	}
	return b, nil
}

// rulesError is the answer to a refusal of the limiter's rules admin API:
// its conflicts 409, a limiter without the API (no KURZ_SERVICE_AUTH_KEY,
// or older than it) 503 saying so, the rest as any service's.
func rulesError(err error) error {
	switch status.Code(err) {
	case codes.Unimplemented:
		return unavailable("the limiter's rules admin API is off: give the limiter KURZ_SERVICE_AUTH_KEY, the gateway's (and run a limiter of this version)", err)
	case codes.Unauthenticated:
		return unavailable("the limiter refused the gateway's signed call: give the limiter and the gateway the same KURZ_SERVICE_AUTH_KEY", err)
	}
	e := toAPIError(err)
	if info, _, _ := rpcerr.Details(err); info != nil && rulesConflicts[info.GetReason()] {
		e.status = http.StatusConflict
	}
	return e
}
