package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/protobuf/proto"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkdomain"
)

// pathDomain returns the {name} of the path, refusing what cannot be a
// domain name before a service sees it.
func pathDomain(c *call) (string, error) {
	name := c.r.PathValue("name")
	if len(name) > linkdomain.MaxInput {
		return "", badRequest("the domain in the path is too long: at most 253 characters")
	}
	if strings.Contains(name, "/") {
		// %2F, decoded: no domain holds one, and the mapped route would
		// see two path segments.
		return "", badParameter("name", "the domain in the path must not contain '/'")
	}
	return name, nil
}

// queryDomain returns the ?domain= of a link route ("" for the default
// domain), bounded.
func queryDomain(c *call) (string, error) {
	d := c.r.URL.Query().Get("domain")
	if len(d) > linkdomain.MaxInput {
		return "", badRequest("domain is too long: at most 253 characters")
	}
	return d, nil
}

// checkDomain bounds the ?domain= of a mapped link route.
func checkDomain(c *call, _ []byte, _ url.Values) error {
	_, err := queryDomain(c)
	return err
}

// domainLocation is the Location of a registered domain.
func domainLocation(resp proto.Message) string {
	return "/v1/domains/" + resp.(*shortenerv1.RegisterDomainResponse).GetDomain().GetName()
}

// domainExisted reports a registration of a domain the tenant held
// already: it is answered unchanged, 200.
func domainExisted(resp proto.Message) bool {
	return !resp.(*shortenerv1.RegisterDomainResponse).GetCreated()
}

// asPathTenant is an administrator's call to the shortener as the path's
// {tenant}, which must exist: the context carries that tenant and the
// gateway's call timeout. With anonymousLinks, the path may also name the
// reserved tenant "anonymous" (callmeta.AnonymousTenant), which has no
// gw_tenants row (it is no tenant of the admin API: no key, plan row or
// suspension), but owns the links made without a key: a route on one link
// (deleteTenantLink) reaches them, whether or not Options.AllowAnonymous
// is on now, as links made while it was on live on after it. Strangers'
// links are the likeliest abuse, and this is the operator's only way to
// stop one short of SQL.
func (a *API) asPathTenant(c *call, anonymousLinks bool) (string, context.Context, context.CancelFunc, error) {
	tenant := c.r.PathValue("tenant")
	if !anonymousLinks || tenant != callmeta.AnonymousTenant {
		if _, err := a.keys.Tenant(c.r.Context(), tenant); err != nil {
			return "", nil, nil, storeError(err)
		}
	}
	ctx, cancel := context.WithTimeout(callmeta.Outgoing(c.r.Context(), tenant, c.st.ip), a.opts.CallTimeout)
	return tenant, ctx, cancel, nil
}

// approveDomain is the administrator's verification of a tenant's domain,
// without DNS: the shortener is called as that tenant.
func (a *API) approveDomain(c *call) error {
	name, err := pathDomain(c)
	if err != nil {
		return err
	}
	// Not the anonymous tenant's: it holds no domain (registering one
	// takes a key).
	_, ctx, cancel, err := a.asPathTenant(c, false)
	if err != nil {
		return err
	}
	defer cancel()
	resp, err := a.shortener.ApproveDomain(ctx, &shortenerv1.ApproveDomainRequest{Name: name})
	if err != nil {
		return err
	}
	body, err := marshalProto(resp.GetDomain())
	if err != nil {
		return err
	}
	send(c.w, http.StatusOK, "application/json", body)
	return nil
}

// releaseDomain removes a tenant's domain for the administrator (a dispute,
// a customer gone whose domain another now owns): the shortener's
// DeleteDomain called as that tenant, so exactly what the tenant's own
// DELETE /v1/domains/{name} does, the redirect told of a verified domain
// gone included. Refused like it while live links of the tenant are on the
// domain. A domain the tenant does not hold is 404.
func (a *API) releaseDomain(c *call) error {
	name, err := pathDomain(c)
	if err != nil {
		return err
	}
	tenant, ctx, cancel, err := a.asPathTenant(c, false)
	if err != nil {
		return err
	}
	defer cancel()
	if _, err := a.shortener.DeleteDomain(ctx, &shortenerv1.DeleteDomainRequest{Name: name}); err != nil {
		return err
	}
	a.log.InfoContext(c.r.Context(), "domain released", "tenant", tenant, "domain", name, "request_id", c.st.id)
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}

// deleteTenantLink deletes a tenant's link for the administrator: the
// shortener's DeleteLink called as that tenant, exactly the tenant's own
// DELETE /v1/links/{code}. A suspended tenant's keys are refused, so
// without it an operator dealing with an abuse (the offending links) or
// a disputed domain (refused while live links are on it) had to resume
// the tenant, its links redirecting again meanwhile, or use SQL, which
// tells no cache. The tenant may be "anonymous": its links have no key
// that could delete them at all (asPathTenant).
func (a *API) deleteTenantLink(c *call) error {
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	domain, err := queryDomain(c)
	if err != nil {
		return err
	}
	tenant, ctx, cancel, err := a.asPathTenant(c, true)
	if err != nil {
		return err
	}
	defer cancel()
	if _, err := a.shortener.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code, Domain: domain}); err != nil {
		return err
	}
	a.log.InfoContext(c.r.Context(), "link deleted by the administrator", "tenant", tenant, "code", code,
		"domain", domain, "request_id", c.st.id)
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}
