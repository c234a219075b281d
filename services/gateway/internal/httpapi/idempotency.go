package httpapi

import (
	"fmt"
	"net/http"
	"strings"

	"kurz.dev/pkg/callmeta"
)

// idempotencyHeader is the request header of the IETF httpapi draft "The
// Idempotency-Key HTTP Header Field" (and of Stripe's API before it).
const idempotencyHeader = "Idempotency-Key"

// idempotencyKey reads a call's Idempotency-Key for route rt into c: the
// shortener gets it as metadata (callmeta.IdempotencyKey, attached by
// downstreamFor) and answers a create sent again with it from the link it
// made. A POST route that takes no key refuses one (400
// IDEMPOTENCY_KEY_UNSUPPORTED) rather than ignore it: the client would
// believe the call safe to repeat when it is not. Other methods are
// repeatable as they are, and ignore it.
func idempotencyKey(c *call, rt route) error {
	vs := c.r.Header.Values(idempotencyHeader)
	if len(vs) == 0 {
		return nil
	}
	if rt.rpc == nil || !rt.rpc.idempotent {
		if c.r.Method != http.MethodPost {
			return nil
		}
		e := badRequest(idempotencyHeader + " is taken by POST /v1/links and POST /v1/webhooks only: this route would not answer a repeat from its first answer, so the header is refused rather than ignored; send the request without it (docs/api.md, Retrying a create)")
		e.reason = callmeta.ReasonIdempotencyKeyUnsupported
		return e
	}
	if len(vs) > 1 {
		return badKey(fmt.Sprintf("send one %s field; this request has %d", idempotencyHeader, len(vs)))
	}
	key, err := parseIdempotencyKey(vs[0])
	if err != nil {
		return badKey(err.Error())
	}
	c.idempotencyKey = key
	return nil
}

func badKey(msg string) *apiError {
	e := badRequest(msg)
	e.reason = callmeta.ReasonIdempotencyKeyInvalid
	return e
}

// parseIdempotencyKey reads the header's value: the draft's structured
// field string ("..." with \" and \\ escapes) or, as most clients send it,
// the bare key, without a comma: "a, b" is what a proxy makes of two
// fields folded into one, which one key must not hide. Either way the key
// is callmeta.CheckIdempotencyKey's.
func parseIdempotencyKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	quoted := len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"'
	if !quoted && strings.Contains(v, ",") {
		return "", fmt.Errorf("send one %s field, without commas (quote a key that holds one: \"a,b\")", idempotencyHeader)
	}
	if quoted {
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			switch ch := inner[i]; {
			case ch == '\\' && i+1 < len(inner) && (inner[i+1] == '"' || inner[i+1] == '\\'):
				i++
				b.WriteByte(inner[i])
			case ch == '\\' || ch == '"':
				return "", fmt.Errorf("the quoted %s is not a structured-field string: escape only \" and \\ with \\", idempotencyHeader)
			default:
				b.WriteByte(ch)
			}
		}
		v = b.String()
	}
	if err := callmeta.CheckIdempotencyKey(v); err != nil {
		return "", err
	}
	return v, nil
}
