package quotaapi

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/textcut"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// ForwardAuthRoute is the forward-auth endpoint's route on the limiter's
// HTTP listener: any method (the proxies ask with GET, the client's own
// method in a header of theirs; a proxy_method or Traefik's
// preserveRequestMethod may send another), the domain in the path, so
// that the metrics' and
// traces' route is this pattern and never a client's value.
const ForwardAuthRoute = "/forward-auth/{domain}"

// IsForwardAuth reports whether r is for the forward-auth endpoint, whose
// requests carry the headers of the proxies' clients.
func IsForwardAuth(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/forward-auth/")
}

// Bounds on a forward-auth request, checked before anything is decided.
const (
	// maxForwardQuery bounds the URL's query, which the operator writes
	// and a stranger who reaches the port could make long.
	maxForwardQuery = 4 << 10
	// maxForwardValue bounds one value taken from the forwarded request
	// (a header, the path) or written in the URL. nginx, by default,
	// passes no header line longer (large_client_header_buffers 8k); a
	// longer one is refused, so its request is denied, never let through.
	maxForwardValue = 8 << 10
)

// ForwardAuth answers a proxy's forward-auth request (nginx's
// auth_request, ingress-nginx's auth-url, Traefik's ForwardAuth, Caddy's
// forward_auth): may the request it forwards pass? The operator's URL
// names the domain and the descriptors (see parseForwardSpec), their values
// taken from the forwarded request as the proxy describes it in headers;
// they are decided by svc.ShouldRateLimit, the gRPC API's handler, so by
// the same rules, matching, failure modes, metrics and decision log as
// Envoy's requests. The answer is 200 to let the request through, the
// URL's deny_status (429 by default) to refuse it, each with the
// rate-limit fields ShouldRateLimit asks Envoy to add (RateLimit,
// RateLimit-Policy; Retry-After on a refusal) and the X-RateLimit fields
// Envoy's filter would build from its statuses. A URL or a forwarded
// request it cannot read is 400 with what is wrong, which every one of
// those proxies takes as a refusal, never as a pass.
//
// The URL must name its proxy (from=), and every request carry the
// method header that proxy sends, whatever the descriptors read: a web
// page the operator has open can send a GET to a forwarded
// 127.0.0.1:9191, which the ops Host check lets through, and spend any
// counter a URL can name (d=user=value:alice) without reading an answer;
// it cannot add a header of its choosing without a CORS preflight, an
// OPTIONS without that header, which is refused like any other.
//
// The proxies send no body, and none is read: a request with one is 413
// (a proxy told to send the client's body would send every upload twice).
// Requests are decided within inFlight's bound, shared with POST /json,
// each within timeout.
type ForwardAuth struct {
	svc      rlsv3.RateLimitServiceServer
	keying   clientip.Keying
	inFlight *InFlight
	timeout  time.Duration
	log      *slog.Logger
}

// NewForwardAuth returns the forward-auth endpoint over svc; keying keys a
// remote_address source's address (an IPv6 client by its prefix).
func NewForwardAuth(svc rlsv3.RateLimitServiceServer, keying clientip.Keying, inFlight *InFlight, timeout time.Duration, log *slog.Logger) *ForwardAuth {
	return &ForwardAuth{svc: svc, keying: keying, inFlight: inFlight, timeout: timeout, log: log}
}

// ServeHTTP implements http.Handler.
func (h *ForwardAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 {
		http.Error(w, "forward auth reads no request body: have the proxy send none (nginx: proxy_pass_request_body off)", http.StatusRequestEntityTooLarge)
		return
	}
	spec, err := parseForwardSpec(r.PathValue("domain"), r.URL.RawQuery)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, err := spec.request(r.Header, h.keying)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(req.GetDescriptors()) == 0 {
		// Every descriptor named a header the request lacks: nothing to
		// limit, as Envoy sends no request then.
		w.WriteHeader(http.StatusOK)
		return
	}
	if !h.inFlight.enter(w) {
		return
	}
	defer h.inFlight.leave()
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	resp, err := h.svc.ShouldRateLimit(ctx, req)
	if err != nil {
		if st, _ := status.FromError(err); st.Code() == codes.InvalidArgument {
			http.Error(w, st.Message(), http.StatusBadRequest)
			return
		}
		h.log.ErrorContext(ctx, "forward auth: ShouldRateLimit failed", "domain", spec.domain, "err", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	header := w.Header()
	for _, f := range resp.GetResponseHeadersToAdd() {
		// As spelt (RateLimit-Policy, as the draft and the gateway spell
		// it), not in Go's canonical form.
		header[f.GetKey()] = append(header[f.GetKey()], f.GetValue())
	}
	setXRateLimit(header, resp.GetStatuses())
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		w.WriteHeader(http.StatusOK)
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		header.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(spec.deny)
		_, _ = w.Write([]byte("rate limit exceeded\n"))
	default:
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
	}
}

// A forwardSource is where the value of a descriptor entry comes from.
type forwardSource uint8

const (
	// The forwarded request's facts, from the headers its proxy sets.
	sourceRemoteAddress forwardSource = iota
	sourceMethod
	sourceHost
	sourcePath
	// A request header, as the client (or the proxy) sent it.
	sourceHeader
	// A value written in the URL.
	sourceValue
)

// forwardFacts are the sources that are facts of the forwarded request.
const forwardFacts = sourcePath + 1

// sourceNames are the sources by the names a URL gives them, each the
// default key of its entries; header: and value: take an argument.
var sourceNames = map[string]forwardSource{
	"remote_address": sourceRemoteAddress, "method": sourceMethod, "host": sourceHost, "path": sourcePath,
	"header": sourceHeader, "value": sourceValue,
}

// forwardEntry is one entry of a descriptor a URL names.
type forwardEntry struct {
	key    string
	source forwardSource
	// arg is the header's canonical name (sourceHeader) or the value
	// itself (sourceValue).
	arg string
}

// forwardSpec is what a forward-auth URL asks for.
type forwardSpec struct {
	domain string
	// by tells which headers hold the forwarded request's facts.
	by    *forwardedBy
	descs [][]forwardEntry
	// needs marks the facts a request must carry: those the entries read,
	// and the method, always.
	needs [forwardFacts]bool
	cost  uint32
	deny  int
}

// forwardedBy names the headers a proxy describes the request it forwards
// in (as commonly spelt; looked up case-insensitively). Each proxy sets its own, replacing what the client sent; the others
// it passes on as the client sent them, which is why the URL names the
// proxy (from=) rather than the limiter guessing from what is there.
type forwardedBy struct {
	method string
	// uri holds the request-target (path and query); url, when set instead,
	// the whole URL, host included.
	uri, url string
	host     string
	// client holds the client's address: the last entry of a chain (X-Forwarded-For), which
	// the proxy itself wrote, else the one address.
	client string
	chain  bool
}

// forwardProxies are the proxies a URL can name in from=, with the headers
// each sends (or the README's recipe has it send).
var forwardProxies = map[string]*forwardedBy{
	// nginx: the README's recipe sets these three as ingress-nginx does;
	// X-Real-IP is $remote_addr, the client after the realip module.
	"nginx": {method: "X-Original-Method", url: "X-Original-URL", client: "X-Real-IP"},
	// ingress-nginx: its auth location sets these three. Its
	// X-Forwarded-For can be a chain ending in the load balancer's address
	// (compute-full-forwarded-for), its X-Real-IP is the client.
	"ingress-nginx": {method: "X-Original-Method", url: "X-Original-URL", client: "X-Real-IP"},
	// Traefik and Caddy set the X-Forwarded-* headers, X-Forwarded-For
	// ending in the address of the connection they took the request on.
	"traefik": {method: "X-Forwarded-Method", uri: "X-Forwarded-Uri", host: "X-Forwarded-Host", client: "X-Forwarded-For", chain: true},
	"caddy":   {method: "X-Forwarded-Method", uri: "X-Forwarded-Uri", host: "X-Forwarded-Host", client: "X-Forwarded-For", chain: true},
}

// parseForwardSpec reads a forward-auth URL: the domain, then the query's
//
//	d=ENTRY[,ENTRY...]   a descriptor, repeated for each (at least one)
//	from=PROXY           nginx, ingress-nginx, traefik or caddy: which
//	                     headers describe the forwarded request (required)
//	cost=N               the hits_addend (1 to 1,000,000; 1 by default)
//	deny_status=CODE     the status of a refusal: 429 (default) or 403
//
// where an ENTRY is SOURCE or KEY=SOURCE, KEY the descriptor entry's key
// (the source's name by default) and SOURCE one of remote_address,
// method, host, path, header:NAME (key: NAME lower-cased) or value:TEXT
// (key: generic_key, as Envoy's GenericKey). Everything is bounded and
// checked here, and a refusal names the part at fault.
func parseForwardSpec(domain, rawQuery string) (*forwardSpec, error) {
	if !ratelimit.ValidName(domain) {
		return nil, fmt.Errorf("domain %q: want 1 to 64 letters, digits, '.', '_' or '-'", textcut.Echo(domain, maxEcho))
	}
	if len(rawQuery) > maxForwardQuery {
		return nil, fmt.Errorf("query of %d bytes: at most %d", len(rawQuery), maxForwardQuery)
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, fmt.Errorf("query: %s", textcut.Echo(err.Error(), maxEcho))
	}
	spec := &forwardSpec{domain: domain, deny: http.StatusTooManyRequests}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		vals := q[name]
		if name != "d" && len(vals) > 1 {
			return nil, fmt.Errorf("%s given %d times: give it once", textcut.Echo(name, maxEcho), len(vals))
		}
		switch name {
		case "d":
		case "from":
			if spec.by = forwardProxies[vals[0]]; spec.by == nil {
				return nil, fmt.Errorf("from=%s: want nginx, ingress-nginx, traefik or caddy", textcut.Echo(vals[0], maxEcho))
			}
		case "cost":
			n, err := strconv.ParseUint(vals[0], 10, 32)
			if err != nil || n < 1 || n > maxCost {
				return nil, fmt.Errorf("cost=%s: want 1 to %d", textcut.Echo(vals[0], maxEcho), maxCost)
			}
			spec.cost = uint32(n)
		case "deny_status":
			switch vals[0] {
			case "429":
				spec.deny = http.StatusTooManyRequests
			case "403":
				spec.deny = http.StatusForbidden
			default:
				return nil, fmt.Errorf("deny_status=%s: want 429 or 403 (nginx's auth_request denies on 403 and 401 only)", textcut.Echo(vals[0], maxEcho))
			}
		default:
			return nil, fmt.Errorf("unknown parameter %q: want d, from, cost or deny_status", textcut.Echo(name, maxEcho))
		}
	}
	ds := q["d"]
	if len(ds) == 0 {
		return nil, fmt.Errorf("no descriptor: name at least one with d=, e.g. d=remote_address")
	}
	if len(ds) > maxDescriptors {
		return nil, fmt.Errorf("%d descriptors (d=): at most %d", len(ds), maxDescriptors)
	}
	spec.descs = make([][]forwardEntry, len(ds))
	for i, d := range ds {
		if spec.descs[i], err = spec.parseDescriptor(d); err != nil {
			return nil, fmt.Errorf("d=%s: %w", textcut.Echo(d, maxEcho), err)
		}
	}
	if spec.by == nil {
		return nil, fmt.Errorf("no from=: name the proxy that asks, from=nginx, from=ingress-nginx, from=traefik or from=caddy (its headers describe the request, and show that a proxy sent it)")
	}
	// Every request carries its proxy's method header, read or not: see
	// ForwardAuth.
	spec.needs[sourceMethod] = true
	return spec, nil
}

// parseDescriptor reads one d= parameter, marking the facts it needs.
func (s *forwardSpec) parseDescriptor(d string) ([]forwardEntry, error) {
	parts := strings.Split(d, ",")
	if len(parts) > maxDescriptors {
		return nil, fmt.Errorf("%d entries: at most %d", len(parts), maxDescriptors)
	}
	entries := make([]forwardEntry, 0, len(parts))
	for _, p := range parts {
		e, err := parseForwardEntry(p)
		if err != nil {
			return nil, err
		}
		for _, prev := range entries {
			// A key twice is a descriptor no rule limits: refused rather
			// than silently limiting nothing.
			if prev.key == e.key {
				return nil, fmt.Errorf("key %s twice: give each entry a key of its own (KEY=SOURCE)", e.key)
			}
		}
		if e.source < forwardFacts {
			s.needs[e.source] = true
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// parseForwardEntry reads one ENTRY: SOURCE or KEY=SOURCE.
func parseForwardEntry(p string) (forwardEntry, error) {
	var e forwardEntry
	src := p
	// A '=' before any ':' ends the key; one after it is value:TEXT's.
	if eq := strings.IndexByte(p, '='); eq >= 0 && !strings.Contains(p[:eq], ":") {
		e.key, src = p[:eq], p[eq+1:]
		if !ratelimit.ValidName(e.key) {
			return e, fmt.Errorf("key %q: want 1 to 64 letters, digits, '.', '_' or '-'", textcut.Echo(e.key, maxEcho))
		}
	}
	name, arg, hasArg := strings.Cut(src, ":")
	source, ok := sourceNames[name]
	if !ok || hasArg != (source == sourceHeader || source == sourceValue) {
		return e, fmt.Errorf("%q is no source: want remote_address, method, host, path, header:NAME or value:TEXT", textcut.Echo(src, maxEcho))
	}
	e.source = source
	switch source {
	case sourceHeader:
		if arg == "" || len(arg) > maxDescriptorKey || strings.IndexFunc(arg, notTokenChar) >= 0 {
			return e, fmt.Errorf("header name %q: want 1 to %d characters of a header name", textcut.Echo(arg, maxEcho), maxDescriptorKey)
		}
		e.arg = http.CanonicalHeaderKey(arg)
		if e.key == "" {
			if e.key = strings.ToLower(arg); !ratelimit.ValidName(e.key) {
				return e, fmt.Errorf("header:%s: the header's name is no descriptor key; give one, KEY=header:%s", arg, arg)
			}
		}
	case sourceValue:
		if arg == "" || len(arg) > maxForwardValue {
			return e, fmt.Errorf("value:TEXT: want 1 to %d bytes of text", maxForwardValue)
		}
		e.arg = arg
		if e.key == "" {
			e.key = "generic_key" // Envoy's GenericKey action's default
		}
	default:
		if e.key == "" {
			e.key = name
		}
	}
	return e, nil
}

// notTokenChar reports a character a header name (an RFC 9110 token)
// cannot hold.
func notTokenChar(c rune) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return false
	}
	return !strings.ContainsRune("!#$%&'*+-.^_`|~", c)
}

// request is the RateLimitRequest of a forwarded request, whose headers
// are h. A descriptor with a header: entry whose header h lacks is left
// out, as Envoy leaves out one whose request_headers action finds no
// header; one whose header h has twice is an error; a fact the proxy should have sent and did not is an error,
// naming the header (never a value: a header may hold a secret).
func (s *forwardSpec) request(h http.Header, keying clientip.Keying) (*rlsv3.RateLimitRequest, error) {
	var facts [forwardFacts]string
	for src, need := range s.needs {
		if !need {
			continue
		}
		v, err := s.by.fact(forwardSource(src), h, keying)
		if err != nil {
			return nil, err
		}
		facts[src] = v
	}
	req := &rlsv3.RateLimitRequest{Domain: s.domain, HitsAddend: s.cost,
		Descriptors: make([]*ratelimitcommonv3.RateLimitDescriptor, 0, len(s.descs))}
next:
	for _, d := range s.descs {
		entries := make([]*ratelimitcommonv3.RateLimitDescriptor_Entry, len(d))
		for i, e := range d {
			v := e.arg
			switch e.source {
			case sourceHeader:
				vals := h[e.arg]
				switch {
				case len(vals) == 0:
					continue next
				case len(vals) > 1:
					// Envoy's request_headers action takes the first, but
					// the service may read another (the last, or all
					// joined): a client would send a fresh first value on
					// every request, counted, then its own, read.
					return nil, fmt.Errorf("header %s given %d times: a request may send it once", e.arg, len(vals))
				}
				if v = vals[0]; len(v) > maxForwardValue {
					return nil, fmt.Errorf("header %s of %d bytes: at most %d", e.arg, len(v), maxForwardValue)
				}
			case sourceValue:
			default:
				v = facts[e.source]
			}
			entries[i] = &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: e.key, Value: v}
		}
		req.Descriptors = append(req.Descriptors, &ratelimitcommonv3.RateLimitDescriptor{Entries: entries})
	}
	return req, nil
}

// fact reads one fact of the forwarded request from the proxy's headers.
func (by *forwardedBy) fact(src forwardSource, h http.Header, keying clientip.Keying) (string, error) {
	switch src {
	case sourceRemoteAddress:
		return by.clientKey(h, keying)
	case sourceMethod:
		m, err := one(h, by.method)
		if err == nil && strings.IndexFunc(m, notTokenChar) >= 0 {
			err = fmt.Errorf("header %s holds no method", by.method)
		}
		return m, err
	case sourceHost:
		hostport := ""
		if by.url != "" {
			u, err := one(h, by.url)
			if err != nil {
				return "", err
			}
			if hostport, _, err = splitURL(by.url, u); err != nil {
				return "", err
			}
		} else {
			var err error
			if hostport, err = one(h, by.host); err != nil {
				return "", err
			}
		}
		// The host the proxy routes by: its port dropped, lower-cased
		// (a client's other spelling is not another counter). What the
		// client wrote in its Host is refused unless it is a host name:
		// nginx passes on '?', '#' or '@' there.
		host := linkdomain.Host(hostport)
		if !hostName(host) {
			return "", fmt.Errorf("header %s holds no host name", cmp.Or(by.url, by.host))
		}
		return host, nil
	case sourcePath:
		name := cmp.Or(by.url, by.uri)
		target, err := one(h, name)
		if err != nil {
			return "", err
		}
		if by.url != "" {
			if _, target, err = splitURL(by.url, target); err != nil {
				return "", err
			}
		}
		p, ok := cleanPath(target)
		if !ok {
			return "", fmt.Errorf("header %s holds no path", name)
		}
		return p, nil
	}
	return "", fmt.Errorf("no such fact %d", src)
}

// clientKey is the client's address as its limiter key (an IPv6 client
// by its prefix, whatever key the entry has).
func (by *forwardedBy) clientKey(h http.Header, keying clientip.Keying) (string, error) {
	var hop string
	if by.chain {
		lines := h.Values(by.client)
		if len(lines) == 0 {
			return "", missing(by.client)
		}
		// The last entry of the last line: the address the proxy itself
		// took the request from. Entries before it are the client's to
		// write (or its own proxies'), and prove nothing.
		hop = lines[len(lines)-1]
		if i := strings.LastIndexByte(hop, ','); i >= 0 {
			hop = hop[i+1:]
		}
	} else {
		var err error
		if hop, err = one(h, by.client); err != nil {
			return "", err
		}
	}
	a, ok := clientip.ParseHop(hop)
	if !ok {
		return "", fmt.Errorf("header %s: its last address does not parse", by.client)
	}
	return keying.Key(a), nil
}

// one is the value of the header name, which the proxy sets once; bounded.
func one(h http.Header, name string) (string, error) {
	switch vals := h.Values(name); {
	case len(vals) == 0:
		return "", missing(name)
	case len(vals) > 1:
		return "", fmt.Errorf("header %s given %d times: the proxy sets it once", name, len(vals))
	case len(vals[0]) > maxForwardValue:
		return "", fmt.Errorf("header %s of %d bytes: at most %d", name, len(vals[0]), maxForwardValue)
	default:
		return vals[0], nil
	}
}

// missing is the error of a header the proxy should have sent.
func missing(name string) error {
	return fmt.Errorf("no %s header: the proxy named by from= sets it (services/limiter/README.md, \"Forward auth\")", name)
}

// splitURL splits the URL nginx and ingress-nginx write in the header
// name, $scheme://$http_host$request_uri, into its host and its
// request-target. The host is the client's Host header as it sent it,
// which nginx refuses only when it holds a '/', so the host ends at the
// first '/' and not where a URL's authority would ('?', '#'): else a
// client sending `Host: shop.example?` would have the path read as "/"
// and escape every rule of its real path.
func splitURL(name, u string) (host, target string, err error) {
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		return "", "", fmt.Errorf("header %s holds no URL (scheme://host/path)", name)
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return "", "", fmt.Errorf("header %s holds no path", name)
	}
	return rest[:i], rest[i:], nil
}

// hostName reports whether host (lower-case, without port: linkdomain.Host)
// is a host a request can name: an IP address, an IPv6 one in brackets,
// or labels of letters, digits, '-' and '_' of 1 to 63 characters.
func hostName(host string) bool {
	if ip, ok := strings.CutPrefix(host, "["); ok {
		a, err := netip.ParseAddr(strings.TrimSuffix(ip, "]"))
		return err == nil && a.Is6() && strings.HasSuffix(ip, "]")
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if host == "" || len(host) > linkdomain.MaxLength {
		return false
	}
	for label := range strings.SplitSeq(host, ".") {
		if label == "" || len(label) > linkdomain.MaxLabel || strings.IndexFunc(label, notHostChar) >= 0 {
			return false
		}
	}
	return true
}

// notHostChar reports a character no label of a host name holds.
func notHostChar(c rune) bool {
	return (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_'
}

// cleanPath is the path of a request-target as a router sees it, so that
// one resource is one counter whatever its spelling: the query and a
// fragment dropped (nginx routes /login#x as /login), percent-decoded,
// each segment's ;parameters dropped (Java's servers route
// /login;jsessionid=1 as /login), dot segments resolved and slashes
// merged, a trailing slash kept. Where routers differ, it takes the
// spellings together: counted more than once, never escaping a rule. An
// absolute-form target ("http://host/p") gives its path; false when it
// does not decode.
func cleanPath(target string) (string, bool) {
	if !strings.HasPrefix(target, "/") {
		if _, rest, ok := strings.Cut(target, "://"); ok {
			target = "/"
			if i := strings.IndexAny(rest, "/?#"); i >= 0 && rest[i] == '/' {
				target = rest[i:]
			}
		}
	}
	if i := strings.IndexAny(target, "?#"); i >= 0 {
		target = target[:i]
	}
	p, err := url.PathUnescape(target)
	if err != nil {
		return "", false
	}
	if p == "*" { // OPTIONS *
		return p, true
	}
	if strings.IndexByte(p, ';') >= 0 {
		segs := strings.Split(p, "/")
		for i, seg := range segs {
			segs[i], _, _ = strings.Cut(seg, ";")
		}
		p = strings.Join(segs, "/")
	}
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c, true
}

// setXRateLimit sets the X-RateLimit-Limit, -Remaining and -Reset fields
// Envoy's rate-limit filter adds (enable_x_ratelimit_headers:
// DRAFT_VERSION_03) from the statuses: those of the status with the least
// remaining (the first of them), the limit followed by every status's
// quota policy ("10, 10;w=60;name=\"per-ip\", 1000;w=3600"). Nothing when
// no status has a current limit.
func setXRateLimit(h http.Header, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) {
	var least *rlsv3.RateLimitResponse_DescriptorStatus
	for _, st := range statuses {
		if st.GetCurrentLimit() != nil && (least == nil || st.GetLimitRemaining() < least.GetLimitRemaining()) {
			least = st
		}
	}
	if least == nil {
		return
	}
	limit := strconv.FormatUint(uint64(least.GetCurrentLimit().GetRequestsPerUnit()), 10)
	for _, st := range statuses {
		l := st.GetCurrentLimit()
		w := unitSeconds(l.GetUnit())
		if l == nil || w == 0 {
			continue
		}
		limit += fmt.Sprintf(", %d;w=%d", l.GetRequestsPerUnit(), w)
		if l.GetName() != "" {
			limit += `;name="` + l.GetName() + `"`
		}
	}
	h["X-RateLimit-Limit"] = []string{limit}
	h["X-RateLimit-Remaining"] = []string{strconv.FormatUint(uint64(least.GetLimitRemaining()), 10)}
	h["X-RateLimit-Reset"] = []string{strconv.FormatInt(least.GetDurationUntilReset().GetSeconds(), 10)}
}

// unitSeconds is the length of one of Envoy's units in seconds (0 for
// UNKNOWN), as its filter counts them.
func unitSeconds(u rlsv3.RateLimitResponse_RateLimit_Unit) int64 {
	for _, e := range envoyUnits {
		if e.unit == u {
			return int64(e.d / time.Second)
		}
	}
	return 0
}
