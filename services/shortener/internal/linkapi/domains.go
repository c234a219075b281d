package linkapi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/textcut"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// Reasons of the domain RPCs' errors.
const (
	ReasonDomainInvalid     = "DOMAIN_INVALID"
	ReasonDomainTaken       = "DOMAIN_TAKEN"
	ReasonDomainLimit       = "DOMAIN_LIMIT"
	ReasonDomainInUse       = "DOMAIN_IN_USE"
	ReasonDomainNotVerified = "DOMAIN_NOT_VERIFIED"
	ReasonDNSUnavailable    = "DNS_UNAVAILABLE"
)

// maxListedDomains bounds ListDomains: KURZ_SHORTENER_MAX_DOMAINS's
// largest value, so that lowering the setting hides no domain.
const maxListedDomains = 10_000

// dnsAnswerMargin is what VerifyDomain leaves of the caller's deadline to
// answer after a TXT lookup that took all it could.
const dnsAnswerMargin = 500 * time.Millisecond

// TokenPrefix starts every verification token: the TXT record's value is
// "kurz-verify=<random>".
const TokenPrefix = "kurz-verify="

// TXTResolver looks up DNS TXT records: *net.Resolver in production, a fake
// in tests (no test asks the outside world).
type TXTResolver interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// DomainStore keeps tenants' domains (linkstore.Store in production).
type DomainStore interface {
	RegisterDomain(ctx context.Context, tenant, name, token string, max int) (linkstore.Domain, bool, error)
	GetDomain(ctx context.Context, tenant, name string) (linkstore.Domain, error)
	ListDomains(ctx context.Context, tenant string, limit int) ([]linkstore.Domain, error)
	VerifyDomain(ctx context.Context, tenant, name, by string) (linkstore.Domain, error)
	// DeleteDomain reports whether the domain deleted was verified.
	DeleteDomain(ctx context.Context, tenant, name string) (verified bool, err error)
	// Served returns those of names that some tenant has verified.
	Served(ctx context.Context, names []string) (map[string]bool, error)
}

// domainErrors are the domain store's sentinels as clients see them. A
// domain another tenant holds is refused without naming the tenant.
var domainErrors = []rpcerr.Sentinel{
	{Err: linkstore.ErrDomainNotFound, Code: codes.NotFound,
		Message: "no such domain: register it first (domains of other tenants are not visible)"},
	{Err: linkstore.ErrDomainTaken, Code: codes.AlreadyExists, Reason: ReasonDomainTaken,
		Message: "another tenant has verified this domain; it cannot be registered or verified again"},
	{Err: linkstore.ErrDomainInUse, Code: codes.FailedPrecondition, Reason: ReasonDomainInUse,
		Message: "live links use this domain: delete them first"},
}

// domainName normalises a request's domain name; field names it in errors.
func (s *Service) domainName(field, name string) (string, error) {
	n, err := linkdomain.Normalize(name)
	if err != nil {
		return "", rpcerr.Invalidf(field, ReasonDomainInvalid, "%s: %s", field, err.Error())
	}
	if slices.Contains(s.opts.OwnHosts, n) {
		return "", rpcerr.Invalidf(field, ReasonDomainInvalid, "%s: %s is kurz's own domain, which every tenant shares", field, n)
	}
	// Browsers read a name whose last label is a number (0x7f.0x0.0x0.0x1)
	// as an IPv4 address, and local names never reach the redirect from
	// the internet: neither is a domain a tenant can publish links on.
	if _, numeric, _ := urlcheck.ParseHostIPv4(n); numeric {
		return "", rpcerr.Invalidf(field, ReasonDomainInvalid, "%s: %s ends in a number, which browsers read as an IP address: register a domain name", field, n)
	}
	if urlcheck.LocalName(n) {
		return "", rpcerr.Invalidf(field, ReasonDomainInvalid, "%s: %s is a local network's name (localhost, .local, .internal, .lan, .home.arpa, .localdomain): register a public domain", field, n)
	}
	// Checked at registration only: a longer name verified by an
	// administrator before this bound existed stays usable and deletable.
	if len(n) > linkdomain.MaxRegistered {
		return "", rpcerr.Invalidf(field, ReasonDomainInvalid,
			"%s: a custom domain has at most %d characters, so that its verification record %s<name> fits DNS's %d",
			field, linkdomain.MaxRegistered, linkdomain.ChallengePrefix, linkdomain.MaxLength)
	}
	return n, nil
}

func (s *Service) domainStatus(ctx context.Context, op string, err error) error {
	if s.domains == nil {
		return rpcerr.WithDetails(codes.Unimplemented, "custom domains are not enabled on this server")
	}
	if storeUnreachable(err) {
		return toStatus(ctx, s.log, op, err)
	}
	var inv *rpcerr.Invalid
	if errors.As(err, &inv) {
		return inv.Status()
	}
	for _, sen := range domainErrors {
		if errors.Is(err, sen.Err) {
			return rpcerr.ToStatus(ctx, s.log.With("op", op), err, domainErrors)
		}
	}
	return toStatus(ctx, s.log, op, err)
}

func (s *Service) domainProto(d linkstore.Domain) *shortenerv1.Domain {
	p := &shortenerv1.Domain{
		Name: d.Name, Tenant: d.Tenant, Verified: d.Verified != nil,
		VerificationRecord: linkdomain.ChallengePrefix + d.Name, VerificationToken: d.Token,
		CreateTime: timestamppb.New(d.Created), VerifiedBy: d.VerifiedBy,
	}
	if d.Verified != nil {
		p.VerifyTime = timestamppb.New(*d.Verified)
	}
	return p
}

// RegisterDomain adds a domain to the caller's tenant, unverified, with a
// fresh verification token.
func (s *Service) RegisterDomain(ctx context.Context, req *shortenerv1.RegisterDomainRequest) (*shortenerv1.RegisterDomainResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if s.domains == nil {
		return nil, s.domainStatus(ctx, "register domain", nil)
	}
	name, err := s.domainName("name", req.GetName())
	if err != nil {
		return nil, s.domainStatus(ctx, "register domain", err)
	}
	d, created, err := s.domains.RegisterDomain(ctx, tenant, name, TokenPrefix+rand.Text(), s.opts.MaxDomains)
	if errors.Is(err, linkstore.ErrDomainLimit) {
		return nil, rpcerr.WithDetails(codes.FailedPrecondition,
			fmt.Sprintf("a tenant holds at most %d domains: delete one first", s.opts.MaxDomains),
			rpcerr.Info(ReasonDomainLimit, nil))
	}
	if err != nil {
		return nil, s.domainStatus(ctx, "register domain", err)
	}
	return &shortenerv1.RegisterDomainResponse{Domain: s.domainProto(d), Created: created}, nil
}

// ListDomains returns the caller's domains by name.
func (s *Service) ListDomains(ctx context.Context, _ *shortenerv1.ListDomainsRequest) (*shortenerv1.ListDomainsResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if s.domains == nil {
		return nil, s.domainStatus(ctx, "list domains", nil)
	}
	ds, err := s.domains.ListDomains(ctx, tenant, maxListedDomains)
	if err != nil {
		return nil, s.domainStatus(ctx, "list domains", err)
	}
	resp := &shortenerv1.ListDomainsResponse{Domains: make([]*shortenerv1.Domain, 0, len(ds))}
	for _, d := range ds {
		resp.Domains = append(resp.Domains, s.domainProto(d))
	}
	return resp, nil
}

// GetDomain returns one of the caller's domains.
func (s *Service) GetDomain(ctx context.Context, req *shortenerv1.GetDomainRequest) (*shortenerv1.GetDomainResponse, error) {
	d, err := s.ownDomain(ctx, "get domain", req.GetName())
	if err != nil {
		return nil, err
	}
	return &shortenerv1.GetDomainResponse{Domain: s.domainProto(d)}, nil
}

// ownDomain reads the caller's domain name; a malformed name is NOT_FOUND,
// like a name the caller does not hold.
func (s *Service) ownDomain(ctx context.Context, op, name string) (linkstore.Domain, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return linkstore.Domain{}, err
	}
	if s.domains == nil {
		return linkstore.Domain{}, s.domainStatus(ctx, op, nil)
	}
	n, err := linkdomain.Normalize(name)
	if err != nil {
		return linkstore.Domain{}, s.domainStatus(ctx, op, linkstore.ErrDomainNotFound)
	}
	d, err := s.domains.GetDomain(ctx, tenant, n)
	if err != nil {
		return linkstore.Domain{}, s.domainStatus(ctx, op, err)
	}
	return d, nil
}

// VerifyDomain checks the domain's TXT record _kurz-challenge.<name> (one
// lookup, bounded by Options.DNSTimeout and the call's deadline): when one
// of its values is the domain's token, the domain is verified. A verified
// domain stays verified.
func (s *Service) VerifyDomain(ctx context.Context, req *shortenerv1.VerifyDomainRequest) (*shortenerv1.VerifyDomainResponse, error) {
	d, err := s.ownDomain(ctx, "verify domain", req.GetName())
	if err != nil {
		return nil, err
	}
	if d.Verified != nil {
		return &shortenerv1.VerifyDomainResponse{Domain: s.domainProto(d)}, nil
	}
	if s.txt == nil {
		return nil, rpcerr.WithDetails(codes.FailedPrecondition,
			"DNS verification is not enabled on this server: ask an administrator to approve the domain",
			rpcerr.Info(ReasonDomainNotVerified, nil))
	}
	record := linkdomain.ChallengePrefix + d.Name
	// The caller's deadline bounds the lookup too, less a moment to
	// answer: a lookup that ran into it would be the caller's
	// DEADLINE_EXCEEDED, which says nothing about DNS.
	timeout := s.opts.DNSTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline)-dnsAnswerMargin)
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	// The name is absolute (a trailing dot): a relative one goes through
	// the resolver's search list first (a cluster's ndots:5), and a record
	// of the same name in one of those zones would verify the domain.
	values, err := s.txt.LookupTXT(lctx, record+".")
	cancel()
	if err != nil && !notFoundDNS(err) {
		s.log.InfoContext(ctx, "TXT lookup failed", "record", record, "err", err)
		return nil, rpcerr.RetryLater(codes.Unavailable, ReasonDNSUnavailable,
			"the DNS lookup of "+record+" failed; try again", 5*time.Second, nil)
	}
	if !slices.ContainsFunc(values, func(v string) bool { return strings.TrimSpace(v) == d.Token }) {
		return nil, rpcerr.WithDetails(codes.FailedPrecondition,
			fmt.Sprintf("the TXT record %s does not hold %q yet: add it, wait for DNS to publish it, and verify again", record, d.Token),
			rpcerr.Info(ReasonDomainNotVerified, map[string]string{"record": record}))
	}
	tenant, _ := s.tenant(ctx)
	d, err = s.domains.VerifyDomain(ctx, tenant, d.Name, "dns")
	if err != nil {
		return nil, s.domainStatus(ctx, "verify domain", err)
	}
	s.log.InfoContext(ctx, "domain verified", "domain", d.Name, "tenant", tenant, "by", "dns")
	s.domainChanged(ctx, d.Name)
	return &shortenerv1.VerifyDomainResponse{Domain: s.domainProto(d)}, nil
}

// domainChanged tells the redirect pods that the verified set changed
// (linkdomain.ChangedChannel), after the commit. A failure is logged only:
// the pods' periodic refresh (KURZ_REDIRECT_DOMAIN_REFRESH) catches up.
func (s *Service) domainChanged(ctx context.Context, name string) {
	if s.rdb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.CacheTimeout)
	defer cancel()
	if err := s.rdb.Publish(ctx, linkdomain.ChangedChannel, name).Err(); err != nil {
		s.log.WarnContext(ctx, "domain change not published; redirect pods see it at their next refresh", "domain", name, "err", err)
	}
}

// notFoundDNS reports whether a lookup error means "no such record" (an
// answer), rather than a failed lookup.
func notFoundDNS(err error) bool {
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) && dnsErr.IsNotFound
}

// ApproveDomain verifies the named tenant's domain without a DNS check: an
// administrator's decision (the gateway's admin API).
func (s *Service) ApproveDomain(ctx context.Context, req *shortenerv1.ApproveDomainRequest) (*shortenerv1.ApproveDomainResponse, error) {
	d, err := s.ownDomain(ctx, "approve domain", req.GetName())
	if err != nil {
		return nil, err
	}
	// Approving a verified domain changes nothing the redirect serves.
	if d.Verified != nil {
		return &shortenerv1.ApproveDomainResponse{Domain: s.domainProto(d)}, nil
	}
	if d, err = s.domains.VerifyDomain(ctx, d.Tenant, d.Name, "admin"); err != nil {
		return nil, s.domainStatus(ctx, "approve domain", err)
	}
	s.log.InfoContext(ctx, "domain verified", "domain", d.Name, "tenant", d.Tenant, "by", d.VerifiedBy)
	s.domainChanged(ctx, d.Name)
	return &shortenerv1.ApproveDomainResponse{Domain: s.domainProto(d)}, nil
}

// DeleteDomain removes one of the caller's domains, unless live links use it.
func (s *Service) DeleteDomain(ctx context.Context, req *shortenerv1.DeleteDomainRequest) (*shortenerv1.DeleteDomainResponse, error) {
	d, err := s.ownDomain(ctx, "delete domain", req.GetName())
	if err != nil {
		return nil, err
	}
	verified, err := s.domains.DeleteDomain(ctx, d.Tenant, d.Name)
	if err != nil {
		return nil, s.domainStatus(ctx, "delete domain", err)
	}
	// An unverified claim was never served: every redirect pod re-reads
	// the verified set on a message, so a tenant registering and deleting
	// claims must not be able to make them do so.
	if verified {
		s.domainChanged(ctx, d.Name)
	}
	return &shortenerv1.DeleteDomainResponse{}, nil
}

// linkDomain checks the domain of a new link: "" (the default domain, also
// when name is one of kurz's own hosts), or one of tenant's verified
// domains, normalised. Another tenant's domain is refused like one that
// does not exist.
func (s *Service) linkDomain(ctx context.Context, tenant, name string) (string, error) {
	if name == "" || s.ownHost(name) {
		return "", nil
	}
	n, err := linkdomain.Normalize(name)
	if err == nil && s.domains != nil {
		var d linkstore.Domain
		d, err = s.domains.GetDomain(ctx, tenant, n)
		switch {
		case err == nil && d.Verified != nil:
			return n, nil
		case err != nil && !errors.Is(err, linkstore.ErrDomainNotFound):
			return "", err
		}
	}
	return "", notVerified(name)
}

// ownHost reports whether name is one of kurz's own hosts (the base URL's,
// KURZ_SHORTENER_OWN_HOSTS), a port allowed: the default domain under the
// name its short URLs carry, which a client sends back as the domain of a
// link (a Bitly client configured with its branded short domain does),
// and which no tenant can register.
func (s *Service) ownHost(name string) bool {
	h, err := urlcheck.OwnHost(name)
	return err == nil && slices.Contains(s.opts.OwnHosts, h)
}

// tenantDomains is a tenant's verified domains, read once for a batch.
type tenantDomains struct {
	verified map[string]bool
	// own reports kurz's own hosts (Service.ownHost).
	own func(string) bool
}

// verifiedDomains reads tenant's verified domains (one statement).
func (s *Service) verifiedDomains(ctx context.Context, tenant string) (*tenantDomains, error) {
	td := &tenantDomains{verified: map[string]bool{}, own: s.ownHost}
	if s.domains == nil {
		return td, nil
	}
	ds, err := s.domains.ListDomains(ctx, tenant, maxListedDomains)
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		if d.Verified != nil {
			td.verified[d.Name] = true
		}
	}
	return td, nil
}

// check is linkDomain against the domains read: name normalised if it is
// one of them, "" for the default domain, else the same refusal.
func (td *tenantDomains) check(name string) (string, error) {
	if name == "" || td.own(name) {
		return "", nil
	}
	if n, err := linkdomain.Normalize(name); err == nil && td.verified[n] {
		return n, nil
	}
	return "", notVerified(name)
}

// loopOn refuses a link on a custom domain ("" refuses none) any of whose
// destinations ds (its long URL, a device's URL, a rule's or a variant's)
// is on that same domain: the redirect serves the domain, so visitors
// would be sent back to it, every visit counted, for ever. kurz's own
// hosts are refused for every link by urlcheck (OwnHosts), other served
// domains by servedLoops; the link's own is known without a query.
func loopOn(domain string, ds []destination) error {
	if domain == "" {
		return nil
	}
	for _, d := range ds {
		if hostOf(d.url) == domain {
			return rpcerr.BadRequest(d.field, urlcheck.ReasonLoop,
				fmt.Sprintf("%s: links to %s are refused on that domain: they would redirect in a loop", d.field, textcut.Echo(domain, maxEchoedDomain)))
		}
	}
	return nil
}

// destination is one URL a link sends visitors to, by its request field.
type destination struct{ field, url string }

// destinations lists a link's URLs (empty ones, which an update leaves
// unchanged, skipped).
func destinations(longURL string, t linkstore.DeviceURLs, rules []linkrules.Rule, variants []linkrules.Variant) []destination {
	ds := []destination{{"long_url", longURL}, {"device_targets.ios_url", t.IOS},
		{"device_targets.android_url", t.Android}, {"device_targets.desktop_url", t.Desktop}}
	for i, r := range rules {
		ds = append(ds, destination{fmt.Sprintf("rules[%d].url", i), r.URL})
	}
	for i, v := range variants {
		ds = append(ds, destination{fmt.Sprintf("variants[%d].url", i), v.URL})
	}
	return slices.DeleteFunc(ds, func(d destination) bool { return d.url == "" })
}

// destinationsOf is destinations for a link about to be created.
func destinationsOf(l linkstore.Link) []destination {
	var rules []linkrules.Rule
	var variants []linkrules.Variant
	if l.Rules != nil {
		rules, variants = l.Rules.Rules, l.Rules.Variants
	}
	return destinations(l.LongURL, linkstore.DeviceURLs{IOS: l.IOSURL, Android: l.AndroidURL, Desktop: l.DesktopURL}, rules, variants)
}

// hostOf is a destination's host as domains are stored, "" if none.
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return linkdomain.Host(u.Host)
}

// servedLoops refuses, for each link (by index), the first destination on
// a custom domain the redirect serves, whichever tenant verified it: such
// a link sends its visitors to another kurz link, and two of them, on two
// domains, to each other for ever (kurz's own hosts are refused by
// urlcheck, the link's own domain by selfLoop). One statement for all the
// links. It returns the refusals by index.
func (s *Service) servedLoops(ctx context.Context, links [][]destination) (map[int]error, error) {
	if s.domains == nil {
		return nil, nil
	}
	var hosts []string
	for _, ds := range links {
		hosts = appendHosts(hosts, ds)
	}
	served, err := s.domains.Served(ctx, hosts)
	if err != nil || len(served) == 0 {
		return nil, err
	}
	refused := map[int]error{}
	for i, ds := range links {
		for _, d := range ds {
			if h := hostOf(d.url); served[h] {
				refused[i] = rpcerr.BadRequest(d.field, urlcheck.ReasonLoop,
					fmt.Sprintf("%s: %s is a short domain kurz serves: a link to it could redirect in a loop", d.field, textcut.Echo(h, maxEchoedDomain)))
				break
			}
		}
	}
	return refused, nil
}

// refuseHosts lists the hosts of ds for an insert to refuse when one is
// served (linkstore.Link.RefuseHosts); none without custom domains.
func (s *Service) refuseHosts(ds []destination) []string {
	if s.domains == nil {
		return nil
	}
	return appendHosts(nil, ds)
}

// appendHosts appends the hosts of ds that hosts does not hold yet.
func appendHosts(hosts []string, ds []destination) []string {
	for _, d := range ds {
		if h := hostOf(d.url); h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// servedLoop explains an insert refused for a served destination
// (linkstore.ErrHostServed): the field and host, as servedLoops does (the
// domain may have been unverified since: the first destination then).
func (s *Service) servedLoop(ctx context.Context, ds []destination) error {
	refused, err := s.servedLoops(ctx, [][]destination{ds})
	if err != nil {
		return toStatus(ctx, s.log, "create", err)
	}
	if refused[0] != nil {
		return refused[0]
	}
	return rpcerr.BadRequest(ds[0].field, urlcheck.ReasonLoop,
		fmt.Sprintf("%s: a destination was on a short domain kurz serves: a link to it could redirect in a loop", ds[0].field))
}

// notVerified refuses a link's domain that is not one of the caller's
// verified domains, whether it exists or not.
func notVerified(name string) error {
	return rpcerr.Invalidf("domain", ReasonDomainNotVerified,
		"domain: %q is not one of your verified domains (register and verify it first, or leave domain empty for the default)", textcut.Echo(name, maxEchoedDomain))
}

// maxEchoedDomain bounds what a message repeats of a stranger's domain
// or host.
const maxEchoedDomain = 64

// linkKey is the key of a request's link: code on domain. ok is false for a
// malformed domain, which names no link.
func linkKey(domain, code string) (string, bool) {
	if domain == "" {
		return code, true
	}
	n, err := linkdomain.Normalize(domain)
	if err != nil {
		return "", false
	}
	return linkdomain.Key(n, code), true
}
