// Package quotaguard puts kurz's limiter in front of a Go service's own
// handlers: a net/http middleware (Middleware) and gRPC server interceptors
// (UnaryServerInterceptor, StreamServerInterceptor). Each asks the limiter
// about every request through pkg/quota, with the caller's failure policy,
// and answers as kurz's gateway does: the deciding rule's RateLimit and
// RateLimit-Policy fields on every answer, and a denial as a 429 with
// Retry-After (HTTP) or RESOURCE_EXHAUSTED with a RetryInfo (gRPC).
//
// Whatever a stranger sends is made a value the limiter takes: a check the
// limiter refused (a value too long, bytes that are not UTF-8) would be
// decided by the failure policy, and with FailOpen let the request past
// every limit.
package quotaguard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/quota"
)

// MaxValueBytes is the longest descriptor value the limiter takes (it
// refuses the check beyond, DESCRIPTORS_INVALID).
const MaxValueBytes = 1024

// MaxCost is the largest cost the limiter takes (COST_INVALID beyond).
const MaxCost = 1_000_000

// statusClientClosed is the answer to a request whose client hung up
// before it was decided (nginx's 499): the client reads nothing useful,
// and a server's logs tell it from a refusal.
const statusClientClosed = 499

// digestPrefix begins a value bounded sent in place of another.
const digestPrefix = "sha256:"

// bounded returns desc with every value the limiter would refuse made one
// it takes: a value over MaxValueBytes, or not valid UTF-8 (which protobuf
// cannot carry), becomes "sha256:" and its digest in hex, so that two such
// values stay two keys. A value that already begins "sha256:" is made its
// digest too, or a client sending a long value's digest would be counted
// as that value. desc itself is left as it is: it may be the caller's.
func bounded(desc map[string]string) map[string]string {
	var out map[string]string
	for k, v := range desc {
		if len(v) <= MaxValueBytes && utf8.ValidString(v) && !strings.HasPrefix(v, digestPrefix) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(desc))
			for k, v := range desc {
				out[k] = v
			}
		}
		sum := sha256.Sum256([]byte(v))
		out[k] = digestPrefix + hex.EncodeToString(sum[:])
	}
	if out == nil {
		return desc
	}
	return out
}

// boundedCost is c as the limiter takes it: 0 is 1 (quota.Client's
// default), more than MaxCost is MaxCost, decided by the rules (a rule
// that never holds that many denies it for good, quota.Decision.MaxCost)
// rather than refused as invalid and left to the failure policy.
func boundedCost(c uint32) uint32 {
	return min(max(c, 1), MaxCost)
}

type decisionKey struct{}

// DecisionFrom returns the decision the guard made on the request or call
// whose context is ctx: a handler behind the guard reads in it whether the
// limiter answered (Degraded: the failure policy let it through). ok is
// false when the guard did not check the request (its Descriptors said
// not to).
func DecisionFrom(ctx context.Context) (d quota.Decision, ok bool) {
	d, ok = ctx.Value(decisionKey{}).(quota.Decision)
	return d, ok
}

// DefaultMaxWait is the longest a guard holds a request for its turn in a
// leaky bucket's queue when its options leave MaxWait zero.
const DefaultMaxWait = 10 * time.Second

// boundedWait is d.WithinWait(maxWait), 0 being DefaultMaxWait.
func boundedWait(d quota.Decision, maxWait time.Duration) quota.Decision {
	if maxWait == 0 {
		maxWait = DefaultMaxWait
	}
	return d.WithinWait(maxWait)
}

// deniedMessage says why d refused a request of domain, for a person: a
// cost over the rule's capacity cannot pass however long it waits.
func deniedMessage(domain string, d quota.Decision) string {
	if d.MaxCost > 0 {
		return fmt.Sprintf("this request costs more than policy %s/%s ever allows at once (%d): it cannot pass however long it waits; ask for less",
			domain, d.Rule, d.MaxCost)
	}
	return fmt.Sprintf("rate limit exceeded (policy %s/%s)", domain, d.Rule)
}

// limiterDownMessage is the refusal of a request the limiter did not
// decide, under FailClosed.
const limiterDownMessage = "the rate limiter is unavailable"

// checkSetup refuses a guard that cannot work: no client, no domain, no
// descriptors (of the Options or CallOptions named kind), a policy quota
// does not know, or a negative MaxWait.
func checkSetup(c *quota.Client, kind, domain string, hasDescriptors bool, policy quota.Policy, maxWait time.Duration) error {
	switch {
	case c == nil:
		return errors.New("quotaguard: no limiter client (quota.NewDefault makes one)")
	case domain == "":
		return fmt.Errorf("quotaguard: %s.Domain is empty: name the limiter domain whose rules decide", kind)
	case !hasDescriptors:
		return fmt.Errorf("quotaguard: %s.Descriptors is nil: say what each request is keyed by", kind)
	case policy != quota.FailOpen && policy != quota.FailClosed:
		return fmt.Errorf("quotaguard: unknown failure policy %d: want quota.FailOpen or quota.FailClosed", policy)
	case maxWait < 0:
		return fmt.Errorf("quotaguard: %s.MaxWait is %v: want 0 (DefaultMaxWait) or more", kind, maxWait)
	}
	return nil
}

// mustKeying panics, naming source, when k would not key one client per
// key: an IPv6 prefix shorter than clientip.MinIPv6Prefix puts a whole
// network's unrelated clients under one limit (a /16: every visitor of an
// ISP), a negative one or one past 128 Key cannot use. The source is made
// when the program sets its guard up, where a bad constant is a
// programming error, as a bad pattern is to http.ServeMux; a prefix from
// configuration is checked where it is read (clientip.Keying.Check).
func mustKeying(source string, k clientip.Keying) {
	if p := k.IPv6Prefix; p != 0 && (p < clientip.MinIPv6Prefix || p > 128) {
		panic(fmt.Sprintf("quotaguard: %s: clientip.Keying.IPv6Prefix is %d: want 0 (the default, /%d) or %d to 128, or whole networks' unrelated clients would share one limit",
			source, p, clientip.DefaultIPv6Prefix, clientip.MinIPv6Prefix))
	}
}
