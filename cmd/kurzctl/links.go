package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/linkimport"
)

func linkCommands() []*command {
	return []*command{
		{
			name: "links create", args: "<long-url>", minArgs: 1, maxArgs: 1,
			summary: "shorten a URL",
			help: `Creates a short link for <long-url> (http or https). With an API key the link
is the tenant's; without one the gateway may accept it as "anonymous".

--from-url derives the code from the URL: creating the same URL again
returns the tenant's link of it, unchanged, and says so on stderr ("exists
already"; the API answers 200 instead of 201) without spending quota.

--expire takes an RFC 3339 time or a duration from now (72h, 30d). A password
(8 to 128 characters) makes visitors enter it before the redirect; prefer
--password-stdin, which keeps it out of the shell's history. --ios, --android
and --desktop send those devices elsewhere than <long-url>. --domain puts the
link on one of the tenant's verified custom domains (kurzctl domains). --rules
reads redirect rules and A/B-test variants from a file (see links set-rules).

Examples:
  kurzctl links create https://example.com/spring-sale --tag spring --tag launch
  kurzctl links create https://example.com/spring-sale --title "Spring sale"
  kurzctl links create https://example.com/q3 --alias q3-report --expire 30d
  kurzctl links create https://example.com/pricing --from-url -q
  kurzctl links create https://example.com/launch --domain go.example.com
  kurzctl links create https://example.com/app --ios https://apps.apple.com/app/id1 \
      --android https://play.google.com/store/apps/details?id=com.example
  printf '%s\n' "$PASSWORD" | kurzctl links create https://example.com/private --password-stdin
  CODE=$(kurzctl links create https://example.com -q)`,
			setup: setupLinksCreate,
		},
		{
			name: "links list", summary: "list the tenant's links, newest first", maxArgs: 0,
			help: `Lists the tenant's links, newest first, one page at a time (the next page's
token is printed on stderr), or every page with --all: at most 10,000 pages
and 1 GiB of answers (links export streams a longer list). A page refused
by the rate limit waits its Retry-After, a minute at most, and is asked
again, 30 times in all at most.

--clicks adds a CLICKS column: each link's clicks since it was made (bots
and floods included; the last 400 days at most), from one POST
/v1/links:clickCounts per 1,000 links, that is one per page, each counted
as one stats request per 100 links against the rate limit (a call refused
by the rate limit waits its Retry-After, a minute at most, and is sent
again, 30 times in all at most). With -o json the counts are in "clickCounts", one entry per link.

Examples:
  kurzctl links list
  kurzctl links list --clicks
  kurzctl links list --tag spring --all
  kurzctl links list --page-size 100 --page-token "$TOKEN"
  kurzctl links list --all -o json`,
			setup: setupLinksList,
		},
		{
			name: "links get", args: "<code>", minArgs: 1, maxArgs: 1,
			summary: "show one link",
			help: `Shows one of the tenant's links.

Examples:
  kurzctl links get 1000abc
  kurzctl links get 1000abc -o json`,
			setup: setupLinksGet,
		},
		{
			name: "links update", args: "<code>", minArgs: 1, maxArgs: 1,
			summary: "change a link (only the fields given)",
			help: `Changes the fields given, and only those. --tag replaces the tags (repeat
it for several); --clear-tags removes them. --title '' removes the title.
--max-visits 0 removes the limit.
A device flag changes that device's destination and keeps the others (an
empty value removes it): kurzctl reads the link, and sends the change only
for the state it read (its etag), reading again if the link changed
meanwhile. --if-match applies the change only while the link still has
the etag given (links get shows it), else nothing changes and kurzctl
exits 1 with "the link changed since you read it".

Examples:
  kurzctl links update 1000abc --long-url https://example.com/new
  kurzctl links update 1000abc --tag spring --tag archived --disable
  kurzctl links update 1000abc --title "Spring sale (ended)"
  kurzctl links update 1000abc --clear-password --clear-expire
  kurzctl links update 1000abc --android ''
  kurzctl links update 1000abc --disable --if-match "$ETAG"`,
			setup: setupLinksUpdate,
		},
		{
			name: "links delete", args: "<code>", minArgs: 1, maxArgs: 1,
			summary: "revoke a link",
			help: `Deletes a link: its short URL stops redirecting at once. --if-match deletes it
only while it still has the etag given (links get shows it).

Examples:
  kurzctl links delete 1000abc
  kurzctl links delete 1000abc --if-match "$ETAG"`,
			setup: setupLinksDelete,
		},
		{
			name: "links remove", args: "<tenant> <code>", minArgs: 2, maxArgs: 2,
			summary: "delete a tenant's link (administrators)",
			help: `Deletes a tenant's link, as its own links delete would, for an operator: the
offending links of a suspended tenant, whose keys are refused, the links
that keep a disputed domain in use (--domain for a custom domain's link), or
a link made without a key (tenant anonymous).
` + adminHelpNote + `

Examples:
  kurzctl links remove acme 1000abc
  kurzctl links remove acme promo --domain go.example.com
  kurzctl links remove anonymous d4XsnQ5`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				domain := fs.String("domain", "", "the link's custom domain (default: the default domain)")
				return func(args []string) error {
					gw, err := c.gateway("links remove", adminAuth)
					if err != nil {
						return err
					}
					path := "/v1/admin/tenants/" + url.PathEscape(args[0]) + "/links/" + url.PathEscape(args[1])
					if *domain != "" {
						path += "?domain=" + url.QueryEscape(*domain)
					}
					if _, err := gw.call(c.ctx, "DELETE", path, nil, nil); err != nil {
						return err
					}
					if c.json() {
						return writeJSONValue(c.stdout, struct{}{})
					}
					_, err = fmt.Fprintf(c.stdout, "removed %s of tenant %s\n", args[1], args[0])
					return err
				}
			},
		},
		{
			name: "links import", args: "<file.csv>", minArgs: 1, maxArgs: 1,
			summary: "create links from a Bitly, YOURLS or kurz CSV export",
			help: `Reads a CSV export of Bitly, YOURLS or kurz (links export; the format is
recognised from its header), and creates its links in batches through the gateway, keeping each
link's old code as its alias where it is free. A row whose code is already
your link to the same URL (an earlier run of the same file) is counted as
imported before, not created again: a file can be sent again after an error.
A batch refused with an answer that says nothing was created (a rate limit,
the gateway's bulk slots busy) waits what the answer says, at most a minute
and 30 times per batch, and is sent again; another refusal stops the import.
Progress goes to stderr, one line per batch and per wait; then a summary and
the rows that failed. It exits 3 when rows failed; when it stops early, -o json
still writes the report of the rows before the stop, with "stopped" saying why. A kurz export's links come back with their expiry, visit limit,
redirect type, device targets, rules, variants and domain; a
password-protected or disabled link fails its row (the export holds no
password). A file holds at most 10,000 rows: split a longer one into files
that each start with its header row (docs/cli.md shows how).

Examples:
  kurzctl links import bitly-export.csv
  kurzctl links import yourls.csv --batch 200 -o json > report.json`,
			setup: setupLinksImport,
		},
		{
			name: "links export", maxArgs: 0,
			summary: "export the tenant's links as CSV",
			help: `Writes the tenant's links as CSV, to stdout or to a file.

Examples:
  kurzctl links export > links.csv
  kurzctl links export --tag spring -f spring.csv`,
			setup: setupLinksExport,
		},
	}
}

// linkFlags are the settings create and update share.
type linkFlags struct {
	tags          []string
	title         string
	expire        string
	maxVisits     int64
	password      string
	passwordStdin bool
	ios, android  string
	desktop       string
	redirect      int
}

func (f *linkFlags) define(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.tags, "tag", nil, "a `tag` (repeat for several): lower-case letters, digits, '-', '_', '.'")
	fs.StringVar(&f.title, "title", "", "what the link is, for people: at most 512 characters, one line")
	fs.StringVar(&f.expire, "expire", "", "expiry: an RFC 3339 `time` or a duration from now (72h, 30d)")
	fs.Int64Var(&f.maxVisits, "max-visits", 0, "answer 410 Gone after `n` visits")
	fs.StringVar(&f.password, "password", "", "ask visitors for this `password` (visible in the shell's history: prefer --password-stdin)")
	fs.BoolVar(&f.passwordStdin, "password-stdin", false, "read the password from the first line of stdin")
	fs.StringVar(&f.ios, "ios", "", "destination for iOS devices (`URL`)")
	fs.StringVar(&f.android, "android", "", "destination for Android devices (`URL`)")
	fs.StringVar(&f.desktop, "desktop", "", "destination for every other device (`URL`)")
	fs.IntVar(&f.redirect, "redirect", 0, "HTTP `status` of the redirect: 301, 302, 307 or 308 (default: the service's)")
}

// readPassword returns the password from --password or stdin.
func (c *cli) readPassword(cmd string, f *linkFlags, set map[string]bool) (string, error) {
	if set["password"] && f.passwordStdin {
		return "", usagef(cmd, "give --password or --password-stdin, not both")
	}
	if !f.passwordStdin {
		return f.password, nil
	}
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the password from stdin: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", usagef(cmd, "--password-stdin: stdin holds no password")
	}
	return line, nil
}

// redirectType maps --redirect to the API's enum.
func redirectType(cmd string, status int) (shortenerv1.RedirectType, error) {
	rt, ok := linkimport.RedirectTypeOf(strconv.Itoa(status))
	if !ok {
		return 0, usagef(cmd, "--redirect %d: want 301, 302, 307 or 308", status)
	}
	return rt, nil
}

// maxSpanDays is the longest span parseSpan takes in days: a
// time.Duration holds about 292 years.
const maxSpanDays = int64(math.MaxInt64 / (24 * time.Hour))

// errSpanTooLong is parseSpan's error for a span a time.Duration cannot
// hold, which would otherwise wrap around into the past.
var errSpanTooLong = fmt.Errorf("a duration holds at most %dd (about 292 years): give an RFC 3339 time for a later one", maxSpanDays)

// parseSpan parses a duration, with "d" for days: 90m, 72h, 7d, 1.5d.
func parseSpan(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		// ParseFloat takes NaN and Inf too, and says ±Inf (ErrRange)
		// for a number beyond a float64.
		days, err := strconv.ParseFloat(n, 64)
		switch {
		case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(days), days < 0:
			return 0, fmt.Errorf("%q is not a duration such as 72h or 7d", s)
		case days > float64(maxSpanDays):
			return 0, fmt.Errorf("%q: %w", s, errSpanTooLong)
		}
		return time.Duration(days * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration such as 72h or 7d", s)
	}
	return d, nil
}

// parseWhen parses an RFC 3339 time, or a duration from now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseSpan(s)
	if errors.Is(err, errSpanTooLong) {
		return time.Time{}, err
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration from now (72h, 30d)", s)
	}
	return now.Add(d), nil
}

func setupLinksCreate(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "links create"
	var f linkFlags
	f.define(fs)
	alias := fs.String("alias", "", "the wanted `code` instead of a generated one")
	random := fs.Bool("random", false, "a random code rather than a block (permuted sequential) one")
	fromURL := fs.Bool("from-url", false, "the code derived from the URL: the same URL again returns its existing link")
	quiet := fs.BoolP("quiet", "q", false, "print only the new code")
	domain := fs.String("domain", "", "one of the tenant's verified custom `domains` (default: the default domain)")
	rulesFile := fs.String("rules", "", "redirect rules and variants from a JSON or YAML `file` (see links set-rules)")
	idemKey := fs.String("idempotency-key", "", "makes the create safe to run again: the same create with this `key` (e.g. a UUID) answers the link it made; another create with it is refused")
	return func(args []string) error {
		set := visited(fs)
		if set["idempotency-key"] {
			if err := callmeta.CheckIdempotencyKey(*idemKey); err != nil {
				return usagef(cmd, "--idempotency-key: %v", err)
			}
		}
		req := &shortenerv1.CreateLinkRequest{LongUrl: args[0], Tags: f.tags, Title: f.title, MaxVisits: f.maxVisits, Domain: *domain}
		if n := btoi(*alias != "") + btoi(*random) + btoi(*fromURL); n > 1 {
			return usagef(cmd, "give one of --alias, --random and --from-url")
		}
		if *rulesFile != "" {
			b, err := c.readRulesFile(cmd, *rulesFile)
			if err != nil {
				return err
			}
			var l shortenerv1.Link
			if err := protojson.Unmarshal(b, &l); err != nil {
				return usagef(cmd, "--rules: %v", err)
			}
			req.Rules, req.Variants = l.GetRules(), l.GetVariants()
		}
		switch {
		case *fromURL:
			req.Mode = shortenerv1.CodeMode_CODE_MODE_FROM_URL
		case *alias != "":
			req.Mode, req.CustomAlias = shortenerv1.CodeMode_CODE_MODE_CUSTOM, *alias
		case *random:
			req.Mode = shortenerv1.CodeMode_CODE_MODE_RANDOM
		}
		if f.maxVisits < 0 {
			return usagef(cmd, "--max-visits must be positive (or 0 for no limit)")
		}
		if f.expire != "" {
			t, err := parseWhen(f.expire, time.Now())
			if err != nil {
				return usagef(cmd, "--expire: %v", err)
			}
			if _, rfc := time.Parse(time.RFC3339, f.expire); rfc != nil && *idemKey != "" {
				// A span is counted from each run: run again, the create
				// would be another request, refused for the key.
				return usagef(cmd, "--expire %s with --idempotency-key: give an RFC 3339 time (2026-01-02T15:04:05Z); a span is counted from each run, so a run again would be another request", f.expire)
			}
			req.ExpireTime = timestamppb.New(t)
		}
		if set["redirect"] {
			rt, err := redirectType(cmd, f.redirect)
			if err != nil {
				return err
			}
			req.RedirectType = rt
		}
		if f.ios != "" || f.android != "" || f.desktop != "" {
			req.DeviceTargets = &shortenerv1.DeviceTargets{IosUrl: f.ios, AndroidUrl: f.android, DesktopUrl: f.desktop}
		}
		pw, err := c.readPassword(cmd, &f, set)
		if err != nil {
			return err
		}
		req.Password = pw
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		gw.idempotencyKey = *idemKey
		if pw != "" {
			// Anonymous links may have one: no API key guards it.
			if err := c.keepOffPlainHTTP(cmd, "link's password"); err != nil {
				return err
			}
		}
		var link shortenerv1.Link
		raw, status, err := gw.callProtoStatus(c.ctx, "POST", "/v1/links", nil, req, &link)
		if err != nil {
			return err
		}
		if status == http.StatusOK && !c.json() {
			// The key's link, the alias's, or CODE_MODE_FROM_URL's of the URL.
			fmt.Fprintf(c.stderr, "the link of %s exists already: nothing was created or changed\n", link.GetLongUrl())
		}
		switch {
		case *quiet:
			_, err = fmt.Fprintln(c.stdout, link.GetCode())
			return err
		case c.json():
			return writeRaw(c.stdout, raw)
		}
		return printLink(c.stdout, &link)
	}
}

func setupLinksList(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "links list"
	tag := fs.String("tag", "", "only links with this `tag`")
	all := fs.Bool("all", false, "every page")
	pageSize := fs.Int("page-size", 0, "links per page, 1 to 1000 (default: the service's; 1000 with --all)")
	pageToken := fs.String("page-token", "", "the page to start at, from the previous page")
	clicks := fs.Bool("clicks", false, "add each link's clicks since it was made (one more call per page)")
	return func([]string) error {
		if *pageSize < 0 || *pageSize > 1000 {
			return usagef(cmd, "--page-size must be from 1 to 1000")
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		q := url.Values{}
		if *tag != "" {
			q.Set("tag", *tag)
		}
		size := *pageSize
		if *all && size == 0 {
			size = 1000
		}
		if size > 0 {
			q.Set("page_size", strconv.Itoa(size))
		}
		raws, token, err := c.listPages(c.ctx, gw, "/v1/links", q, "links", *pageToken, *all,
			"use links export for a list this long, or a larger --page-size")
		if err != nil {
			return err
		}
		links := make([]*shortenerv1.Link, len(raws))
		for i, r := range raws {
			links[i] = &shortenerv1.Link{}
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(r, links[i]); err != nil {
				return fmt.Errorf("GET /v1/links: the answer is not a link list: %w", err)
			}
		}
		var counts []*analyticsv1.LinkClickCounts
		if *clicks {
			if counts, err = c.linkClicks(c.ctx, gw, links); err != nil {
				return err
			}
		}
		if c.json() {
			if raws == nil {
				raws = []json.RawMessage{}
			}
			if !*clicks {
				return writeJSONValue(c.stdout, struct {
					Links         []json.RawMessage `json:"links"`
					NextPageToken string            `json:"nextPageToken"`
				}{raws, token})
			}
			rawCounts := make([]json.RawMessage, len(counts))
			for i, lc := range counts {
				if rawCounts[i], err = (protojson.MarshalOptions{EmitDefaultValues: true}).Marshal(lc); err != nil {
					return fmt.Errorf("encode JSON: %w", err)
				}
			}
			return writeJSONValue(c.stdout, struct {
				Links         []json.RawMessage `json:"links"`
				ClickCounts   []json.RawMessage `json:"clickCounts"`
				NextPageToken string            `json:"nextPageToken"`
			}{raws, rawCounts, token})
		}
		var byLink map[string]*analyticsv1.ClickCounts
		if *clicks {
			byLink = make(map[string]*analyticsv1.ClickCounts, len(counts))
			for _, lc := range counts {
				byLink[linkdomain.Key(lc.GetDomain(), lc.GetCode())] = lc.GetCounts()
			}
		}
		if err := printLinks(c.stdout, links, *tag, byLink); err != nil {
			return err
		}
		if token != "" {
			fmt.Fprintf(c.stderr, "more links: --page-token %s (or --all)\n", token)
		}
		return nil
	}
}

// maxClickCountsLinks is the most links one POST /v1/links:clickCounts
// names: the largest page of GET /v1/links.
const maxClickCountsLinks = 1000

// lifetimeRange is the longest range analytics counts (400 days), less an
// hour for its rounding: a link's clicks are those of its life up to it.
const lifetimeRange = 400*24*time.Hour - time.Hour

// linkClicks returns the click counts of links, in their order, from one
// POST /v1/links:clickCounts per maxClickCountsLinks links, each over the
// range from its oldest link's creation (codes are never reused, so a
// younger link has no clicks before its own) up to now, the last 400 days
// at most. A call the rate limit refuses waits its Retry-After and is
// sent again (waitOut's bounds): it reads, so sent twice it does no harm,
// and charged once per 100 links, a few pages of 1,000 spend a free key's
// burst of 20, where stopping would throw away the pages already read.
// The waits are counted over all the calls, as list --all counts its
// pages' waits, so that a long list's total wait is bounded too.
func (c *cli) linkClicks(ctx context.Context, gw *gateway, links []*shortenerv1.Link) ([]*analyticsv1.LinkClickCounts, error) {
	out := make([]*analyticsv1.LinkClickCounts, 0, len(links))
	waits := 0
	for chunk := range slices.Chunk(links, maxClickCountsLinks) {
		now := time.Now()
		start := now.Add(-time.Hour) // a link stamped ahead of this clock
		req := &analyticsv1.GetLinksClickCountsRequest{EndTime: timestamppb.New(now)}
		for _, l := range chunk {
			req.Links = append(req.Links, &analyticsv1.LinkRef{Code: l.GetCode(), Domain: l.GetDomain()})
			if t := l.GetCreateTime().AsTime(); t.Before(start) {
				start = t
			}
		}
		if oldest := now.Add(-lifetimeRange); start.Before(oldest) {
			start = oldest
		}
		req.StartTime = timestamppb.New(start)
		var resp analyticsv1.GetLinksClickCountsResponse
		for {
			_, err := gw.callProto(ctx, "POST", "/v1/links:clickCounts", nil, req, &resp)
			if err == nil {
				break
			}
			if again, werr := c.waitOut(ctx, err, waits, rateLimited); werr != nil {
				return nil, werr
			} else if !again {
				return nil, err
			}
			waits++
		}
		out = append(out, resp.GetLinks()...)
	}
	return out, nil
}

// domainFlag defines --domain, the custom domain a command's <code> is on.
func domainFlag(fs *pflag.FlagSet) *string {
	return fs.String("domain", "", "the custom `domain` the link is on (default: the default domain)")
}

// domainQuery is the ?domain= of a link route; nil for the default domain.
// maxReadModifyWrite bounds the reads of a change made to the state
// read (links update's device flags) when the link keeps changing.
const maxReadModifyWrite = 3

// reasonETagMismatch is the reason of a change refused because the link
// changed since the etag given.
const reasonETagMismatch = "ETAG_MISMATCH"

// etagMismatch reports a change refused because the link changed since
// the etag it was sent for.
func etagMismatch(err error) bool {
	var ae *apiError
	if !errors.As(err, &ae) {
		return false
	}
	reason, _ := ae.info()
	return reason == reasonETagMismatch
}

// ifMatchFlag defines --if-match on a command that changes one link.
func ifMatchFlag(fs *pflag.FlagSet) *string {
	return fs.String("if-match", "", "change the link only while it has this `etag` (links get shows it)")
}

// quoteETag makes an etag as links get shows it (bare) the quoted entity
// tag If-Match takes; a quoted one is left as it is.
func quoteETag(etag string) string {
	if etag == "" || strings.HasPrefix(etag, `"`) || strings.HasPrefix(etag, `W/"`) {
		return etag
	}
	return `"` + etag + `"`
}

func domainQuery(domain string) url.Values {
	if domain == "" {
		return nil
	}
	return url.Values{"domain": {domain}}
}

func setupLinksGet(c *cli, fs *pflag.FlagSet) func([]string) error {
	domain := domainFlag(fs)
	return func(args []string) error {
		gw, err := c.gateway("links get", apiKeyAuth)
		if err != nil {
			return err
		}
		var link shortenerv1.Link
		raw, err := gw.callProto(c.ctx, "GET", "/v1/links/"+url.PathEscape(args[0]), domainQuery(*domain), nil, &link)
		if err != nil {
			return err
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		return printLink(c.stdout, &link)
	}
}

func setupLinksUpdate(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "links update"
	var f linkFlags
	f.define(fs)
	// Not --url: that is the gateway's address.
	longURL := fs.String("long-url", "", "the new long `URL`")
	clearTags := fs.Bool("clear-tags", false, "remove every tag")
	clearPassword := fs.Bool("clear-password", false, "remove the password")
	disable := fs.Bool("disable", false, "stop redirecting (the code and statistics stay)")
	enable := fs.Bool("enable", false, "redirect again")
	clearExpire := fs.Bool("clear-expire", false, "never expire")
	domain := domainFlag(fs)
	ifMatch := ifMatchFlag(fs)
	return func(args []string) error {
		set := visited(fs)
		body := map[string]any{}
		conflict := func(a, b string) error {
			if set[a] && set[b] {
				return usagef(cmd, "give --%s or --%s, not both", a, b)
			}
			return nil
		}
		for _, p := range [][2]string{{"tag", "clear-tags"}, {"password", "clear-password"}, {"password-stdin", "clear-password"},
			{"disable", "enable"}, {"expire", "clear-expire"}} {
			if err := conflict(p[0], p[1]); err != nil {
				return err
			}
		}
		if set["long-url"] {
			body["longUrl"] = *longURL
		}
		switch {
		case set["tag"]:
			body["tags"] = f.tags
		case *clearTags:
			body["tags"] = []string{}
		}
		if set["title"] {
			body["title"] = f.title
		}
		if set["max-visits"] {
			if f.maxVisits < 0 {
				return usagef(cmd, "--max-visits must be positive (or 0 for no limit)")
			}
			body["maxVisits"] = strconv.FormatInt(f.maxVisits, 10)
		}
		switch {
		case set["password"] || f.passwordStdin:
			pw, err := c.readPassword(cmd, &f, set)
			if err != nil {
				return err
			}
			if pw == "" {
				return usagef(cmd, "--password is empty: use --clear-password to remove the password")
			}
			body["password"] = pw
		case *clearPassword:
			body["password"] = ""
		}
		switch {
		case *disable:
			body["disabled"] = true
		case *enable:
			body["disabled"] = false
		}
		switch {
		case set["expire"]:
			t, err := parseWhen(f.expire, time.Now())
			if err != nil {
				return usagef(cmd, "--expire: %v", err)
			}
			body["expireTime"] = t.UTC().Format(time.RFC3339Nano)
		case *clearExpire:
			body["expireTime"] = nil
		}
		if set["redirect"] {
			rt, err := redirectType(cmd, f.redirect)
			if err != nil {
				return err
			}
			body["redirectType"] = rt.String()
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		if pw, _ := body["password"].(string); pw != "" {
			if err := c.keepOffPlainHTTP(cmd, "link's password"); err != nil {
				return err
			}
		}
		if len(body) == 0 && !set["ios"] && !set["android"] && !set["desktop"] {
			return usagef(cmd, "nothing to change: give one or more of --long-url, --tag, --clear-tags, --title, --max-visits, --password, --clear-password, --disable, --enable, --expire, --clear-expire, --redirect, --ios, --android, --desktop")
		}
		if *domain != "" {
			body["domain"] = *domain // names the link
		}
		gw.ifMatch = quoteETag(*ifMatch)
		path := "/v1/links/" + url.PathEscape(args[0])
		var raw []byte
		for attempt := 1; ; attempt++ {
			if set["ios"] || set["android"] || set["desktop"] {
				// The API replaces the device targets whole: keep the ones
				// the command line does not name, as they are in the state
				// read, and change only that state.
				var cur shortenerv1.Link
				if _, err := gw.callProto(c.ctx, "GET", path, domainQuery(*domain), nil, &cur); err != nil {
					return err
				}
				t := cur.GetDeviceTargets()
				targets := map[string]string{"iosUrl": t.GetIosUrl(), "androidUrl": t.GetAndroidUrl(), "desktopUrl": t.GetDesktopUrl()}
				for flagName, field := range map[string]string{"ios": "iosUrl", "android": "androidUrl", "desktop": "desktopUrl"} {
					if set[flagName] {
						targets[field] = fs.Lookup(flagName).Value.String()
					}
				}
				body["deviceTargets"] = targets
				body["etag"] = cur.GetEtag()
			}
			b, err := json.Marshal(body)
			if err != nil {
				return fmt.Errorf("encode request: %w", err)
			}
			raw, err = gw.call(c.ctx, "PATCH", path, nil, b)
			if body["etag"] != nil && *ifMatch == "" && attempt < maxReadModifyWrite && etagMismatch(err) {
				continue // the link changed between the read and the change: read it again
			}
			if err != nil {
				return err
			}
			break
		}
		if c.json() {
			return writeRaw(c.stdout, raw)
		}
		var link shortenerv1.Link
		if err := unmarshalProto(raw, &link); err != nil {
			return fmt.Errorf("PATCH %s: %w", path, err)
		}
		return printLink(c.stdout, &link)
	}
}

func setupLinksDelete(c *cli, fs *pflag.FlagSet) func([]string) error {
	domain := domainFlag(fs)
	ifMatch := ifMatchFlag(fs)
	return func(args []string) error {
		gw, err := c.gateway("links delete", apiKeyAuth)
		if err != nil {
			return err
		}
		gw.ifMatch = quoteETag(*ifMatch)
		if _, err := gw.call(c.ctx, "DELETE", "/v1/links/"+url.PathEscape(args[0]), domainQuery(*domain), nil); err != nil {
			return err
		}
		if c.json() {
			return writeJSONValue(c.stdout, struct{}{})
		}
		_, err = fmt.Fprintf(c.stdout, "deleted %s\n", args[0])
		return err
	}
}

func setupLinksExport(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "links export"
	tag := fs.String("tag", "", "only links with this `tag`")
	file := fs.StringP("file", "f", "", "write to this `file` instead of stdout")
	maxSize := fs.Int64("max-size", defaultMaxExport, "stop with an error once the export is larger than this many `bytes` (0: no bound)")
	return func([]string) error {
		if *maxSize < 0 {
			return usagef(cmd, "--max-size must not be negative")
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		q := url.Values{}
		if *tag != "" {
			q.Set("tag", *tag)
		}
		stream, err := gw.sendStream(c.ctx, "GET", "/v1/links:export", q)
		if err != nil {
			return err
		}
		defer stream.Close()
		body := io.Reader(stream)
		if *maxSize > 0 {
			body = &boundedReader{r: stream, left: *maxSize}
		}
		if *file == "" {
			if _, err := io.Copy(c.stdout, body); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			return nil
		}
		// A temporary file renamed at the end: an interrupted export leaves
		// no half-written file behind.
		tmp, err := os.CreateTemp(filepath.Dir(*file), "."+filepath.Base(*file)+".*")
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		n, err := io.Copy(tmp, body)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), *file)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("export to %s: %w", *file, err)
		}
		if !c.json() {
			fmt.Fprintf(c.stderr, "wrote %d bytes to %s\n", n, *file)
		}
		return nil
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// printLink shows one link as a two-column table.
func printLink(w io.Writer, l *shortenerv1.Link) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("code", l.GetCode())
	if l.GetDomain() != "" {
		row("domain", l.GetDomain())
	}
	row("short url", l.GetShortUrl())
	row("long url", l.GetLongUrl())
	row("title", orDash(l.GetTitle()))
	if t := l.GetDeviceTargets(); t != nil {
		for _, d := range []struct{ name, url string }{{"ios url", t.GetIosUrl()}, {"android url", t.GetAndroidUrl()}, {"desktop url", t.GetDesktopUrl()}} {
			if d.url != "" {
				row(d.name, d.url)
			}
		}
	}
	if n := len(l.GetRules()); n > 0 {
		var names []string
		for _, r := range l.GetRules() {
			names = append(names, r.GetName())
		}
		row("rules", strings.Join(names, ", ")+" (links rules "+l.GetCode()+")")
	}
	if len(l.GetVariants()) > 0 {
		var vs []string
		for _, v := range l.GetVariants() {
			vs = append(vs, fmt.Sprintf("%s %d", v.GetName(), v.GetWeight()))
		}
		row("variants", strings.Join(vs, ", "))
	}
	row("tags", orDash(strings.Join(l.GetTags(), ", ")))
	row("redirect", redirectName(l.GetRedirectType()))
	row("created", formatTime(l.GetCreateTime()))
	expires := "never"
	if l.GetExpireTime() != nil {
		expires = formatTime(l.GetExpireTime())
	}
	row("expires", expires)
	maxVisits := "no limit"
	if l.GetMaxVisits() > 0 {
		maxVisits = strconv.FormatInt(l.GetMaxVisits(), 10)
	}
	row("max visits", maxVisits)
	row("password", yesNo(l.GetPasswordProtected()))
	row("disabled", yesNo(l.GetDisabled()))
	row("etag", l.GetEtag())
	return tw.Flush()
}

// printLinks shows links as a table, one per line.
// printLinks writes links as a table; with clicks (by linkdomain.Key) a
// CLICKS column too, "-" for a link the counts do not name.
func printLinks(w io.Writer, links []*shortenerv1.Link, tag string, clicks map[string]*analyticsv1.ClickCounts) error {
	if len(links) == 0 {
		if tag != "" {
			_, err := fmt.Fprintf(w, "no links tagged %q\n", tag)
			return err
		}
		_, err := fmt.Fprintln(w, "no links")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if clicks == nil {
		fmt.Fprintln(tw, "CODE\tSHORT URL\tLONG URL\tTITLE\tTAGS\tCREATED")
	} else {
		fmt.Fprintln(tw, "CODE\tSHORT URL\tLONG URL\tTITLE\tTAGS\tCLICKS\tCREATED")
	}
	for _, l := range links {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t", l.GetCode(), l.GetShortUrl(), truncate(l.GetLongUrl(), 50),
			orDash(truncate(l.GetTitle(), 30)), orDash(strings.Join(l.GetTags(), ",")))
		if clicks != nil {
			n := "-"
			if c, ok := clicks[linkdomain.Key(l.GetDomain(), l.GetCode())]; ok {
				n = strconv.FormatInt(c.GetTotal(), 10)
			}
			fmt.Fprintf(tw, "%s\t", n)
		}
		fmt.Fprintf(tw, "%s\n", formatTime(l.GetCreateTime()))
	}
	return tw.Flush()
}

func redirectName(rt shortenerv1.RedirectType) string {
	if s := linkimport.RedirectTypeCell(rt); s != "" {
		return s
	}
	return "default"
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// truncate shortens s to n runes, marking the cut with "…".
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// defaultMaxExport bounds an export unless --max-size says otherwise: far
// above any tenant's links (a million links of a few hundred bytes each),
// far below filling a disk for a gateway that never stops sending.
const defaultMaxExport = 4 << 30

// errTooLarge is boundedReader's error once its bound is passed.
var errTooLarge = errors.New("the export is larger than --max-size; stopped (raise it, or 0 for no bound)")

// boundedReader reads r until left bytes have passed, then fails.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the bound from a longer one.
		var one [1]byte
		if n, err := b.r.Read(one[:]); n > 0 {
			return 0, errTooLarge
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}
