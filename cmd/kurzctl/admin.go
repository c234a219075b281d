package main

import (
	"encoding/json"
	"fmt"
	"github.com/spf13/pflag"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"
)

// tenant is a tenant in the admin API.
type tenant struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Plan       string `json:"plan"`
	CreateTime string `json:"createTime"`
	// State is active or suspended; a suspended tenant has SuspendTime
	// and SuspendReason.
	State         string `json:"state"`
	SuspendTime   string `json:"suspendTime"`
	SuspendReason string `json:"suspendReason"`
}

// apiKey is an API key's metadata in the admin API; Key only in the answer
// that issues it.
type apiKey struct {
	ID         string `json:"id"`
	Key        string `json:"key"`
	Tenant     string `json:"tenant"`
	Name       string `json:"name"`
	CreateTime string `json:"createTime"`
	RevokeTime string `json:"revokeTime"`
}

const adminHelpNote = `Needs the gateway's admin token (--admin-token or KURZ_GATEWAY_ADMIN_TOKEN).`

func adminCommands() []*command {
	return []*command{
		{
			name: "tenants create", args: "<id>", minArgs: 1, maxArgs: 1,
			summary: "create a tenant on a plan",
			help: `Creates a tenant: an id of lowercase letters, digits and '-', on one of the
limiter's plans (free, pro), which its API keys' limits follow. ` + adminHelpNote + `

Examples:
  kurzctl tenants create acme --name "Acme Inc." --plan pro
  kurzctl tenants create acme`,
			setup: setupTenantsCreate,
		},
		{
			name: "tenants get", args: "<id>", minArgs: 1, maxArgs: 1,
			summary: "show a tenant",
			help:    "Shows a tenant, its plan and whether it is suspended. " + adminHelpNote + "\n\nExample:\n  kurzctl tenants get acme",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					return c.tenantCall("tenants get", "GET", "/v1/admin/tenants/"+url.PathEscape(args[0]), nil)
				}
			},
		},
		{
			name: "tenants list", summary: "list tenants, by id", maxArgs: 0,
			help: `Lists the tenants in order of their ids, one page at a time (the next page's
token is printed on stderr), or every page with --all; --state and --plan
keep the suspended or active ones, or those on one plan (a page token
continues only a listing with the same --state and --plan). ` + adminHelpNote + `

Examples:
  kurzctl tenants list
  kurzctl tenants list --state suspended --all
  kurzctl tenants list --plan pro -o json`,
			setup: setupTenantsList,
		},
		{
			name: "tenants set-plan", args: "<id> <plan>", minArgs: 2, maxArgs: 2,
			summary: "move a tenant to another plan",
			help: `Moves a tenant to another plan; every limiter applies it within a second.
` + adminHelpNote + `

Example:
  kurzctl tenants set-plan acme pro`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					b, _ := json.Marshal(map[string]string{"plan": args[1]})
					return c.tenantCall("tenants set-plan", "PATCH", "/v1/admin/tenants/"+url.PathEscape(args[0]), b)
				}
			},
		},
		{
			name: "tenants suspend", args: "<id>", minArgs: 1, maxArgs: 1,
			summary: "stop a tenant for abuse (keys, links, webhooks)",
			help: `Suspends a tenant, saying why: from the next request on its API keys are
refused (403 TENANT_SUSPENDED, without the reason), within a few seconds
its links answer 410 on every redirect replica, and its webhook
deliveries are held. Nothing is deleted: tenants resume brings it all
back. The reason is shown to administrators only. Suspending a suspended
tenant keeps its time and takes the new reason. ` + adminHelpNote + `

Example:
  kurzctl tenants suspend acme --reason "phishing links reported, ticket ABUSE-12"`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				reason := fs.String("reason", "", "why the tenant is suspended (required, at most 500 bytes; never shown to it)")
				return func(args []string) error {
					b, _ := json.Marshal(map[string]string{"reason": *reason})
					return c.tenantCall("tenants suspend", "POST", "/v1/admin/tenants/"+url.PathEscape(args[0])+"/suspend", b)
				}
			},
		},
		{
			name: "tenants resume", args: "<id>", minArgs: 1, maxArgs: 1,
			summary: "end a tenant's suspension",
			help: `Resumes a suspended tenant: its keys work again at once, its links redirect
within a few seconds (those disabled before stay disabled), and its held
webhook deliveries are sent. Resuming an active tenant changes nothing.
` + adminHelpNote + `

Example:
  kurzctl tenants resume acme`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					return c.tenantCall("tenants resume", "POST", "/v1/admin/tenants/"+url.PathEscape(args[0])+"/resume", nil)
				}
			},
		},
		{
			name: "keys issue", args: "<tenant>", minArgs: 1, maxArgs: 1,
			summary: "issue an API key (shown once)",
			help: `Issues an API key for a tenant. The key is shown this once: only its SHA-256
is stored. --quiet prints the key alone, for a variable. ` + adminHelpNote + `

Examples:
  kurzctl keys issue acme --name laptop
  export KURZ_API_KEY=$(kurzctl keys issue acme --name ci --quiet)`,
			setup: setupKeysIssue,
		},
		{
			name: "keys list", args: "<tenant>", minArgs: 1, maxArgs: 1,
			summary: "list a tenant's API keys",
			help:    "Lists a tenant's API keys (never the keys themselves), revoked ones too. " + adminHelpNote + "\n\nExample:\n  kurzctl keys list acme",
			setup:   setupKeysList,
		},
		{
			name: "keys revoke", args: "<tenant> <key-id>", minArgs: 2, maxArgs: 2,
			summary: "revoke an API key",
			help: `Revokes an API key: the very next request with it is refused. ` + adminHelpNote + `

Example:
  kurzctl keys revoke acme 3f2a9c1d`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					gw, err := c.gateway("keys revoke", adminAuth)
					if err != nil {
						return err
					}
					path := "/v1/admin/tenants/" + url.PathEscape(args[0]) + "/keys/" + url.PathEscape(args[1])
					if _, err := gw.call(c.ctx, "DELETE", path, nil, nil); err != nil {
						return err
					}
					if c.json() {
						return writeJSONValue(c.stdout, struct{}{})
					}
					_, err = fmt.Fprintf(c.stdout, "revoked key %s of tenant %s\n", args[1], args[0])
					return err
				}
			},
		},
	}
}

func setupTenantsCreate(c *cli, fs *pflag.FlagSet) func([]string) error {
	plan := fs.String("plan", "free", "the limiter's `plan`")
	name := fs.String("name", "", "a display `name`")
	return func(args []string) error {
		b, _ := json.Marshal(map[string]string{"id": args[0], "name": *name, "plan": *plan})
		return c.tenantCall("tenants create", "POST", "/v1/admin/tenants", b)
	}
}

// tenantCall makes an admin call answered with a tenant, and shows it.
func (c *cli) tenantCall(cmd, method, path string, body []byte) error {
	gw, err := c.gateway(cmd, adminAuth)
	if err != nil {
		return err
	}
	raw, err := gw.call(c.ctx, method, path, nil, body)
	if err != nil {
		return err
	}
	if c.json() {
		return writeRaw(c.stdout, raw)
	}
	var t tenant
	if err := json.Unmarshal(raw, &t); err != nil {
		return fmt.Errorf("%s %s: the answer is not a tenant: %w", method, path, err)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\nname\t%s\nplan\t%s\ncreated\t%s\nstate\t%s\n", t.ID, orDash(t.Name), t.Plan, t.CreateTime, t.State)
	if t.State == "suspended" {
		fmt.Fprintf(tw, "suspended\t%s\nreason\t%s\n", t.SuspendTime, t.SuspendReason)
	}
	return tw.Flush()
}

func setupTenantsList(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "tenants list"
	state := fs.String("state", "", "only the tenants in this `state`: active or suspended")
	plan := fs.String("plan", "", "only the tenants on this `plan`")
	all := fs.Bool("all", false, "every page")
	pageSize := fs.Int("page-size", 0, "tenants per page, 1 to 1000 (default: the gateway's; 1000 with --all)")
	pageToken := fs.String("page-token", "", "the page to start at, from the previous page")
	return func([]string) error {
		if *pageSize < 0 || *pageSize > 1000 {
			return usagef(cmd, "--page-size must be from 1 to 1000")
		}
		if *state != "" && *state != "active" && *state != "suspended" {
			return usagef(cmd, "--state must be active or suspended")
		}
		gw, err := c.gateway(cmd, adminAuth)
		if err != nil {
			return err
		}
		q := url.Values{}
		if *state != "" {
			q.Set("state", *state)
		}
		if *plan != "" {
			q.Set("plan", *plan)
		}
		size := *pageSize
		if *all && size == 0 {
			size = 1000
		}
		if size > 0 {
			q.Set("page_size", strconv.Itoa(size))
		}
		raws, token, err := c.listPages(c.ctx, gw, "/v1/admin/tenants", q, "tenants", *pageToken, *all, "use a larger --page-size")
		if err != nil {
			return err
		}
		tenants := make([]tenant, len(raws))
		for i, r := range raws {
			if err := json.Unmarshal(r, &tenants[i]); err != nil {
				return fmt.Errorf("GET /v1/admin/tenants: the answer is not a tenant list: %w", err)
			}
		}
		if c.json() {
			if raws == nil {
				raws = []json.RawMessage{}
			}
			return writeJSONValue(c.stdout, struct {
				Tenants       []json.RawMessage `json:"tenants"`
				NextPageToken string            `json:"nextPageToken"`
			}{raws, token})
		}
		if err := printTenants(c.stdout, tenants); err != nil {
			return err
		}
		if token != "" {
			fmt.Fprintf(c.stderr, "more tenants: --page-token %s (or --all)\n", token)
		}
		return nil
	}
}

// printTenants shows tenants as a table, one per line; a suspension's
// reason is left to tenants get.
func printTenants(w io.Writer, tenants []tenant) error {
	if len(tenants) == 0 {
		_, err := fmt.Fprintln(w, "no tenants")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tPLAN\tSTATE\tCREATED")
	for _, t := range tenants {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, orDash(t.Name), t.Plan, t.State, t.CreateTime)
	}
	return tw.Flush()
}

func setupKeysIssue(c *cli, fs *pflag.FlagSet) func([]string) error {
	name := fs.String("name", "", "a `name` to tell the key by, e.g. laptop or ci")
	quiet := fs.BoolP("quiet", "q", false, "print only the key")
	return func(args []string) error {
		gw, err := c.gateway("keys issue", adminAuth)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(map[string]string{"name": *name})
		path := "/v1/admin/tenants/" + url.PathEscape(args[0]) + "/keys"
		raw, err := gw.call(c.ctx, "POST", path, nil, b)
		if err != nil {
			return err
		}
		var k apiKey
		if err := json.Unmarshal(raw, &k); err != nil {
			return fmt.Errorf("POST %s: the answer is not a key: %w", path, err)
		}
		switch {
		case *quiet:
			_, err = fmt.Fprintln(c.stdout, k.Key)
			return err
		case c.json():
			return writeRaw(c.stdout, raw)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "id\t%s\nkey\t%s\ntenant\t%s\nname\t%s\ncreated\t%s\n", k.ID, k.Key, k.Tenant, orDash(k.Name), k.CreateTime)
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(c.stderr, "The key is shown this once: store it now.")
		return nil
	}
}

func setupKeysList(c *cli, fs *pflag.FlagSet) func([]string) error {
	return func(args []string) error {
		gw, err := c.gateway("keys list", adminAuth)
		if err != nil {
			return err
		}
		path := "/v1/admin/tenants/" + url.PathEscape(args[0]) + "/keys"
		raw, err := gw.call(c.ctx, "GET", path, nil, nil)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		var list struct {
			Keys []apiKey `json:"keys"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("GET %s: the answer is not a key list: %w", path, err)
		}
		return printKeys(c.stdout, list.Keys)
	}
}

func printKeys(w io.Writer, keys []apiKey) error {
	if len(keys) == 0 {
		_, err := fmt.Fprintln(w, "no keys")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tREVOKED")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, orDash(k.Name), k.CreateTime, orDash(k.RevokeTime))
	}
	return tw.Flush()
}
