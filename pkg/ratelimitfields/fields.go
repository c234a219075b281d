// Package ratelimitfields writes the IETF RateLimit and RateLimit-Policy
// HTTP fields (draft-ietf-httpapi-ratelimit-headers, structured fields),
// which the gateway sends on every limited route and the limiter's Envoy
// rate-limit service hands Envoy to add to responses. It also writes the
// older RateLimit-Limit, -Remaining and -Reset trio for clients that still
// read it.
package ratelimitfields

import (
	"strconv"
	"time"
)

// Quota is one decision of one policy.
type Quota struct {
	// Policy names the policy (kurz: "<domain>/<rule>").
	Policy string
	// Limit units per Window; Window 0 when not known.
	Limit  int64
	Window time.Duration
	// Remaining units, and the time until the quota is full again.
	Remaining  int64
	ResetAfter time.Duration
	// Allowed is false on a denial, which then has no units left and is
	// back at the earliest after RetryAfter.
	Allowed    bool
	RetryAfter time.Duration
}

// Names of the fields, spelt as the draft spells them (field names are
// case-insensitive; Go's canonical form would be "Ratelimit-Policy").
const (
	PolicyField = "RateLimit-Policy"
	StateField  = "RateLimit"
)

// Fields are the RateLimit-Policy and RateLimit values of q: the policy
// named as an sf-string, q = its limit per w seconds, r = what is left,
// t = seconds until it is back to full (on a denial r=0 and t at least the
// retry-after). Seconds are whole, rounded up.
func Fields(q Quota) (policy, state string) {
	// Both values in one string (one allocation; the gateway and the
	// limiter's Envoy API write them on every answer), sliced in two.
	var arr [160]byte
	b := appendSF(arr[:0], q.Policy)
	name := len(b)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, max(q.Limit, 0), 10)
	if w := CeilSeconds(q.Window); w > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, w, 10)
	}
	split := len(b)
	b = append(b, b[:name]...)
	remaining, reset := max(q.Remaining, 0), CeilSeconds(q.ResetAfter)
	if !q.Allowed {
		remaining, reset = 0, max(reset, CeilSeconds(q.RetryAfter))
	}
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, reset, 10)
	both := string(b)
	return both[:split], both[split:]
}

// Legacy are the RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
// values of q (an earlier draft's fields), as name-value pairs.
func Legacy(q Quota) [3][2]string {
	return [3][2]string{
		{"RateLimit-Limit", strconv.FormatInt(q.Limit, 10)},
		{"RateLimit-Remaining", strconv.FormatInt(max(0, q.Remaining), 10)},
		{"RateLimit-Reset", strconv.FormatInt(CeilSeconds(q.ResetAfter), 10)},
	}
}

// CeilSeconds is d in whole seconds, rounded up, never negative.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// appendSF appends s as a structured-field String (RFC 9651 §3.3.3).
func appendSF(b []byte, s string) []byte {
	b = append(b, '"')
	for i := range len(s) {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?') // not representable; rule names never hold these
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
