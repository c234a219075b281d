package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"

	"github.com/spf13/pflag"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

func domainCommands() []*command {
	return []*command{
		{
			name: "domains add", args: "<domain>", minArgs: 1, maxArgs: 1,
			summary: "register a custom domain for short links",
			help: `Registers a custom domain (e.g. go.example.com) to the tenant, unverified,
and prints the DNS TXT record that proves it is yours. Publish the record,
then run kurzctl domains verify; or ask an administrator to approve it.
Point the domain's A/AAAA (or CNAME) records at the redirect service.

Example:
  kurzctl domains add go.example.com`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					b, _ := json.Marshal(map[string]string{"name": args[0]})
					return c.domainCall("domains add", "POST", "/v1/domains", b)
				}
			},
		},
		{
			name: "domains list", summary: "list the tenant's custom domains", maxArgs: 0,
			help: "Lists the tenant's custom domains and whether each is verified.\n\nExamples:\n  kurzctl domains list\n  kurzctl domains list -o json",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func([]string) error {
					gw, err := c.gateway("domains list", apiKeyAuth)
					if err != nil {
						return err
					}
					var resp shortenerv1.ListDomainsResponse
					raw, err := gw.callProto(c.ctx, "GET", "/v1/domains", nil, nil, &resp)
					if err != nil {
						return err
					}
					if c.json() {
						return writeRaw(c.stdout, raw)
					}
					return printDomains(c.stdout, resp.GetDomains())
				}
			},
		},
		{
			name: "domains get", args: "<domain>", minArgs: 1, maxArgs: 1,
			summary: "show a custom domain and its TXT record",
			help:    "Shows one of the tenant's custom domains.\n\nExample:\n  kurzctl domains get go.example.com",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					return c.domainCall("domains get", "GET", "/v1/domains/"+url.PathEscape(args[0]), nil)
				}
			},
		},
		{
			name: "domains verify", args: "<domain>", minArgs: 1, maxArgs: 1,
			summary: "verify a custom domain by its DNS TXT record",
			help: `Asks kurz to look up the domain's TXT record (_kurz-challenge.<domain>):
once it holds the token kurzctl domains add printed, the domain is verified
and takes links (kurzctl links create --domain).

Example:
  kurzctl domains verify go.example.com`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					return c.domainCall("domains verify", "POST", "/v1/domains/"+url.PathEscape(args[0])+"/verify", nil)
				}
			},
		},
		{
			name: "domains delete", args: "<domain>", minArgs: 1, maxArgs: 1,
			summary: "remove a custom domain (once no link uses it)",
			help:    "Removes one of the tenant's custom domains; refused while live links are on it.\n\nExample:\n  kurzctl domains delete go.example.com",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					gw, err := c.gateway("domains delete", apiKeyAuth)
					if err != nil {
						return err
					}
					if _, err := gw.call(c.ctx, "DELETE", "/v1/domains/"+url.PathEscape(args[0]), nil, nil); err != nil {
						return err
					}
					if c.json() {
						return writeJSONValue(c.stdout, struct{}{})
					}
					_, err = fmt.Fprintf(c.stdout, "deleted %s\n", args[0])
					return err
				}
			},
		},
		{
			name: "domains approve", args: "<tenant> <domain>", minArgs: 2, maxArgs: 2,
			summary: "verify a tenant's custom domain without DNS (administrators)",
			help: `Verifies a tenant's registered domain at once, without its TXT record: an
operator's decision. ` + adminHelpNote + `

Example:
  kurzctl domains approve acme go.example.com`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					gw, err := c.gateway("domains approve", adminAuth)
					if err != nil {
						return err
					}
					return c.showDomain(gw, "POST",
						"/v1/admin/tenants/"+url.PathEscape(args[0])+"/domains/"+url.PathEscape(args[1])+"/verify", nil)
				}
			},
		},
		{
			name: "domains release", args: "<tenant> <domain>", minArgs: 2, maxArgs: 2,
			summary: "remove a tenant's custom domain (administrators)",
			help: `Removes a tenant's custom domain, as its own domains delete would (a domain
dispute, a customer gone whose domain another now owns): the redirect stops
serving it within moments, and another tenant may then add and verify it.
Refused while live links of the tenant are on it. ` + adminHelpNote + `

Example:
  kurzctl domains release acme go.example.com`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					gw, err := c.gateway("domains release", adminAuth)
					if err != nil {
						return err
					}
					path := "/v1/admin/tenants/" + url.PathEscape(args[0]) + "/domains/" + url.PathEscape(args[1])
					if _, err := gw.call(c.ctx, "DELETE", path, nil, nil); err != nil {
						return err
					}
					if c.json() {
						return writeJSONValue(c.stdout, struct{}{})
					}
					_, err = fmt.Fprintf(c.stdout, "released %s of tenant %s\n", args[1], args[0])
					return err
				}
			},
		},
	}
}

// domainCall makes a tenant's call answered with a domain, and shows it.
func (c *cli) domainCall(cmd, method, path string, body []byte) error {
	gw, err := c.gateway(cmd, apiKeyAuth)
	if err != nil {
		return err
	}
	return c.showDomain(gw, method, path, body)
}

// showDomain makes a call on gw answered with a domain, and shows it.
func (c *cli) showDomain(gw *gateway, method, path string, body []byte) error {
	raw, err := gw.call(c.ctx, method, path, nil, body)
	if err != nil {
		return err
	}
	var d shortenerv1.Domain
	if err := unmarshalProto(raw, &d); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if c.json() {
		return writeRaw(c.stdout, raw)
	}
	return printDomain(c.stdout, &d)
}

// printDomain shows one domain, with what to publish while unverified.
func printDomain(w io.Writer, d *shortenerv1.Domain) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("domain", d.GetName())
	if d.GetVerified() {
		row("verified", formatTime(d.GetVerifyTime())+" ("+d.GetVerifiedBy()+")")
	} else {
		row("verified", "no")
		row("TXT record", d.GetVerificationRecord())
		row("TXT value", d.GetVerificationToken())
	}
	row("created", formatTime(d.GetCreateTime()))
	return tw.Flush()
}

// printDomains shows domains as a table, one per line.
func printDomains(w io.Writer, ds []*shortenerv1.Domain) error {
	if len(ds) == 0 {
		_, err := fmt.Fprintln(w, "no domains")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tVERIFIED\tCREATED")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", d.GetName(), yesNo(d.GetVerified()), formatTime(d.GetCreateTime()))
	}
	return tw.Flush()
}
