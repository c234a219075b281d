package main

import (
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

func webhookCommands() []*command {
	return []*command{
		{
			name: "webhooks create", args: "<url>", minArgs: 1, maxArgs: 1,
			summary: "subscribe a URL to link events",
			help: `Subscribes <url> (https) to the tenant's link events: link.created,
link.updated, link.deleted and link.clicked (a link's clicks counted per
interval); all of them unless --event names some. Each
event is POSTed as JSON, signed in the Kurz-Signature header with the
secret this command prints: the only time it is shown. docs/webhooks.md
says how to verify it.

Examples:
  kurzctl webhooks create https://hooks.example.com/kurz
  kurzctl webhooks create https://hooks.example.com/kurz --event link.created --description "CRM sync"
  SECRET=$(kurzctl webhooks create https://hooks.example.com/kurz -o json | jq -r .secret)`,
			setup: setupWebhooksCreate,
		},
		{
			name: "webhooks list", maxArgs: 0,
			summary: "list the tenant's webhook subscriptions",
			help: `Lists the tenant's webhook subscriptions (never their secrets).

Examples:
  kurzctl webhooks list
  kurzctl webhooks list -o json`,
			setup: setupWebhooksList,
		},
		{
			name: "webhooks delete", args: "<id>", minArgs: 1, maxArgs: 1,
			summary: "delete a webhook subscription and its deliveries",
			help: `Deletes a subscription: no more events are sent to it, and its queued and
past deliveries go with it.

Example:
  kurzctl webhooks delete wh_abc`,
			setup: setupWebhooksDelete,
		},
		{
			name: "webhooks deliveries", args: "<id>", minArgs: 1, maxArgs: 1,
			summary: "list a subscription's deliveries, newest first",
			help: `Lists the deliveries of subscription <id>, newest first: status, attempts,
the last error. --status keeps one status: pending, succeeded or dead.

Examples:
  kurzctl webhooks deliveries wh_abc
  kurzctl webhooks deliveries wh_abc --status dead -o json`,
			setup: setupWebhooksDeliveries,
		},
		{
			name: "webhooks redeliver", args: "<id> <delivery-id>", minArgs: 2, maxArgs: 2,
			summary: "send a dead (or delivered) delivery again",
			help: `Queues a delivery of subscription <id> again, with the same event id (the
receiver's idempotency key) and a fresh count of attempts.

Example:
  kurzctl webhooks redeliver wh_abc evt_0123456789abcdef`,
			setup: setupWebhooksRedeliver,
		},
	}
}

func setupWebhooksCreate(c *cli, fs *pflag.FlagSet) func([]string) error {
	var events []string
	fs.StringArrayVar(&events, "event", nil, "send only this `event` (repeat for several): link.created, link.updated, link.deleted, link.clicked")
	desc := fs.String("description", "", "a note for people, at most 200 characters")
	return func(args []string) error {
		gw, err := c.gateway("webhooks create", apiKeyAuth)
		if err != nil {
			return err
		}
		var resp shortenerv1.CreateWebhookResponse
		raw, err := gw.callProto(c.ctx, "POST", "/v1/webhooks", nil,
			&shortenerv1.CreateWebhookRequest{Url: args[0], Events: events, Description: *desc}, &resp)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		w := resp.GetWebhook()
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		for _, r := range [][2]string{{"id", w.GetId()}, {"url", w.GetUrl()}, {"events", strings.Join(w.GetEvents(), ", ")},
			{"description", orDash(w.GetDescription())}, {"secret", resp.GetSecret()}} {
			fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(c.stderr, "the secret is shown only now: keep it to verify the Kurz-Signature header")
		return nil
	}
}

func setupWebhooksList(c *cli, fs *pflag.FlagSet) func([]string) error {
	return func([]string) error {
		gw, err := c.gateway("webhooks list", apiKeyAuth)
		if err != nil {
			return err
		}
		var resp shortenerv1.ListWebhooksResponse
		raw, err := gw.callProto(c.ctx, "GET", "/v1/webhooks", nil, nil, &resp)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tURL\tEVENTS\tCREATED\tDESCRIPTION")
		for _, w := range resp.GetWebhooks() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", w.GetId(), truncate(w.GetUrl(), 60), strings.Join(w.GetEvents(), ","),
				formatTime(w.GetCreateTime()), orDash(truncate(w.GetDescription(), 40)))
		}
		return tw.Flush()
	}
}

func setupWebhooksDelete(c *cli, fs *pflag.FlagSet) func([]string) error {
	return func(args []string) error {
		gw, err := c.gateway("webhooks delete", apiKeyAuth)
		if err != nil {
			return err
		}
		if _, err := gw.call(c.ctx, "DELETE", "/v1/webhooks/"+url.PathEscape(args[0]), nil, nil); err != nil {
			return err
		}
		if c.json() {
			return writeJSONValue(c.stdout, struct{}{})
		}
		_, err = fmt.Fprintf(c.stdout, "deleted %s\n", args[0])
		return err
	}
}

// deliveryStatuses maps --status to the API's enum.
var deliveryStatuses = map[string]string{
	"pending": "WEBHOOK_DELIVERY_STATUS_PENDING", "succeeded": "WEBHOOK_DELIVERY_STATUS_SUCCEEDED", "dead": "WEBHOOK_DELIVERY_STATUS_DEAD",
}

func setupWebhooksDeliveries(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "webhooks deliveries"
	status := fs.String("status", "", "only this `status`: pending, succeeded or dead")
	pageSize := fs.Int("page-size", 0, "deliveries per page, 1 to 100 (default 50)")
	pageToken := fs.String("page-token", "", "the page to start at, from the previous page")
	return func(args []string) error {
		q := url.Values{}
		if *status != "" {
			s, ok := deliveryStatuses[*status]
			if !ok {
				return usagef(cmd, "--status must be pending, succeeded or dead")
			}
			q.Set("status", s)
		}
		if *pageSize < 0 || *pageSize > 100 {
			return usagef(cmd, "--page-size must be from 1 to 100")
		}
		if *pageSize > 0 {
			q.Set("page_size", strconv.Itoa(*pageSize))
		}
		if *pageToken != "" {
			q.Set("page_token", *pageToken)
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		var resp shortenerv1.ListWebhookDeliveriesResponse
		raw, err := gw.callProto(c.ctx, "GET", "/v1/webhooks/"+url.PathEscape(args[0])+"/deliveries", q, nil, &resp)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		if err := printDeliveries(c.stdout, resp.GetDeliveries()); err != nil {
			return err
		}
		if t := resp.GetNextPageToken(); t != "" {
			fmt.Fprintf(c.stderr, "more deliveries: --page-token %s\n", t)
		}
		return nil
	}
}

func printDeliveries(w io.Writer, ds []*shortenerv1.WebhookDelivery) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT\tSTATUS\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", d.GetId(), d.GetEventType(), statusWord(d.GetStatus()), d.GetAttempts(),
			formatTime(d.GetCreateTime()), orDash(truncate(d.GetLastError(), 60)))
	}
	return tw.Flush()
}

func statusWord(s shortenerv1.WebhookDeliveryStatus) string {
	for word, name := range deliveryStatuses {
		if name == s.String() {
			return word
		}
	}
	return "-"
}

func setupWebhooksRedeliver(c *cli, fs *pflag.FlagSet) func([]string) error {
	return func(args []string) error {
		gw, err := c.gateway("webhooks redeliver", apiKeyAuth)
		if err != nil {
			return err
		}
		var d shortenerv1.WebhookDelivery
		raw, err := gw.callProto(c.ctx, "POST", "/v1/webhooks/"+url.PathEscape(args[0])+"/deliveries/"+url.PathEscape(args[1])+"/redeliver", nil, nil, &d)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		_, err = fmt.Fprintf(c.stdout, "queued %s again (%s)\n", d.GetId(), statusWord(d.GetStatus()))
		return err
	}
}
