package httpapi

import (
	"context"
	"net/http"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkdomain"
)

// pathDomain returns the {name} of the path, refusing what cannot be a
// domain name before a service sees it.
func pathDomain(c *call) (string, error) {
	name := c.r.PathValue("name")
	if len(name) > linkdomain.MaxLength+1 {
		return "", badRequest("the domain in the path is too long: at most 253 characters")
	}
	return name, nil
}

// queryDomain returns the ?domain= of a link route ("" for the default
// domain), bounded.
func queryDomain(c *call) (string, error) {
	d := c.r.URL.Query().Get("domain")
	if len(d) > linkdomain.MaxLength+1 {
		return "", badRequest("domain is too long: at most 253 characters")
	}
	return d, nil
}

func (a *API) registerDomain(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var req shortenerv1.RegisterDomainRequest
	if err := decodeProto(b, &req); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.RegisterDomain(ctx, &req)
	if err != nil {
		return err
	}
	c.w.Header().Set("Location", "/v1/domains/"+resp.GetDomain().GetName())
	return writeProto(c.w, http.StatusCreated, resp.GetDomain())
}

func (a *API) listDomains(c *call) error {
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.ListDomains(ctx, &shortenerv1.ListDomainsRequest{})
	if err != nil {
		return err
	}
	if resp.Domains == nil {
		resp.Domains = []*shortenerv1.Domain{} // "domains": [] rather than nothing
	}
	return writeProto(c.w, http.StatusOK, resp)
}

func (a *API) getDomain(c *call) error {
	name, err := pathDomain(c)
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.GetDomain(ctx, &shortenerv1.GetDomainRequest{Name: name})
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, resp.GetDomain())
}

func (a *API) verifyDomain(c *call) error {
	name, err := pathDomain(c)
	if err != nil {
		return err
	}
	// One DNS lookup may take the shortener's whole DNS timeout.
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.VerifyDomain(ctx, &shortenerv1.VerifyDomainRequest{Name: name})
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, resp.GetDomain())
}

func (a *API) deleteDomain(c *call) error {
	name, err := pathDomain(c)
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	if _, err := a.shortener.DeleteDomain(ctx, &shortenerv1.DeleteDomainRequest{Name: name}); err != nil {
		return err
	}
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}

// approveDomain is the administrator's verification of a tenant's domain,
// without DNS: the shortener is called as that tenant.
func (a *API) approveDomain(c *call) error {
	name, err := pathDomain(c)
	if err != nil {
		return err
	}
	tenant := c.r.PathValue("tenant")
	if _, err := a.keys.Tenant(c.r.Context(), tenant); err != nil {
		return storeError(err)
	}
	ctx, cancel := context.WithTimeout(callmeta.Outgoing(c.r.Context(), tenant, c.st.ip), a.opts.CallTimeout)
	defer cancel()
	resp, err := a.shortener.ApproveDomain(ctx, &shortenerv1.ApproveDomainRequest{Name: name})
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, resp.GetDomain())
}
