package webhook

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/shortener/internal/linkapi"
)

// Events are the event types a subscription can ask for.
var Events = []string{"link.created", "link.updated", "link.deleted", "link.clicked"}

// ErrorInfo reasons of the webhook API.
const (
	ReasonURLInvalid         = "WEBHOOK_URL_INVALID"
	ReasonEventUnknown       = "WEBHOOK_EVENT_UNKNOWN"
	ReasonDescriptionTooLong = "WEBHOOK_DESCRIPTION_TOO_LONG"
	ReasonDescriptionInvalid = "WEBHOOK_DESCRIPTION_INVALID"
	ReasonTooMany            = "WEBHOOK_LIMIT_REACHED"
	ReasonNotFound           = "WEBHOOK_NOT_FOUND"
	ReasonStillPending       = "WEBHOOK_DELIVERY_PENDING"
	ReasonPageTokenInvalid   = "PAGE_TOKEN_INVALID"
)

const (
	maxDescription  = 200
	maxIDLength     = 64
	defaultPageSize = 50
	maxPageSize     = 100
)

// API serves kurz.shortener.v1.WebhookService.
type API struct {
	shortenerv1.UnimplementedWebhookServiceServer
	cfg            Config
	store          *Store
	sealer         *Sealer
	targets        Targets
	allowAnonymous bool
	log            *slog.Logger
}

// NewAPI returns the service; allowAnonymous is the shortener's
// KURZ_SHORTENER_ALLOW_ANONYMOUS.
func NewAPI(cfg Config, store *Store, sealer *Sealer, targets Targets, allowAnonymous bool, log *slog.Logger) *API {
	return &API{cfg: cfg, store: store, sealer: sealer, targets: targets, allowAnonymous: allowAnonymous, log: log}
}

var sentinels = []rpcerr.Sentinel{
	{Err: errNotFound, Code: codes.NotFound, Reason: ReasonNotFound, Message: "no such webhook or delivery"},
	{Err: errNotRedelivery, Code: codes.FailedPrecondition, Reason: ReasonStillPending,
		Message: "the delivery is still pending: it is redelivered by itself"},
}

func (a *API) fail(ctx context.Context, op string, err error) error {
	return rpcerr.ToStatus(ctx, a.log.With("op", op), err, sentinels)
}

func (a *API) tenant(ctx context.Context) (string, error) {
	return linkapi.Tenant(ctx, a.allowAnonymous)
}

// CreateWebhook validates and stores a subscription with a fresh secret.
func (a *API) CreateWebhook(ctx context.Context, req *shortenerv1.CreateWebhookRequest) (*shortenerv1.CreateWebhookResponse, error) {
	tenant, err := a.tenant(ctx)
	if err != nil {
		return nil, err
	}
	u, err := a.targets.Check(req.GetUrl())
	if err != nil {
		return nil, rpcerr.BadRequest("url", ReasonURLInvalid, err.Error())
	}
	events, err := normalizeEvents(req.GetEvents())
	if err != nil {
		return nil, err
	}
	desc := req.GetDescription()
	if !utf8.ValidString(desc) || strings.ContainsFunc(desc, unicode.IsControl) {
		// PostgreSQL cannot store a NUL: refused here, not an INTERNAL.
		return nil, rpcerr.BadRequest("description", ReasonDescriptionInvalid,
			"description must be UTF-8 text without control characters")
	}
	if utf8.RuneCountInString(desc) > maxDescription {
		return nil, rpcerr.BadRequest("description", ReasonDescriptionTooLong,
			"description must be at most 200 characters")
	}
	sub := Subscription{ID: "wh_" + strings.ToLower(rand.Text()), Tenant: tenant, URL: u, Events: events, Description: desc}
	if sub.RequestKey, err = linkapi.IdempotencyKey(ctx, tenant); err != nil {
		return nil, err
	}
	if sub.RequestKey != nil {
		if sub.RequestHash, err = linkapi.RequestHash(req); err != nil {
			return nil, err
		}
	}
	secret := newSecret()
	made, created, err := a.store.Create(ctx, sub, a.sealer.Seal(sub.ID, secret), a.cfg.MaxSubscriptions)
	if err == nil && !created {
		// A repeat of a create with an idempotency key: the subscription it
		// made, without its secret. The key is the tenant's and lives as
		// long as the subscription, so answering the secret again would
		// show it to any of the tenant's keys that sends the key, for as
		// long as the subscription lives: it is shown once, as a list
		// never shows it. A caller that lost the first answer deletes the
		// subscription it now knows and creates another.
		if !bytes.Equal(made.RequestHash, sub.RequestHash) {
			return nil, linkapi.IdempotencyKeyReused("a webhook subscription", map[string]string{"id": made.ID})
		}
		return &shortenerv1.CreateWebhookResponse{Webhook: toProto(made)}, nil
	}
	sub = made
	if err == errTooMany {
		return nil, rpcerr.WithDetails(codes.FailedPrecondition,
			"this tenant has the most webhooks it may have; delete one first",
			rpcerr.Info(ReasonTooMany, map[string]string{"limit": strconv.Itoa(a.cfg.MaxSubscriptions)}))
	}
	if err != nil {
		return nil, a.fail(ctx, "create webhook", err)
	}
	a.log.InfoContext(ctx, "webhook created", "id", sub.ID, "tenant", tenant, "events", events)
	return &shortenerv1.CreateWebhookResponse{Webhook: toProto(sub), Secret: secret, Created: true}, nil
}

// normalizeEvents checks the wanted events; none means all of them.
func normalizeEvents(in []string) ([]string, error) {
	if len(in) == 0 {
		return slices.Clone(Events), nil
	}
	var out []string
	for _, e := range in {
		if !slices.Contains(Events, e) {
			if len(e) > 64 {
				e = e[:64]
			}
			return nil, rpcerr.BadRequest("events", ReasonEventUnknown,
				"events: "+strconv.Quote(e)+" is not an event; want "+strings.Join(Events, ", "))
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, nil
}

func toProto(s Subscription) *shortenerv1.Webhook {
	return &shortenerv1.Webhook{Id: s.ID, Url: s.URL, Events: s.Events, Description: s.Description,
		CreateTime: timestamppb.New(s.Created)}
}

// ListWebhooks returns the caller's subscriptions.
func (a *API) ListWebhooks(ctx context.Context, _ *shortenerv1.ListWebhooksRequest) (*shortenerv1.ListWebhooksResponse, error) {
	tenant, err := a.tenant(ctx)
	if err != nil {
		return nil, err
	}
	subs, err := a.store.List(ctx, tenant)
	if err != nil {
		return nil, a.fail(ctx, "list webhooks", err)
	}
	resp := &shortenerv1.ListWebhooksResponse{Webhooks: []*shortenerv1.Webhook{}}
	for _, s := range subs {
		resp.Webhooks = append(resp.Webhooks, toProto(s))
	}
	return resp, nil
}

// checkID refuses an id no subscription or delivery can have.
func checkID(field, id string) error {
	if id == "" || len(id) > maxIDLength || strings.IndexFunc(id, notIDRune) >= 0 {
		return rpcerr.BadRequest(field, ReasonNotFound, field+" is required: an ID this API returned (letters, digits and _, at most 64 characters)")
	}
	return nil
}

// notIDRune reports a character no subscription or delivery ID holds
// ("wh_" or "evt_" and lower-case letters and digits): an ID with one is
// refused before it reaches PostgreSQL, which would refuse a NUL with an
// error of its own.
func notIDRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
}

// DeleteWebhook removes one of the caller's subscriptions.
func (a *API) DeleteWebhook(ctx context.Context, req *shortenerv1.DeleteWebhookRequest) (*shortenerv1.DeleteWebhookResponse, error) {
	tenant, err := a.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkID("id", req.GetId()); err != nil {
		return nil, err
	}
	if err := a.store.Delete(ctx, tenant, req.GetId()); err != nil {
		return nil, a.fail(ctx, "delete webhook", err)
	}
	a.log.InfoContext(ctx, "webhook deleted", "id", req.GetId(), "tenant", tenant)
	return &shortenerv1.DeleteWebhookResponse{}, nil
}

var statusNames = map[shortenerv1.WebhookDeliveryStatus]string{
	shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_UNSPECIFIED: "",
	shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_PENDING:     statusPending,
	shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_SUCCEEDED:   statusSucceeded,
	shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_DEAD:        statusDead,
}

func statusOf(s string) shortenerv1.WebhookDeliveryStatus {
	for k, v := range statusNames {
		if v == s {
			return k
		}
	}
	return shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_UNSPECIFIED
}

// ListWebhookDeliveries pages through one subscription's deliveries.
func (a *API) ListWebhookDeliveries(ctx context.Context, req *shortenerv1.ListWebhookDeliveriesRequest) (*shortenerv1.ListWebhookDeliveriesResponse, error) {
	tenant, err := a.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkID("webhook_id", req.GetWebhookId()); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = defaultPageSize
	case size < 0 || size > maxPageSize:
		return nil, rpcerr.BadRequest("page_size", "PAGE_SIZE_INVALID", "page_size must be from 1 to 100")
	}
	st, ok := statusNames[req.GetStatus()]
	if !ok {
		return nil, rpcerr.BadRequest("status", "STATUS_INVALID", "status is not a delivery status")
	}
	cur, err := decodeToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	ds, err := a.store.Deliveries(ctx, tenant, req.GetWebhookId(), st, size+1, cur)
	if err != nil {
		return nil, a.fail(ctx, "list deliveries", err)
	}
	resp := &shortenerv1.ListWebhookDeliveriesResponse{Deliveries: []*shortenerv1.WebhookDelivery{}}
	if len(ds) > size {
		ds = ds[:size]
		last := ds[len(ds)-1]
		resp.NextPageToken = encodeToken(cursor{Created: last.Created, ID: last.ID})
	}
	for _, d := range ds {
		resp.Deliveries = append(resp.Deliveries, deliveryProto(d))
	}
	return resp, nil
}

func deliveryProto(d Delivery) *shortenerv1.WebhookDelivery {
	p := &shortenerv1.WebhookDelivery{Id: d.ID, WebhookId: d.SubscriptionID, EventType: d.EventType,
		Status: statusOf(d.Status), Attempts: int32(d.Attempts), LastError: d.LastError,
		LastStatusCode: int32(d.LastStatus), CreateTime: timestamppb.New(d.Created)}
	if d.LastAttempt != nil {
		p.LastAttemptTime = timestamppb.New(*d.LastAttempt)
	}
	if d.Status == statusPending {
		p.NextAttemptTime = timestamppb.New(d.NextAttempt)
	}
	return p
}

// RedeliverWebhookDelivery queues a finished delivery again.
func (a *API) RedeliverWebhookDelivery(ctx context.Context, req *shortenerv1.RedeliverWebhookDeliveryRequest) (*shortenerv1.RedeliverWebhookDeliveryResponse, error) {
	tenant, err := a.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkID("webhook_id", req.GetWebhookId()); err != nil {
		return nil, err
	}
	if err := checkID("id", req.GetId()); err != nil {
		return nil, err
	}
	d, err := a.store.Redeliver(ctx, tenant, req.GetWebhookId(), req.GetId())
	if err != nil {
		return nil, a.fail(ctx, "redeliver", err)
	}
	a.log.InfoContext(ctx, "webhook delivery queued again", "id", d.ID, "webhook", d.SubscriptionID, "tenant", tenant)
	return &shortenerv1.RedeliverWebhookDeliveryResponse{Delivery: deliveryProto(d)}, nil
}

// Page tokens are base64url JSON of the cursor: opaque to clients, and
// whatever they send back is only a position, checked like any input.
func encodeToken(c cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(s string) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	bad := rpcerr.BadRequest("page_token", ReasonPageTokenInvalid, "page_token is not one this API returned")
	if len(s) > 256 {
		return nil, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil || checkID("page_token", c.ID) != nil || c.Created.IsZero() || c.Created.After(time.Now().Add(time.Hour)) {
		return nil, bad
	}
	return &c, nil
}
