package httpapi

import (
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// maxWebhookID bounds the ids in webhook paths before a service sees them.
const maxWebhookID = 64

// pathWebhookID returns the path value name (a subscription's or a
// delivery's id), refusing an empty or oversized one.
func pathWebhookID(c *call, name string) (string, error) {
	id := c.r.PathValue(name)
	if id == "" || len(id) > maxWebhookID || strings.Contains(id, "/") {
		return "", badParameter(name, "the "+name+" in the path must be 1 to 64 characters, without '/'")
	}
	return id, nil
}

// webhookLocation is the Location of a created subscription: the tenant's
// list of them, where it shows. No route serves one subscription alone
// (only DELETE /v1/webhooks/{id}), so its own URL would answer a GET 405.
func webhookLocation(proto.Message) string { return "/v1/webhooks" }

// webhookExisted reports a create sent again with its idempotency key: the
// subscription it made, 200.
func webhookExisted(resp proto.Message) bool {
	return !resp.(*shortenerv1.CreateWebhookResponse).GetCreated()
}

// checkDeliveriesPage refuses a page_size out of 1 to 100 and a status
// that names no WebhookDeliveryStatus, with the message the client needs;
// empty ones too, as checkPageSize does.
func checkDeliveriesPage(_ *call, _ []byte, q url.Values) error {
	if q.Has("page_size") {
		if n, err := strconv.Atoi(q.Get("page_size")); err != nil || n < 1 || n > 100 {
			return badRequest("page_size must be a whole number from 1 to 100")
		}
	}
	if q.Has("status") {
		if _, ok := shortenerv1.WebhookDeliveryStatus_value[q.Get("status")]; !ok {
			return badRequest("status must be WEBHOOK_DELIVERY_STATUS_PENDING, _SUCCEEDED or _DEAD")
		}
	}
	return nil
}
