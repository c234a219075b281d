package httpapi

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
)

// Conditional requests (RFC 9110, section 13). A link and the limiter's
// rules are the resources with validators: every answer that is one link
// carries its ETag (the link's etag field, quoted), a GET of it answers 304
// to an If-None-Match that matches and 412 to an If-Match that does not,
// and its PATCH and DELETE take If-Match, which the shortener checks in the
// same statement as the change (callmeta.IfMatchKey); the rules' GET and
// PUT do the same (limiterrules.go). Everywhere else If-Match (but *)
// is refused on a write, as are If-Unmodified-Since and If-None-Match on
// every write (checkPreconditions): they would not hold, and the write
// would be applied regardless while the client believed it guarded.

// maxETag bounds one entity tag of a request: kurz's are 16 characters.
const maxETag = 64

// linkETag is the ETag of an answer that is one link.
func linkETag(resp proto.Message) string {
	l, ok := resp.(interface{ GetLink() *shortenerv1.Link })
	if !ok || l.GetLink().GetEtag() == "" {
		return ""
	}
	return `"` + l.GetLink().GetEtag() + `"`
}

// entityTags parses an If-Match or If-None-Match field: "*" (any = true,
// and alone), or a list of entity tags ("x", W/"x"), which it returns as their opaque
// tags, W/ kept on weak ones (so that they never match strongly). A bare
// tag (x, as the JSON field shows it) is taken as "x". Several fields are
// one list (RFC 9110, 5.3).
func entityTags(fields []string) (tags []string, any bool, err error) {
	for _, field := range fields {
		for _, item := range strings.Split(field, ",") {
			item = strings.Trim(item, " \t")
			switch {
			case item == "":
				continue
			case item == "*":
				any = true
				continue
			}
			weak := strings.HasPrefix(item, "W/")
			opaque := strings.TrimPrefix(item, "W/")
			if len(opaque) >= 2 && opaque[0] == '"' && opaque[len(opaque)-1] == '"' {
				opaque = opaque[1 : len(opaque)-1]
			}
			if opaque == "" || len(opaque) > maxETag || strings.ContainsFunc(opaque, func(r rune) bool { return r <= ' ' || r == '"' || r > '~' }) {
				return nil, false, fmt.Errorf("%q is not an entity tag such as \"AbCd1234eFgH5678\" (the link's etag, quoted)", item)
			}
			if weak {
				opaque = "W/" + opaque
			}
			tags = append(tags, opaque)
		}
	}
	if len(tags) > callmeta.MaxIfMatch {
		return nil, false, fmt.Errorf("%d entity tags; send at most %d", len(tags), callmeta.MaxIfMatch)
	}
	if any && len(tags) > 0 {
		// RFC 9110 has * stand alone; with tags beside it, whether the
		// client meant any current one or only those is a guess.
		return nil, false, fmt.Errorf("* stands alone: send * (any current entity tag) or a list of entity tags, not both")
	}
	return tags, any, nil
}

// ifMatch reads a write's If-Match for route rt into c: on a route whose
// service checks it (mapping.conditional), its tags go to the service as
// metadata; on any other write, a tag list is refused (412), and * left
// to the route (which answers 404 when there is nothing). Reads evaluate
// it against the answer (checkRead).
func ifMatch(c *call, rt route) error {
	fields := c.r.Header.Values("If-Match")
	if len(fields) == 0 || c.r.Method == http.MethodGet || c.r.Method == http.MethodHead {
		return nil
	}
	tags, _, err := entityTags(fields)
	if err != nil {
		return badTags("If-Match", err)
	}
	if len(tags) == 0 {
		return nil // only *
	}
	if !rt.conditional && (rt.rpc == nil || !rt.rpc.conditional) {
		return newError(http.StatusPreconditionFailed, codePreconditionFailed,
			"If-Match cannot hold here: only a link (GET /v1/links/{code}) and the limiter's rules (GET /v1/admin/rules) have an ETag; this route applies a write as it is, the last write winning; send it without If-Match")
	}
	c.ifMatch = tags
	return nil
}

// badTags refuses an If-Match or If-None-Match field that is not a list of
// entity tags.
func badTags(header string, err error) *apiError {
	e := badRequest(header + ": " + err.Error())
	e.reason = callmeta.ReasonIfMatchInvalid
	return e
}

// checkRead applies a GET's preconditions to its answer, whose entity tag
// is etag: If-Match that does not match is 412 (strong comparison), an
// If-None-Match that does (weak comparison) is 304, with the ETag and no
// body. notModified reports the latter. what names the resource in the
// 412's message ("the link", "the rules"). A link's GET and the rules'
// evaluate them; other reads have no ETag to evaluate them against.
func checkRead(r *http.Request, etag, what string) (notModified bool, err error) {
	opaque := strings.Trim(etag, `"`)
	if fields := r.Header.Values("If-Match"); len(fields) > 0 {
		tags, any, err := entityTags(fields)
		if err != nil {
			return false, badTags("If-Match", err)
		}
		if !any && !slices.Contains(tags, opaque) {
			return false, newError(http.StatusPreconditionFailed, codePreconditionFailed,
				"If-Match: the ETag of "+what+" is none of the tags given; it changed since you read it")
		}
	}
	if fields := r.Header.Values("If-None-Match"); len(fields) > 0 {
		tags, any, err := entityTags(fields)
		if err != nil {
			return false, badTags("If-None-Match", err)
		}
		return any || slices.Contains(tags, opaque) || slices.Contains(tags, "W/"+opaque), nil
	}
	return false, nil
}
