package httpapi

import (
	"net/http"
	"strconv"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// maxWebhookID bounds the ids in webhook paths before a service sees them.
const maxWebhookID = 64

// pathID returns the path value name, refusing an empty or oversized one.
func pathID(c *call, name string) (string, error) {
	id := c.r.PathValue(name)
	if id == "" || len(id) > maxWebhookID {
		return "", badRequest("the " + name + " in the path must be 1 to 64 characters")
	}
	return id, nil
}

// createWebhook subscribes a URL; the answer carries the secret, once.
func (a *API) createWebhook(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var req shortenerv1.CreateWebhookRequest
	if err := decodeProto(b, &req); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.webhooks.CreateWebhook(ctx, &req)
	if err != nil {
		return err
	}
	c.w.Header().Set("Cache-Control", "no-store")
	return writeProto(c.w, http.StatusCreated, resp)
}

func (a *API) listWebhooks(c *call) error {
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.webhooks.ListWebhooks(ctx, &shortenerv1.ListWebhooksRequest{})
	if err != nil {
		return err
	}
	if resp.Webhooks == nil {
		resp.Webhooks = []*shortenerv1.Webhook{}
	}
	return writeProto(c.w, http.StatusOK, resp)
}

func (a *API) deleteWebhook(c *call) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	if _, err := a.webhooks.DeleteWebhook(ctx, &shortenerv1.DeleteWebhookRequest{Id: id}); err != nil {
		return err
	}
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) listWebhookDeliveries(c *call) error {
	id, err := pathID(c, "webhookId")
	if err != nil {
		return err
	}
	q := c.r.URL.Query()
	req := &shortenerv1.ListWebhookDeliveriesRequest{WebhookId: id, PageToken: q.Get("page_token")}
	if s := q.Get("page_size"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			return badRequest("page_size must be a whole number from 1 to 100")
		}
		req.PageSize = int32(n)
	}
	if s := q.Get("status"); s != "" {
		v, ok := shortenerv1.WebhookDeliveryStatus_value[s]
		if !ok {
			return badRequest("status must be WEBHOOK_DELIVERY_STATUS_PENDING, _SUCCEEDED or _DEAD")
		}
		req.Status = shortenerv1.WebhookDeliveryStatus(v)
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.webhooks.ListWebhookDeliveries(ctx, req)
	if err != nil {
		return err
	}
	if resp.Deliveries == nil {
		resp.Deliveries = []*shortenerv1.WebhookDelivery{}
	}
	return writeProto(c.w, http.StatusOK, resp)
}

func (a *API) redeliverWebhookDelivery(c *call) error {
	webhookID, err := pathID(c, "webhookId")
	if err != nil {
		return err
	}
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.webhooks.RedeliverWebhookDelivery(ctx, &shortenerv1.RedeliverWebhookDeliveryRequest{WebhookId: webhookID, Id: id})
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, resp.GetDelivery())
}
