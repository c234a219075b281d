package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"kurz.dev/services/gateway/internal/keystore"
)

// tenantJSON is a tenant in the admin API.
type tenantJSON struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Plan       string `json:"plan"`
	CreateTime string `json:"createTime"`
	// State is "active" or "suspended"; a suspended tenant has
	// SuspendTime and SuspendReason.
	State         string `json:"state"`
	SuspendTime   string `json:"suspendTime,omitempty"`
	SuspendReason string `json:"suspendReason,omitempty"`
}

// keyJSON is an API key's metadata; Key is set only in the answer that
// creates it.
type keyJSON struct {
	ID         string `json:"id"`
	Key        string `json:"key,omitempty"`
	Tenant     string `json:"tenant"`
	Name       string `json:"name"`
	CreateTime string `json:"createTime"`
	RevokeTime string `json:"revokeTime,omitempty"`
}

func timeJSON(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func tenantOut(t keystore.Tenant) tenantJSON {
	out := tenantJSON{ID: t.ID, Name: t.Name, Plan: t.Plan, CreateTime: timeJSON(t.Created), State: "active"}
	if t.Suspended != nil {
		out.State, out.SuspendTime, out.SuspendReason = "suspended", timeJSON(*t.Suspended), t.SuspendReason
	}
	return out
}

func keyOut(k keystore.Key) keyJSON {
	out := keyJSON{ID: k.ID, Tenant: k.Tenant, Name: k.Name, CreateTime: timeJSON(k.Created)}
	if k.Revoked != nil {
		out.RevokeTime = timeJSON(*k.Revoked)
	}
	return out
}

// storeError maps the key store's errors to answers.
func storeError(err error) error {
	var unknown *keystore.UnknownPlanError
	switch {
	case errors.Is(err, keystore.ErrNotFound):
		return notFound("no such tenant or key")
	case errors.Is(err, keystore.ErrExists):
		return newError(http.StatusConflict, "ALREADY_EXISTS", "a tenant with this id exists already")
	case errors.As(err, &unknown):
		return badRequest(unknown.Error())
	case errors.Is(err, keystore.ErrSuspensionsUnavailable):
		return unavailable("suspensions cannot be written: the shortener's tenant_suspensions table is not in the gateway's database (start the shortener of this version on it: it applies its schema)", err)
	case errors.Is(err, keystore.ErrPlansUnavailable):
		return unavailable("plans cannot be set: the limiter's rule tables are not in the gateway's database (run the limiter with KURZ_LIMITER_RULES_SOURCE=postgres on it)", err)
	}
	return internalError(err)
}

// checkPlan refuses a plan that is not text (isText), which no plan is:
// PostgreSQL fails on a NUL where it would otherwise find the plan unknown
// (the store's UnknownPlanError).
func checkPlan(plan string) error {
	if !isText(plan) {
		return badParameter("plan", "plan must be UTF-8 text without control characters")
	}
	return nil
}

func (a *API) createTenant(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var body struct {
		ID   string `json:"id"`
		Name string `json:"name"`
		Plan string `json:"plan"`
	}
	if err := decodeJSON(b, &body); err != nil {
		return err
	}
	if p := keystore.TenantIDProblem(body.ID); p != "" {
		return badRequest(p)
	}
	if p := keystore.NameProblem(body.Name); p != "" {
		return badRequest(p)
	}
	if body.Plan == "" {
		return badRequest("plan is required, e.g. \"free\" or \"pro\"")
	}
	if err := checkPlan(body.Plan); err != nil {
		return err
	}
	t, err := a.keys.CreateTenant(c.r.Context(), keystore.Tenant{ID: body.ID, Name: body.Name, Plan: body.Plan})
	if err != nil {
		return storeError(err)
	}
	a.log.InfoContext(c.r.Context(), "tenant created", "tenant", t.ID, "plan", t.Plan, "request_id", c.st.id)
	c.w.Header().Set("Location", "/v1/admin/tenants/"+t.ID)
	writeJSON(c.w, http.StatusCreated, tenantOut(t))
	return nil
}

func (a *API) getTenant(c *call) error {
	t, err := a.keys.Tenant(c.r.Context(), c.r.PathValue("tenant"))
	if err != nil {
		return storeError(err)
	}
	writeJSON(c.w, http.StatusOK, tenantOut(t))
	return nil
}

// Tenant listing's page sizes, as the links list has them.
const (
	defaultTenantPage = 50
	maxTenantPage     = 1000
	// maxPlanFilter bounds ?plan=: far above any plan's name.
	maxPlanFilter = 200
)

// tenantCursor is a tenant listing's page token: the last id of the page
// and the filters of the listing, so that a token continues only the
// listing it came from (a token of ?state=suspended read with other
// filters would skip or repeat tenants without a word).
type tenantCursor struct {
	After string `json:"a"`
	State string `json:"s,omitempty"`
	Plan  string `json:"p,omitempty"`
}

func (c tenantCursor) encode() string {
	b, _ := json.Marshal(c) // cannot fail: three strings
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeTenantCursor reads back a token of encode issued to a listing with
// state and plan; anything else is a 400 naming page_token. Its id is any
// PostgreSQL can hold (UTF-8 text without NUL), not only what the create
// route takes (TenantIDProblem): gw_tenants has no check, a tenant written
// by SQL or an older version may have another id, and a page may end on
// it, so its token must continue the walk. A token forged with another id
// only moves where the walk starts.
func decodeTenantCursor(token, state, plan string) (tenantCursor, error) {
	var c tenantCursor
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || json.Unmarshal(b, &c) != nil || c.After == "" || !utf8.ValidString(c.After) || strings.ContainsRune(c.After, 0) {
		return c, badParameter("page_token", "page_token is not one this API issued; start again without it")
	}
	if c.State != state || c.Plan != plan {
		return c, badParameter("page_token", "page_token belongs to a listing with other filters: pass the state and plan of the call that returned it, or start again without a token")
	}
	return c, nil
}

// listTenants pages through the tenants in id order, optionally those in
// one state (?state=active|suspended) or on one plan (?plan=, refused
// when neither a tenant nor the limiter has it). Each item is what GET
// /v1/admin/tenants/{tenant} shows.
func (a *API) listTenants(c *call) error {
	q := c.r.URL.Query()
	size := defaultTenantPage
	if q.Has("page_size") {
		n, err := strconv.Atoi(q.Get("page_size"))
		if err != nil || n < 1 || n > maxTenantPage {
			return badParameter("page_size", fmt.Sprintf("page_size must be a whole number from 1 to %d", maxTenantPage))
		}
		size = n
	}
	var f keystore.TenantFilter
	state, plan := q.Get("state"), q.Get("plan")
	switch state {
	case "":
	case "active", "suspended":
		suspended := state == "suspended"
		f.Suspended = &suspended
	default:
		return badParameter("state", "state must be active or suspended")
	}
	if len(plan) > maxPlanFilter {
		return badParameter("plan", fmt.Sprintf("plan must be at most %d bytes", maxPlanFilter))
	}
	if err := checkPlan(plan); err != nil {
		return err
	}
	f.Plan = plan
	var after string
	if token := q.Get("page_token"); token != "" {
		cur, err := decodeTenantCursor(token, state, plan)
		if err != nil {
			return err
		}
		after = cur.After
	}
	// One more than the page: whether it exists decides the next token.
	tenants, err := a.keys.ListTenants(c.r.Context(), f, after, size+1)
	var unknown *keystore.UnknownPlanError
	if errors.As(err, &unknown) {
		return badParameter("plan", unknown.Error())
	}
	if err != nil {
		return storeError(err)
	}
	out := struct {
		Tenants       []tenantJSON `json:"tenants"`
		NextPageToken string       `json:"nextPageToken"`
	}{Tenants: []tenantJSON{}}
	if len(tenants) > size {
		tenants = tenants[:size]
		out.NextPageToken = tenantCursor{After: tenants[size-1].ID, State: state, Plan: plan}.encode()
	}
	for _, t := range tenants {
		out.Tenants = append(out.Tenants, tenantOut(t))
	}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// updateTenant changes a tenant's plan; the limiter applies it within a
// second (its rule tables NOTIFY every limiter).
func (a *API) updateTenant(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var body struct {
		Plan string `json:"plan"`
	}
	if err := decodeJSON(b, &body); err != nil {
		return err
	}
	if body.Plan == "" {
		return badRequest("plan is required: PATCH changes a tenant's plan")
	}
	if err := checkPlan(body.Plan); err != nil {
		return err
	}
	t, err := a.keys.SetPlan(c.r.Context(), c.r.PathValue("tenant"), body.Plan)
	if err != nil {
		return storeError(err)
	}
	a.log.InfoContext(c.r.Context(), "tenant plan changed", "tenant", t.ID, "plan", t.Plan, "request_id", c.st.id)
	writeJSON(c.w, http.StatusOK, tenantOut(t))
	return nil
}

// suspendTenant stops a tenant at once, for abuse: its keys answer 403
// TENANT_SUSPENDED from the next request on, the redirect answers its
// links 410 and the webhook sender holds its deliveries within their
// refresh of the suspensions (KURZ_REDIRECT_SUSPENSION_REFRESH,
// KURZ_SHORTENER_WEBHOOK_POLL_INTERVAL). Nothing of the tenant is changed, so
// resumeTenant brings back exactly what was. Idempotent: a second suspend
// keeps the first's time and takes the new reason.
func (a *API) suspendTenant(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(b, &body); err != nil {
		return err
	}
	if p := keystore.ReasonProblem(body.Reason); p != "" {
		return badParameter("reason", p)
	}
	t, err := a.keys.Suspend(c.r.Context(), c.r.PathValue("tenant"), body.Reason)
	if err != nil {
		return storeError(err)
	}
	a.log.InfoContext(c.r.Context(), "tenant suspended", "tenant", t.ID, "reason", t.SuspendReason,
		"since", timeJSON(*t.Suspended), "request_id", c.st.id)
	writeJSON(c.w, http.StatusOK, tenantOut(t))
	return nil
}

// resumeTenant ends a suspension; resuming an active tenant changes
// nothing. Its body, if any, is an empty JSON object.
func (a *API) resumeTenant(c *call) error {
	b, err := a.readBody(c, true)
	if err != nil {
		return err
	}
	if len(b) > 0 {
		if err := decodeJSON(b, &struct{}{}); err != nil {
			return err
		}
	}
	t, err := a.keys.Resume(c.r.Context(), c.r.PathValue("tenant"))
	if err != nil {
		return storeError(err)
	}
	a.log.InfoContext(c.r.Context(), "tenant resumed", "tenant", t.ID, "request_id", c.st.id)
	writeJSON(c.w, http.StatusOK, tenantOut(t))
	return nil
}

// issueKey creates a key and shows it, once.
func (a *API) issueKey(c *call) error {
	b, err := a.readBody(c, true)
	if err != nil {
		return err
	}
	var body struct {
		Name string `json:"name"`
	}
	if len(b) > 0 {
		if err := decodeJSON(b, &body); err != nil {
			return err
		}
	}
	if p := keystore.NameProblem(body.Name); p != "" {
		return badRequest(p)
	}
	tenant := c.r.PathValue("tenant")
	k, full, err := a.keys.IssueKey(c.r.Context(), tenant, body.Name)
	if err != nil {
		return storeError(err)
	}
	a.log.InfoContext(c.r.Context(), "api key issued", "tenant", tenant, "key_id", k.ID, "request_id", c.st.id)
	out := keyOut(k)
	out.Key = full
	c.w.Header().Set("Cache-Control", "no-store")
	// The tenant's list of keys, where the new one shows: no route serves
	// one key alone (only DELETE .../keys/{key}).
	c.w.Header().Set("Location", "/v1/admin/tenants/"+url.PathEscape(tenant)+"/keys")
	writeJSON(c.w, http.StatusCreated, out)
	return nil
}

func (a *API) listKeys(c *call) error {
	keys, err := a.keys.Keys(c.r.Context(), c.r.PathValue("tenant"))
	if err != nil {
		return storeError(err)
	}
	out := struct {
		Keys []keyJSON `json:"keys"`
	}{Keys: []keyJSON{}}
	for _, k := range keys {
		out.Keys = append(out.Keys, keyOut(k))
	}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// revokeKey revokes a key: the very next request with it is refused.
func (a *API) revokeKey(c *call) error {
	tenant, id := c.r.PathValue("tenant"), c.r.PathValue("key")
	if _, err := a.keys.RevokeKey(c.r.Context(), tenant, id); err != nil {
		return storeError(err)
	}
	a.log.InfoContext(c.r.Context(), "api key revoked", "tenant", tenant, "key_id", id, "request_id", c.st.id)
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}
